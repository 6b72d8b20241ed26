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
from dataclasses import dataclass
from enum import IntEnum
from typing import Final

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
    body: bytes

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
    """

    def __init__(self, max_frame_bytes: int) -> None:
        self._max = max_frame_bytes
        self._buf = bytearray()

    @property
    def buffered_bytes(self) -> int:
        return len(self._buf)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        self._buf += data
        frames: list[Frame] = []
        buf = self._buf
        pos = 0
        # Slices of a memoryview copy once into bytes; slices of the bytearray would copy
        # twice (a bytearray slice, then bytes of it). The view is released before the
        # buffer is trimmed (a bytearray with a live view cannot be resized).
        with memoryview(buf) as view:
            while True:
                if len(buf) - pos < PREFIX.size:
                    break
                size, magic, version, kind, flags, code, hsize, corr = PREFIX.unpack_from(buf, pos)
                if magic != MAGIC or version != VERSION:
                    raise RemoteProtocolError(f"bad frame magic/version {magic:#x}/{version}")
                if size + 4 > self._max:
                    raise RemoteProtocolError(
                        f"frame of {size + 4} bytes exceeds the limit of {self._max}"
                    )
                if size < _AFTER_SIZE + hsize:
                    raise RemoteProtocolError("frame header size exceeds the frame")
                if kind > FrameKind.SERVER_RESPONSE:
                    raise RemoteProtocolError(f"unknown frame kind {kind}")
                end = pos + 4 + size
                if len(buf) < end:
                    break
                hstart = pos + PREFIX.size
                if flags & FrameFlags.LONG_HEADER:
                    hstart, hsize = _long_header(buf, hstart, hsize, end)
                frames.append(
                    Frame(
                        FrameKind(kind),
                        flags,
                        code,
                        corr,
                        bytes(view[hstart : hstart + hsize]),
                        bytes(view[hstart + hsize : end]),
                    )
                )
                pos = end
        if pos:
            del buf[:pos]
        return frames


def _long_header(buf: bytearray, start: int, hsize: int, end: int) -> tuple[int, int]:
    """(start, size) of a LONG_HEADER frame's header, which begins its body."""
    if hsize != 0:
        raise RemoteProtocolError("a long-header frame must have header_size 0")
    if end - start < 4:
        raise RemoteProtocolError("a long-header frame is too short for its header size")
    (size,) = _U32.unpack_from(buf, start)
    if size > MAX_LONG_HEADER_BYTES:
        raise RemoteProtocolError(f"long header of {size} bytes exceeds {MAX_LONG_HEADER_BYTES}")
    if size > end - start - 4:
        raise RemoteProtocolError("long header size exceeds the frame")
    return start + 4, size
