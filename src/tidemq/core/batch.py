"""The batch payload: N messages of one (topic, queue), stored column by column.

One batch is the unit of storage, indexing and transfer. The producer encodes it, the
broker stores it as one commit-log record (checking only the envelope and its CRC), and
the consumer decodes it. Columns use Apache Arrow's variable-binary layout so that a
reader can build Arrow arrays from slices without a Python loop per message.

Envelope, little-endian, 40 bytes, never compressed::

    0      1        2      3      4            8        12          16           24            32
    +------+--------+------+------+------------+--------+-----------+------------+-------------+-------------+
    |magic |version |codec |flags |crc32c      |count   |body_size  |tag_summary |base_ts_ms   |max_ts_ms    |
    |u8    |u8      |u8    |u8    |u32         |u32     |u32        |u64         |i64          |i64          |
    +------+--------+------+------+------------+--------+-----------+------------+-------------+-------------+

* ``crc32c`` covers every byte of the payload but itself: bytes 0-3, then 8 to the end.
* ``codec``: 0 none, 1 zstd, 2 lz4 (frame). The body that follows is compressed as one
  block; ``body_size`` is its size before compression (bounded, checked before inflating).
* ``tag_summary``: a 64-bit Bloom word, bit ``crc32c(tag) % 64`` set for each tag present,
  copied into the queue index so tag subscriptions skip batches that cannot match.
* ``base_ts_ms`` is the smallest message timestamp, ``max_ts_ms`` the largest.

Body (after decompression); every section starts on an 8-byte boundary (zero padding)::

    validity_flags u32 | reserved u32          bit i set: column i carries a validity bitmap
    ts_delta       i32 x count                 timestamp - base_ts_ms
    key            [bitmap] offsets u32 x (count+1), data      binary, nullable   (column 0)
    value          [bitmap] offsets u32 x (count+1), data      binary, nullable   (column 1)
                                                               a null value is a tombstone
    tag            [bitmap] offsets u32 x (count+1), data      utf-8, nullable    (column 2)
    keys           list offsets u32 x (count+1),               list<utf-8>
                   item offsets u32 x (items+1), data
    headers        list offsets u32 x (count+1),               list<struct<key: utf-8,
                   key offsets u32 x (n+1), key data,                      value: binary>>
                   value offsets u32 x (n+1), value data

Bitmaps are Arrow's: one bit per message, least significant bit first, 1 = present.
Every section is preceded by the padding that aligns it, even an empty one, so a body
whose last section is empty ends with padding.

What decoding guarantees (with or without the CRC check): every offsets array starts at
zero, never decreases and ends exactly at the size of its data section; every section
lies inside the body, and nothing follows the last one; each timestamp delta lies in
``0 .. max_ts_ms - base_ts_ms``; a compressed body never inflates past ``body_size``.
So Arrow arrays built from the sections cannot read out of bounds. String columns are
not checked for valid UTF-8 until they are turned into ``str``.
"""

from __future__ import annotations

import operator
import struct
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import IntEnum
from functools import partial
from itertools import chain, repeat
from typing import Final, NamedTuple

import crc32c
import numpy as np
import numpy.typing as npt

from tidemq.core import limits
from tidemq.core.errors import BatchTooLarge, InvalidBatch

__all__ = [
    "ENVELOPE",
    "BatchColumns",
    "BinaryColumn",
    "Codec",
    "Envelope",
    "ListColumn",
    "MessageRecord",
    "decode_columns",
    "decode_messages",
    "encode_batch",
    "encode_values",
    "parse_envelope",
    "tag_bit",
    "tag_summary_for",
]

MAGIC: Final = 0xB7
VERSION: Final = 1

ENVELOPE: Final = struct.Struct("<BBBBIIIQqq")
assert ENVELOPE.size == 40
_CRC_START: Final = 8
_FLAGS: Final = struct.Struct("<II")
_U32: Final = struct.Struct("<I")

_COL_KEY, _COL_VALUE, _COL_TAG = 0, 1, 2
_U32_MAX: Final = (1 << 32) - 1
_I32_MAX: Final = (1 << 31) - 1
_I64_MIN: Final = -(1 << 63)
_I64_MAX: Final = (1 << 63) - 1
_PAD: Final = tuple(bytes(i) for i in range(8))


class Codec(IntEnum):
    NONE = 0
    ZSTD = 1
    LZ4 = 2


@dataclass(frozen=True, slots=True)
class Envelope:
    codec: Codec
    crc: int
    count: int
    body_size: int
    tag_summary: int
    base_timestamp_ms: int
    max_timestamp_ms: int


class MessageRecord(NamedTuple):
    """One message as a producer gives it and a consumer gets it back.

    A named tuple rather than a dataclass: decoding builds one per message, and a tuple is
    built in C (a frozen dataclass's ``__init__`` costs several times more). It compares,
    hashes and unpacks as a tuple. ``value`` None is a tombstone. ``timestamp_ms`` is
    milliseconds since the epoch; one batch spans at most 2**31 - 1 ms (~24.8 days).
    """

    value: bytes | None
    key: bytes | None = None
    tag: str | None = None
    keys: tuple[str, ...] = ()
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int = 0


# tuple.__new__(MessageRecord, fields) is what MessageRecord._make does, minus its Python
# frame: mapping it over zip() builds every record without running Python code.
_new_record: Final[Callable[[Iterable[object]], MessageRecord]] = partial(
    tuple.__new__, MessageRecord
)


@dataclass(frozen=True, slots=True)
class BinaryColumn:
    """Arrow variable-binary layout: offsets (count+1), concatenated data, optional validity.

    ``offsets`` are validated (from zero, non-decreasing, last == len(data)); entry i is
    ``data[offsets[i]:offsets[i+1]]``. A null entry's bytes are meaningless (normally empty).
    """

    offsets: npt.NDArray[np.uint32]
    data: memoryview
    validity: npt.NDArray[np.bool_] | None  # None: every entry present
    validity_bitmap: memoryview | None  # the packed bitmap as stored (Arrow's layout)


@dataclass(frozen=True, slots=True)
class ListColumn:
    """Arrow list layout: per-message offsets into a child column (or two for headers)."""

    list_offsets: npt.NDArray[np.uint32]
    items: BinaryColumn
    values: BinaryColumn | None = None  # headers only: the value of each (key, value) entry


@dataclass(frozen=True, slots=True)
class BatchColumns:
    count: int
    timestamps_ms: npt.NDArray[np.int64]
    key: BinaryColumn
    value: BinaryColumn
    tag: BinaryColumn
    keys: ListColumn
    headers: ListColumn


def tag_bit(tag: str) -> int:
    """The tag-summary bit of one tag."""
    return 1 << (crc32c.crc32c(tag.encode()) & 63)


def tag_summary_for(tags: Iterable[str | None]) -> int:
    """The tag-summary word of a batch holding these tags (None: no tag)."""
    summary = 0
    for tag in set(tags):
        if tag is not None:
            summary |= tag_bit(tag)
    return summary


# --------------------------------------------------------------------------- encoding
#
# Each column is built as a list of sections (bitmap, offsets, data); `_assemble` lays them
# out with the padding the format requires. Columns with no nulls, no entries or no
# tags/keys/headers at all take shortcuts: an all-null or all-empty column is only zeros.


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:
        raise InvalidBatch(f"{what} {text[:40]!r} is not encodable as UTF-8") from None


def _offsets(items: Sequence[bytes], total: int, what: str) -> bytes:
    """Offsets of concatenated items whose sizes add up to `total`."""
    if total > limits.MAX_BATCH_BYTES:
        # Also keeps every offset far below 2**31, as Arrow's int32 offsets need.
        raise BatchTooLarge(f"{what} data of {total} bytes exceeds the batch format limit")
    # array.extend(map(len)) then one numpy cumsum is ~2x faster than array(accumulate()).
    lengths = array("I", (0,))
    lengths.extend(map(len, items))
    return np.frombuffer(lengths, dtype=np.uint32).cumsum(dtype="<u4").tobytes()


def _binary_sections(items: Sequence[bytes], what: str) -> list[bytes]:
    data = b"".join(items)
    if not data:
        return [bytes(4 * (len(items) + 1)), b""]
    return [_offsets(items, len(data), what), data]


def _nullable_sections(items: Sequence[bytes | None], what: str) -> tuple[bool, list[bytes]]:
    """(has a bitmap, sections) of a nullable binary column."""
    n = len(items)
    nulls = items.count(None)
    if not nulls:
        return False, _binary_sections(items, what)  # type: ignore[arg-type]
    if nulls == n:
        return True, [bytes((n + 7) // 8), bytes(4 * (n + 1)), b""]
    present = np.frombuffer(bytes(map(operator.is_not, items, repeat(None))), dtype=np.uint8)
    bitmap = np.packbits(present, bitorder="little").tobytes()
    filled = [b"" if v is None else v for v in items]
    return True, [bitmap, *_binary_sections(filled, what)]


def _list_offsets(lists: Sequence[Sequence[object]], limit: int, what: str) -> bytes:
    lengths = array("I", (0,))
    lengths.extend(map(len, lists))
    if max(lengths) > limit:
        first = next(i for i, items in enumerate(lists) if len(items) > limit)
        raise InvalidBatch(f"message {first} has {len(lists[first])} {what}, more than {limit}")
    return np.frombuffer(lengths, dtype=np.uint32).cumsum(dtype="<u4").tobytes()


def _keys_sections(keys_lists: Sequence[Sequence[str]]) -> list[bytes]:
    n = len(keys_lists)
    if not any(keys_lists):
        return [bytes(4 * (n + 1)), _PAD[4], b""]
    list_offs = _list_offsets(keys_lists, limits.MAX_KEYS_PER_MESSAGE, "keys")
    items = [_utf8(k, "key") for k in chain.from_iterable(keys_lists)]
    return [list_offs, *_binary_sections(items, "keys")]


def _header_sections(headers: Sequence[Sequence[tuple[str, bytes]]]) -> list[bytes]:
    n = len(headers)
    if not any(headers):
        return [bytes(4 * (n + 1)), _PAD[4], b"", _PAD[4], b""]
    list_offs = _list_offsets(headers, limits.MAX_HEADERS_PER_MESSAGE, "headers")
    names, values = zip(*chain.from_iterable(headers), strict=True)
    # Header names repeat from message to message: encode and check each distinct one once.
    encoded = {name: _utf8(name, "header key") for name in set(names)}
    for name, raw in encoded.items():
        if len(raw) > limits.MAX_HEADER_KEY_BYTES:
            raise InvalidBatch(
                f"header key {name[:40]!r} is {len(raw)} bytes, over {limits.MAX_HEADER_KEY_BYTES}"
            )
    if max(map(len, values)) > limits.MAX_HEADER_VALUE_BYTES:
        name, value = next(
            (k, v) for k, v in zip(names, values) if len(v) > limits.MAX_HEADER_VALUE_BYTES
        )
        raise InvalidBatch(
            f"header {name[:40]!r} value is {len(value)} bytes, "
            f"over {limits.MAX_HEADER_VALUE_BYTES}"
        )
    return [
        list_offs,
        *_binary_sections(list(map(encoded.__getitem__, names)), "header keys"),
        *_binary_sections(values, "header values"),
    ]


def _tag_sections(tags: Sequence[str | None]) -> tuple[bool, list[bytes], int]:
    """(has a bitmap, sections, tag summary) of the tag column."""
    n = len(tags)
    if tags.count(None) == n:
        return True, [bytes((n + 7) // 8), bytes(4 * (n + 1)), b""], 0
    # Tags are few and repeated: encode, check and hash each distinct one once.
    encoded: dict[str | None, bytes | None] = {None: None}
    summary = 0
    for tag in set(tags):
        if tag is not None:
            raw = _utf8(tag, "tag")
            if len(raw) > limits.MAX_TAG_BYTES:
                raise InvalidBatch(
                    f"tag {tag[:40]!r} is {len(raw)} bytes, over {limits.MAX_TAG_BYTES}"
                )
            encoded[tag] = raw
            summary |= 1 << (crc32c.crc32c(raw) & 63)
    has_bitmap, sections = _nullable_sections(list(map(encoded.__getitem__, tags)), "tag")
    return has_bitmap, sections, summary


def _check_timestamps(base_ts: int, max_ts: int) -> None:
    if base_ts < _I64_MIN or max_ts > _I64_MAX:
        raise InvalidBatch(f"message timestamps {base_ts}..{max_ts} do not fit in 64 bits")
    if max_ts - base_ts > _I32_MAX:
        raise InvalidBatch(
            f"message timestamps in one batch span {max_ts - base_ts} ms, "
            f"more than {_I32_MAX} (~24.8 days)"
        )


def _check_count(count: int) -> None:
    if not 1 <= count <= limits.MAX_BATCH_MESSAGES:
        raise InvalidBatch(
            f"a batch holds 1 to {limits.MAX_BATCH_MESSAGES} messages, got {count}"
        )


def _assemble(
    *,
    count: int,
    flags: int,
    sections: list[bytes],
    codec: Codec,
    max_batch_bytes: int,
    tag_summary: int,
    base_ts: int,
    max_ts: int,
) -> bytes:
    """Lay out body sections (each after the padding that aligns it), compress, seal."""
    parts = [_FLAGS.pack(flags, 0)]
    size = 8
    for section in sections:
        pad = -size % 8
        if pad:
            parts.append(_PAD[pad])
        parts.append(section)
        size += pad + len(section)
    body = b"".join(parts)
    if size > limits.MAX_BATCH_BYTES:
        # Checked on the uncompressed body too: a decoder refuses a larger body_size even
        # when it compresses well below max_batch_bytes.
        raise BatchTooLarge(
            f"batch body of {size} bytes exceeds the format limit of {limits.MAX_BATCH_BYTES}"
        )
    stored = _compress(codec, body)
    total = ENVELOPE.size + len(stored)
    if total > max_batch_bytes:
        raise BatchTooLarge(f"batch of {total} bytes exceeds the limit of {max_batch_bytes}")
    head = ENVELOPE.pack(
        MAGIC, VERSION, codec, 0, 0, count, size, tag_summary, base_ts, max_ts
    )
    crc = crc32c.crc32c(stored, crc32c.crc32c(head[_CRC_START:], crc32c.crc32c(head[:4])))
    return b"".join((head[:4], _U32.pack(crc), head[_CRC_START:], stored))


def encode_batch(
    messages: Sequence[MessageRecord],
    *,
    codec: Codec = Codec.NONE,
    max_batch_bytes: int = limits.MAX_BATCH_BYTES,
) -> bytes:
    """Encode messages into one batch payload; `decode_messages` gives them back equal.

    Raises InvalidBatch naming the message or field that breaks a limit (1 to
    MAX_BATCH_MESSAGES messages, timestamps within 64 bits and a span of 2**31 - 1 ms,
    tag/keys/headers sizes and counts of `tidemq.core.limits`, strings encodable as UTF-8),
    and BatchTooLarge when the payload exceeds `max_batch_bytes` or its body the format
    limit. Wrongly typed fields raise TypeError or AttributeError.
    """
    count = len(messages)
    _check_count(count)
    # MessageRecord is a tuple: zip(*) transposes the batch into columns in C.
    values, keys, tags, keys_lists, headers, timestamps = zip(*messages, strict=True)
    base_ts, max_ts = min(timestamps), max(timestamps)
    _check_timestamps(base_ts, max_ts)
    if base_ts == max_ts:
        deltas = bytes(4 * count)
    else:
        deltas = (np.array(timestamps, dtype=np.int64) - base_ts).astype("<i4").tobytes()

    key_bitmap, key_sections = _nullable_sections(keys, "key")
    value_bitmap, value_sections = _nullable_sections(values, "value")
    tag_bitmap, tag_sections, summary = _tag_sections(tags)
    flags = key_bitmap << _COL_KEY | value_bitmap << _COL_VALUE | tag_bitmap << _COL_TAG
    return _assemble(
        count=count,
        flags=flags,
        sections=[
            deltas,
            *key_sections,
            *value_sections,
            *tag_sections,
            *_keys_sections(keys_lists),
            *_header_sections(headers),
        ],
        codec=codec,
        max_batch_bytes=max_batch_bytes,
        tag_summary=summary,
        base_ts=base_ts,
        max_ts=max_ts,
    )


def encode_values(
    values: Sequence[bytes],
    *,
    timestamp_ms: int,
    keys: Sequence[bytes | None] | None = None,
    headers: Mapping[str, bytes] | None = None,
    codec: Codec = Codec.NONE,
) -> bytes:
    """Fast path for the common case: values with one timestamp, optional keys (one per
    value, None for no key) and the same headers on every message, no tags.

    The payload is byte for byte what `encode_batch` makes of the equivalent records, and
    the errors are the same; a None value (tombstone) is accepted and takes that path.
    """
    count = len(values)
    if keys is not None and len(keys) != count:
        raise InvalidBatch(f"{len(keys)} keys given for {count} values")
    hdr = tuple(headers.items()) if headers else ()
    if None in values:
        key_list: Iterable[bytes | None] = repeat(None) if keys is None else keys
        return encode_batch(
            [MessageRecord(v, k, None, (), hdr, timestamp_ms) for v, k in zip(values, key_list)],
            codec=codec,
        )
    _check_count(count)
    _check_timestamps(timestamp_ms, timestamp_ms)
    if keys is None:
        key_bitmap, key_sections = True, [bytes((count + 7) // 8), bytes(4 * (count + 1)), b""]
    else:
        key_bitmap, key_sections = _nullable_sections(keys, "key")
    if hdr:
        header_sections = _repeated_header_sections(hdr, count)
    else:
        header_sections = [bytes(4 * (count + 1)), _PAD[4], b"", _PAD[4], b""]
    zero_offsets = bytes(4 * (count + 1))
    return _assemble(
        count=count,
        flags=key_bitmap << _COL_KEY | 1 << _COL_TAG,
        sections=[
            bytes(4 * count),  # every timestamp delta is zero
            *key_sections,
            *_binary_sections(values, "value"),
            bytes((count + 7) // 8),  # no tags: an all-null tag column
            zero_offsets,
            b"",
            zero_offsets,  # no keys lists
            _PAD[4],
            b"",
            *header_sections,
        ],
        codec=codec,
        max_batch_bytes=limits.MAX_BATCH_BYTES,
        tag_summary=0,
        base_ts=timestamp_ms,
        max_ts=timestamp_ms,
    )


def _repeated_header_sections(hdr: tuple[tuple[str, bytes], ...], count: int) -> list[bytes]:
    """Sections of a header column where every message carries the same `hdr`."""
    # Build it from one message's column, checked (and errors worded) as encode_batch does.
    one = _header_sections([hdr])
    per = len(hdr)
    list_offsets = np.arange(0, per * (count + 1), per, dtype="<u4").tobytes()
    key_lengths = np.diff(np.frombuffer(one[1], dtype="<u4"))
    value_lengths = np.diff(np.frombuffer(one[3], dtype="<u4"))
    out = [list_offsets]
    for lengths, data, what in ((key_lengths, one[2], "header keys"),
                                (value_lengths, one[4], "header values")):
        total = len(data) * count
        if total > limits.MAX_BATCH_BYTES:
            raise BatchTooLarge(f"{what} data of {total} bytes exceeds the batch format limit")
        offs = np.zeros(per * count + 1, dtype="<u4")
        np.cumsum(np.tile(lengths, count), out=offs[1:])
        out += [offs.tobytes(), data * count]
    return out


def _compress(codec: Codec, body: bytes) -> bytes:
    if codec is Codec.NONE:
        return body
    if codec is Codec.ZSTD:
        import zstandard  # noqa: PLC0415 - optional codecs load on first use

        return zstandard.ZstdCompressor(level=1).compress(body)  # type: ignore[no-any-return]
    if codec is Codec.LZ4:
        import lz4.frame  # noqa: PLC0415

        return lz4.frame.compress(body)  # type: ignore[no-any-return]
    raise InvalidBatch(f"unknown codec {codec}")


def _decompress(codec: Codec, stored: memoryview, body_size: int) -> memoryview:
    """The body, never inflated past `body_size` whatever the compressed frame claims."""
    if codec is Codec.NONE:
        if len(stored) != body_size:
            raise InvalidBatch(f"body is {len(stored)} bytes, envelope says {body_size}")
        return stored
    try:
        if codec is Codec.ZSTD:
            import zstandard  # noqa: PLC0415

            # decompress() sizes its output from the frame header when there is one and
            # ignores max_output_size then: a forged header would make it allocate (and
            # a real bomb fill) gigabytes. So check the claimed size first.
            claimed = zstandard.frame_content_size(stored)
            if claimed > body_size:
                raise InvalidBatch(
                    f"zstd frame claims {claimed} bytes, envelope says {body_size}"
                )
            body = zstandard.ZstdDecompressor().decompress(stored, max_output_size=body_size)
        else:
            import lz4.frame  # noqa: PLC0415

            # The one-shot lz4.frame.decompress has no output bound: stream with one.
            inflater = lz4.frame.LZ4FrameDecompressor()
            body = inflater.decompress(stored, max_length=body_size)
            if not inflater.eof:
                raise InvalidBatch(f"LZ4 body is truncated or inflates past {body_size} bytes")
            if inflater.unused_data:
                raise InvalidBatch("unexpected bytes after the LZ4 frame")
    except InvalidBatch:
        raise
    except Exception as exc:  # third-party errors are mapped at the boundary
        raise InvalidBatch(f"cannot decompress {codec.name} body: {exc}") from None
    if len(body) != body_size:
        raise InvalidBatch(f"body inflates to {len(body)} bytes, envelope says {body_size}")
    return memoryview(body)


# --------------------------------------------------------------------------- decoding


def parse_envelope(payload: bytes | memoryview, *, verify_crc: bool = True) -> Envelope:
    """Check the envelope (and the CRC of the whole payload) without touching the body.

    Raises InvalidBatch for a short payload, a bad magic/version/codec, a count outside
    1..MAX_BATCH_MESSAGES, an inverted or too wide timestamp range or a CRC mismatch, and
    BatchTooLarge for a body_size over the format limit.
    """
    if len(payload) < ENVELOPE.size:
        raise InvalidBatch(f"batch of {len(payload)} bytes is shorter than its envelope")
    magic, version, codec, _flags, crc, count, body_size, summary, base_ts, max_ts = (
        ENVELOPE.unpack_from(payload)
    )
    if magic != MAGIC or version != VERSION:
        raise InvalidBatch(f"bad batch magic/version {magic:#x}/{version}")
    if codec not in Codec._value2member_map_:
        raise InvalidBatch(f"unknown batch codec {codec}")
    if not 1 <= count <= limits.MAX_BATCH_MESSAGES:
        raise InvalidBatch(f"batch count {count} outside 1..{limits.MAX_BATCH_MESSAGES}")
    if body_size > limits.MAX_BATCH_BYTES:
        raise BatchTooLarge(f"batch body of {body_size} bytes exceeds the format limit")
    if max_ts < base_ts or max_ts - base_ts > _I32_MAX:
        raise InvalidBatch("batch timestamp range is inverted or too wide")
    if verify_crc:
        view = memoryview(payload).cast("B")
        actual = crc32c.crc32c(view[_CRC_START:], crc32c.crc32c(view[:4]))
        if actual != crc:
            raise InvalidBatch(f"batch CRC mismatch: stored {crc:#010x}, computed {actual:#010x}")
    return Envelope(Codec(codec), crc, count, body_size, summary, base_ts, max_ts)


class _Reader:
    """Bounds-checked cursor over a body; every failure is InvalidBatch."""

    __slots__ = ("body", "pos", "size")

    def __init__(self, body: memoryview) -> None:
        self.body = body
        self.pos = 0
        self.size = len(body)

    def take(self, size: int, what: str) -> memoryview:
        start = (self.pos + 7) & ~7
        end = start + size
        if end > self.size:
            raise InvalidBatch(f"batch body truncated in {what}")
        self.pos = end
        return self.body[start:end]

    def offsets(self, n: int, what: str) -> npt.NDArray[np.uint32]:
        """n+1 offsets, checked to start at zero and never decrease."""
        raw = self.take(4 * n + 4, f"{what} offsets")
        if _U32.unpack_from(raw, 4 * n)[0] == 0:
            # Ends at zero (an empty or all-null column): valid only if all zero, which
            # one bytes comparison tells faster than numpy (memoryview == compares item by
            # item).
            if raw.tobytes() != _zeros(4 * n + 4):
                raise InvalidBatch(f"batch {what} offsets are not monotone from zero")
            return np.frombuffer(raw, dtype="<u4")
        offs = np.frombuffer(raw, dtype="<u4")
        if offs[0] != 0 or (offs[1:] < offs[:-1]).any():
            raise InvalidBatch(f"batch {what} offsets are not monotone from zero")
        return offs

    def binary(self, n: int, what: str, has_bitmap: bool) -> BinaryColumn:
        bitmap_view = None
        validity = None
        if has_bitmap:
            bitmap_view = self.take((n + 7) // 8, f"{what} validity")
            validity = np.unpackbits(
                np.frombuffer(bitmap_view, dtype=np.uint8), count=n, bitorder="little"
            ).view(np.bool_)
        offs = self.offsets(n, what)
        # The data section is exactly as long as the last offset says, so every offset
        # (monotone, from zero) lies inside it.
        data = self.take(int(offs[-1]), f"{what} data")
        return BinaryColumn(offs, data, validity, bitmap_view)


_ZEROS = bytes(4 * 257)


def _zeros(size: int) -> bytes:
    return _ZEROS[:size] if size <= len(_ZEROS) else bytes(size)


def decode_columns(payload: bytes | memoryview, *, verify_crc: bool = True) -> BatchColumns:
    """Decode a payload to columns (numpy offsets, memoryview data). No per-message loop.

    The arrays and views share memory with `payload` (or with the inflated body). Raises
    InvalidBatch (or BatchTooLarge, from the envelope) for anything malformed; see the
    module docstring for what a returned BatchColumns is guaranteed to satisfy.
    """
    env = parse_envelope(payload, verify_crc=verify_crc)
    view = memoryview(payload).cast("B")
    body = _decompress(env.codec, view[ENVELOPE.size :], env.body_size)
    rd = _Reader(body)
    flags = _FLAGS.unpack(rd.take(8, "flags"))[0]
    n = env.count
    raw_deltas = rd.take(4 * n, "timestamps")
    span = env.max_timestamp_ms - env.base_timestamp_ms
    if span == 0:
        if raw_deltas.tobytes() != _zeros(4 * n):
            raise InvalidBatch("batch timestamp deltas fall outside the envelope's range")
        timestamps = np.full(n, env.base_timestamp_ms, dtype=np.int64)
    else:
        deltas = np.frombuffer(raw_deltas, dtype="<i4")
        # Bounding the deltas keeps base + delta inside the envelope's range (no int64
        # wrap-around) and base_ts/max_ts true bounds for the index's time lookups.
        if deltas.min() < 0 or deltas.max() > span:
            raise InvalidBatch("batch timestamp deltas fall outside the envelope's range")
        timestamps = deltas.astype(np.int64)
        timestamps += env.base_timestamp_ms
    key = rd.binary(n, "key", bool(flags & 1))
    value = rd.binary(n, "value", bool(flags & 2))
    tag = rd.binary(n, "tag", bool(flags & 4))
    keys_lists = rd.offsets(n, "keys list")
    keys_items = rd.binary(int(keys_lists[-1]), "keys", False)
    header_lists = rd.offsets(n, "headers list")
    nh = int(header_lists[-1])
    header_keys = rd.binary(nh, "header keys", False)
    header_values = rd.binary(nh, "header values", False)
    if rd.pos != len(body):
        raise InvalidBatch(f"{len(body) - rd.pos} unexpected bytes after the batch body")
    return BatchColumns(
        n,
        timestamps,
        key,
        value,
        tag,
        ListColumn(keys_lists, keys_items),
        ListColumn(header_lists, header_keys, header_values),
    )


def _to_bytes(col: BinaryColumn, n: int) -> list[bytes | None]:
    validity = col.validity
    if validity is not None and not validity.any():
        return [None] * n
    if not col.data:
        out: list[bytes | None] = [b""] * n
    else:
        data = col.data.tobytes()
        offs = col.offsets.tolist()
        out = [data[a:b] for a, b in zip(offs, offs[1:])]  # noqa: B905 - n and n+1 long
    if validity is not None:
        for i in np.flatnonzero(~validity).tolist():
            out[i] = None
    return out


def _to_str(col: BinaryColumn, n: int) -> list[str | None]:
    validity = col.validity
    if validity is not None and not validity.any():
        return [None] * n
    data = col.data.tobytes()
    offs = col.offsets.tolist()
    out: list[str | None]
    if not data:
        out = [""] * n
    elif data.isascii():
        # Byte offsets are character offsets in ASCII: decode once and slice the str.
        text = data.decode("ascii")
        out = [text[a:b] for a, b in zip(offs, offs[1:])]  # noqa: B905
    else:
        raw = [data[a:b] for a, b in zip(offs, offs[1:])]  # noqa: B905
        if validity is not None:  # a null entry's bytes need not be UTF-8
            for i in np.flatnonzero(~validity).tolist():
                raw[i] = b""
        try:
            out = [b.decode() for b in raw]
        except UnicodeDecodeError:
            raise InvalidBatch("a string column holds invalid UTF-8") from None
    if validity is not None:
        for i in np.flatnonzero(~validity).tolist():
            out[i] = None
    return out


def _split(items: list[object], list_offsets: npt.NDArray[np.uint32], n: int) -> list[tuple[object, ...]]:
    if not items:
        return [()] * n
    lo = list_offsets.tolist()
    return [tuple(items[a:b]) for a, b in zip(lo, lo[1:])]  # noqa: B905


def decode_messages(
    payload: bytes | memoryview, *, verify_crc: bool = True
) -> list[MessageRecord]:
    """Decode a payload back to MessageRecords, equal to those that were encoded.

    Raises what `decode_columns` raises, and InvalidBatch for a string that is not UTF-8.
    """
    cols = decode_columns(payload, verify_crc=verify_crc)
    n = cols.count
    keys = cols.keys
    headers = cols.headers
    assert headers.values is not None
    header_pairs: list[object] = []
    if len(headers.items.offsets) > 1:
        header_pairs = list(
            zip(_to_str(headers.items, len(headers.items.offsets) - 1),
                _to_bytes(headers.values, len(headers.values.offsets) - 1), strict=True)
        )
    return list(
        map(
            _new_record,
            zip(
                _to_bytes(cols.value, n),
                _to_bytes(cols.key, n),
                _to_str(cols.tag, n),
                _split(_to_str(keys.items, len(keys.items.offsets) - 1), keys.list_offsets, n),  # type: ignore[arg-type]
                _split(header_pairs, headers.list_offsets, n),
                cols.timestamps_ms.tolist(),
                strict=True,
            ),
        )
    )
