"""Length-prefixed frames and an incremental decoder: bytes in, frames out, no I/O.

Every message on a tidemq connection is one frame, little-endian::

    0            4      5        6      7      8       10            12
    +------------+------+--------+------+------+-------+-------------+----------------+
    |frame_size  |magic |version |kind  |flags |code   |header_size  |correlation_id  |
    |u32         |0x54  |1       |u8    |u8    |u16    |u16          |u32             |
    +------------+------+--------+------+------+-------+-------------+----------------+
    16: header (msgpack, header_size bytes) | body (raw bytes, the rest)

* ``frame_size`` counts the bytes after itself (12 + header + body). It is checked against
  the decoder's limit before anything is buffered, so a peer announcing 2 GiB gets an
  error, not an allocation.
* ``kind``: request, response, one-way (no response), server request (the server asks a
  client: transaction check-back), server response.
* ``flags``: bit 0 ERROR on a response: the header is an error (code, message) instead of
  the command's response. Bit 1 LONG_HEADER: the header did not fit the u16 size (the
  routes of thousands of queues, a topic's description): ``header_size`` is 0 and the
  body starts with the header's size (u32) and the header, then the real body. A long
  header is bounded by ``MAX_LONG_HEADER_BYTES`` and, like everything, by the frame
  limit.
* ``code``: the request code (`codes.RequestCode`); a response echoes its request's code.
* The body carries batch payloads and commit-log records exactly as stored: the broker
  never re-encodes them.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass
from enum import IntEnum
from typing import Final, NoReturn

import numpy as np

from tidemq.core.errors import TidemqError

__all__ = [
    "MAX_HEADER_BYTES",
    "PREFIX",
    "Frame",
    "FrameDecoder",
    "FrameFlags",
    "FrameKind",
    "LocalProtocolError",
    "RemoteProtocolError",
    "encode_frame",
]

MAGIC: Final = 0x54
VERSION: Final = 1
PREFIX: Final = struct.Struct("<IBBBBHHI")
assert PREFIX.size == 16
_AFTER_SIZE: Final = PREFIX.size - 4
#: Headers are small msgpack structs; u16 bounds them, and the security model asks for
#: a limit well below the frame limit.
MAX_HEADER_BYTES: Final = 0xFFFF
#: Largest header carried in the body (LONG_HEADER); a frame's own limit applies too.
MAX_LONG_HEADER_BYTES: Final = 16 << 20
_U32: Final = struct.Struct("<I")


class FrameKind(IntEnum):
    REQUEST = 0
    RESPONSE = 1
    ONEWAY = 2
    SERVER_REQUEST = 3
    SERVER_RESPONSE = 4


_KINDS: Final = tuple(FrameKind)
#: A read shorter than this is appended to the last buffered chunk while that chunk is
#: shorter than _SMALL_CHUNK, which bounds the per-chunk overhead to a few percent.
_SMALL_READ: Final = 1024
_SMALL_CHUNK: Final = 16 * 1024
#: Buffered reading (`get_buffer` / `buffer_updated`): the size of the shared read buffer,
#: and the frames received straight into a buffer of their own instead: those of at least
#: _DIRECT_MIN bytes, once an eighth of the frame has arrived (so a peer that announces a
#: large frame and stops costs at most eight times what it sent, never the whole limit).
_READ_BUFFER: Final = 64 * 1024
_DIRECT_MIN: Final = 64 * 1024
_DIRECT_SHARE: Final = 8


class FrameFlags:
    ERROR = 1
    LONG_HEADER = 2


class RemoteProtocolError(TidemqError):
    """The peer sent bytes that break the protocol; the connection must be closed."""


class LocalProtocolError(TidemqError):
    """We were asked to send something the protocol cannot carry (our own misuse)."""


@dataclass(frozen=True, slots=True)
class Frame:
    kind: FrameKind
    flags: int
    code: int
    correlation_id: int
    header: bytes
    #: bytes, or (buffered reading, a large frame) a read-only view of the frame's own
    #: buffer: a batch's payload goes from the socket to the commit log with no copy.
    body: bytes | memoryview

    @property
    def is_error(self) -> bool:
        return bool(self.flags & FrameFlags.ERROR)


def encode_frame(
    kind: FrameKind,
    code: int,
    correlation_id: int,
    header: bytes,
    body: bytes | memoryview = b"",
    *,
    flags: int = 0,
) -> list[bytes | memoryview]:
    """The frame as buffers for a vectored write (the body is not copied). A header over
    `MAX_HEADER_BYTES` travels at the start of the body (flag LONG_HEADER, set here only)."""
    flags &= ~FrameFlags.LONG_HEADER
    if len(header) > MAX_HEADER_BYTES:
        if len(header) > MAX_LONG_HEADER_BYTES:
            raise LocalProtocolError(
                f"frame header of {len(header)} bytes exceeds {MAX_LONG_HEADER_BYTES}"
            )
        flags |= FrameFlags.LONG_HEADER
        size = _AFTER_SIZE + 4 + len(header) + len(body)
        if size > 0xFFFFFFFF:
            raise LocalProtocolError("frame larger than 4 GiB")
        prefix = PREFIX.pack(size, MAGIC, VERSION, kind, flags, code, 0, correlation_id)
        return (
            [prefix + _U32.pack(len(header)) + header, body]
            if body
            else [prefix + _U32.pack(len(header)) + header]
        )
    size = _AFTER_SIZE + len(header) + len(body)
    if size > 0xFFFFFFFF:
        raise LocalProtocolError("frame larger than 4 GiB")
    prefix = PREFIX.pack(size, MAGIC, VERSION, kind, flags, code, len(header), correlation_id)
    if body:
        return [prefix + header, body]
    return [prefix + header]


class FrameDecoder:
    """Feed it bytes as they arrive; it returns whole frames.

    Raises RemoteProtocolError on a bad magic, version or kind, a frame over
    `max_frame_bytes`, or a header size that does not fit its frame. After an error the
    connection is unusable.

    The received chunks are kept as they are until a frame is whole, and each header and
    body is then copied once, straight out of them: a 256 KiB batch that arrives in four
    reads is not appended to a growing buffer (a copy and a reallocation per read) and then
    sliced out of it (another copy). The body of a frame that fills a chunk exactly is that
    chunk, not copied at all.

    Two ways in: `feed(data)` (asyncio.Protocol), or `get_buffer()` then
    `buffer_updated(n)` (asyncio.BufferedProtocol). With the second, a large frame is read
    straight into a buffer of its own, and its body is a view of that buffer: no copy at
    all between the socket and the caller.
    """

    def __init__(self, max_frame_bytes: int) -> None:
        self._max = max_frame_bytes
        # Unconsumed input: the chunks in arrival order, the first from offset _start on.
        self._chunks: deque[bytes] = deque()
        self._start = 0
        self._size = 0
        # Nothing is parsed until this many bytes are buffered: a prefix, or the whole
        # frame whose prefix was read (so a large frame is not re-parsed on every read).
        self._need = PREFIX.size
        # Buffered reading: the shared read buffer (made on first use), and the frame being
        # read straight into its own buffer (`_direct`, `_filled` bytes of it so far).
        self._read_view: memoryview | None = None
        self._direct: memoryview | None = None
        self._filled = 0

    @property
    def max_frame_bytes(self) -> int:
        """The largest frame accepted; may be changed between frames (a connection's
        limit before and after it authenticates)."""
        return self._max

    @max_frame_bytes.setter
    def max_frame_bytes(self, value: int) -> None:
        self._max = value

    @property
    def buffered_bytes(self) -> int:
        return self._filled if self._direct is not None else self._size

    def get_buffer(self) -> memoryview:
        """Where the next read goes (BufferedProtocol.get_buffer); then `buffer_updated`."""
        if self._direct is not None:
            return self._direct[self._filled :]
        if self._read_view is None:
            self._read_view = memoryview(bytearray(_READ_BUFFER))
        return self._read_view

    def buffer_updated(self, nbytes: int) -> list[Frame]:
        """`nbytes` were read into the last `get_buffer()`: the frames now whole."""
        if self._direct is not None:
            self._filled += nbytes
            if self._filled < len(self._direct):
                return []
            return [self._direct_frame()]
        assert self._read_view is not None, "buffer_updated before get_buffer"
        frames = self.feed(self._read_view[:nbytes])  # copied out: the buffer is reused
        need = self._need
        if need >= _DIRECT_MIN and self._size * _DIRECT_SHARE >= need:
            self._start_direct(need)
        return frames

    def _start_direct(self, size: int) -> None:
        """Move the partial frame at the head (all that is buffered) into a buffer of its
        own, `size` bytes, which the next reads fill."""
        # numpy.empty: no zero-filling of memory that the reads overwrite anyway.
        direct = np.empty(size, dtype=np.uint8).data.cast("B")
        pos = 0
        start = self._start
        for chunk in self._chunks:
            n = len(chunk) - start
            direct[pos : pos + n] = memoryview(chunk)[start:]
            pos += n
            start = 0
        self._chunks.clear()
        self._start = self._size = 0
        self._need = PREFIX.size
        self._direct, self._filled = direct, pos

    def _direct_frame(self) -> Frame:
        buf = self._direct
        assert buf is not None
        self._direct, self._filled = None, 0
        size, _, _, kind, flags, code, hsize, corr = PREFIX.unpack_from(buf)  # checked in feed
        pos, rest = PREFIX.size, size - _AFTER_SIZE
        if flags & FrameFlags.LONG_HEADER:
            hsize = _long_header_size(bytes(buf[pos : pos + min(4, rest)]), hsize, rest)
            pos += 4
        header = bytes(buf[pos : pos + hsize])
        return Frame(_KINDS[kind], flags, code, corr, header, buf[pos + hsize :].toreadonly())

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        if not data:
            return []
        if not self._size and len(data) >= PREFIX.size:
            whole = self._whole(data)
            if whole is not None:
                return [whole]
        return self._feed(data)

    def _feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        """`feed` of any input: buffer it, return the frames now whole."""
        self._append(data)
        chunks = self._chunks
        frames: list[Frame] = []
        while self._size >= self._need:
            first, start = chunks[0], self._start
            if len(first) - start >= PREFIX.size:
                size, magic, version, kind, flags, code, hsize, corr = PREFIX.unpack_from(
                    first, start
                )
            else:
                size, magic, version, kind, flags, code, hsize, corr = PREFIX.unpack(
                    self._peek(PREFIX.size)
                )
            if magic != MAGIC or version != VERSION or kind > FrameKind.SERVER_RESPONSE:
                _bad_prefix(magic, version, kind)
            if size + 4 > self._max:
                raise RemoteProtocolError(
                    f"frame of {size + 4} bytes exceeds the limit of {self._max}"
                )
            if size < _AFTER_SIZE + hsize:
                raise RemoteProtocolError("frame header size exceeds the frame")
            if self._size < 4 + size:
                self._need = 4 + size
                break
            self._need = PREFIX.size
            end = start + 4 + size
            if end <= len(first) and not flags & FrameFlags.LONG_HEADER:
                # The common case: the whole frame is in the first chunk.
                hend = start + PREFIX.size + hsize
                header, body = first[start + PREFIX.size : hend], first[hend:end]
                self._size -= 4 + size
                if end == len(first):
                    chunks.popleft()
                    self._start = 0
                else:
                    self._start = end
            else:
                header, body = self._take_frame(size, flags, hsize)
            frames.append(Frame(_KINDS[kind], flags, code, corr, header, body))
        return frames

    def _whole(self, data: bytes | bytearray | memoryview) -> Frame | None:
        """The frame `data` is, read straight from it, when nothing is buffered and `data`
        is exactly one valid frame with a short header: the common small request or answer
        of one read (one copy of its header and body, no chunk kept). None for anything
        else, which the general way parses (and refuses, when it must)."""
        size, magic, version, kind, flags, code, hsize, corr = PREFIX.unpack_from(data)
        if (
            size + 4 != len(data)
            or size + 4 > self._max
            or size < _AFTER_SIZE + hsize
            or flags & FrameFlags.LONG_HEADER
            or magic != MAGIC
            or version != VERSION
            or kind > FrameKind.SERVER_RESPONSE
        ):
            return None
        hend = PREFIX.size + hsize
        return Frame(
            _KINDS[kind], flags, code, corr, bytes(data[PREFIX.size : hend]), bytes(data[hend:])
        )

    def _append(self, data: bytes | bytearray | memoryview) -> None:
        chunks = self._chunks
        if len(data) < _SMALL_READ and chunks and len(chunks[-1]) < _SMALL_CHUNK:
            # A peer that trickles bytes must not cost an object per read (a 64 MiB frame
            # sent a byte at a time would take gigabytes): small reads join the last chunk.
            chunks[-1] += data
        else:
            # The caller may reuse a bytearray or a view's memory: keep bytes of our own.
            chunks.append(data if isinstance(data, bytes) else bytes(data))
        self._size += len(data)

    def _take_frame(self, size: int, flags: int, hsize: int) -> tuple[bytes, bytes]:
        """Remove the next frame (whole, its prefix read) and return its header and body."""
        self._skip(PREFIX.size)
        rest = size - _AFTER_SIZE
        if flags & FrameFlags.LONG_HEADER:
            hsize = _long_header_size(self._take(min(4, rest)), hsize, rest)
            rest -= 4
        header = self._take(hsize)
        return header, self._take(rest - hsize)

    def _peek(self, n: int) -> bytes:
        """The next `n` buffered bytes (n <= buffered), left in place."""
        parts: list[bytes | memoryview] = []
        start, got = self._start, 0
        for chunk in self._chunks:
            piece = memoryview(chunk)[start : start + n - got]
            parts.append(piece)
            got += len(piece)
            start = 0
            if got == n:
                break
        return b"".join(parts)

    def _skip(self, n: int) -> None:
        chunks = self._chunks
        self._size -= n
        n += self._start
        while n and n >= len(chunks[0]):
            n -= len(chunks.popleft())
        self._start = n

    def _take(self, n: int) -> bytes:
        """Remove and return the next `n` buffered bytes (n <= buffered), copied once."""
        if n == 0:
            return b""
        chunks, start = self._chunks, self._start
        first = chunks[0]
        self._size -= n
        if len(first) - start >= n:
            end = start + n
            if end == len(first):
                chunks.popleft()
                self._start = 0
                return first if start == 0 else first[start:]
            self._start = end
            return first[start:end]
        parts: list[bytes | memoryview] = [memoryview(first)[start:]]
        n -= len(first) - start
        chunks.popleft()
        while n and n >= len(chunks[0]):
            chunk = chunks.popleft()
            parts.append(chunk)
            n -= len(chunk)
        if n:
            parts.append(memoryview(chunks[0])[:n])
        self._start = n
        return b"".join(parts)


def _bad_prefix(magic: int, version: int, kind: int) -> NoReturn:
    if magic != MAGIC or version != VERSION:
        raise RemoteProtocolError(f"bad frame magic/version {magic:#x}/{version}")
    raise RemoteProtocolError(f"unknown frame kind {kind}")


def _long_header_size(size_field: bytes, hsize: int, rest: int) -> int:
    """The header size a LONG_HEADER frame gives at the start of its body (`size_field`);
    `rest` is the frame's length after the prefix."""
    if hsize != 0:
        raise RemoteProtocolError("a long-header frame must have header_size 0")
    if len(size_field) < 4:
        raise RemoteProtocolError("a long-header frame is too short for its header size")
    size: int = _U32.unpack(size_field)[0]
    if size > MAX_LONG_HEADER_BYTES:
        raise RemoteProtocolError(f"long header of {size} bytes exceeds {MAX_LONG_HEADER_BYTES}")
    if size > rest - 4:
        raise RemoteProtocolError("long header size exceeds the frame")
    return size
