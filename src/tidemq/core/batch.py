"""The batch payload: N messages of one (topic, queue), stored column by column.

One batch is the unit of storage, indexing and transfer. The producer encodes it, the
broker stores it as one commit-log record (checking only the envelope and its CRC), and
the consumer decodes it. Columns use Apache Arrow's variable-binary layout so that a
reader can build Arrow arrays from slices without a Python loop per message.

Envelope, little-endian, 40 bytes, never compressed::

    0      1        2      3      4       8      12         16           24          32
    +------+--------+------+------+-------+------+----------+------------+-----------+----------+
    |magic |version |codec |flags |crc32c |count |body_size |tag_summary |base_ts_ms |max_ts_ms |
    |u8    |u8      |u8    |u8    |u32    |u32   |u32       |u64         |i64        |i64       |
    +------+--------+------+------+-------+------+----------+------------+-----------+----------+

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

Version 2 (written only by compaction, never accepted from a producer) appends one more
section, so that a batch may skip offsets::

    offset_delta   u32 x count                 message offset - the record's base offset:
                                               0 first, strictly increasing

A version-1 batch holds consecutive offsets (message i is at base + i); a version-2
batch's messages are at base + offset_delta[i]. Everything else is the same.

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
import re
import struct
from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence, Sized
from dataclasses import dataclass
from enum import IntEnum
from functools import lru_cache, partial
from itertools import accumulate, chain, pairwise, repeat
from typing import Any, Final, NamedTuple

import crc32c
import numpy as np
import numpy.typing as npt

from tidemq.core import limits
from tidemq.core.errors import BatchTooLarge, InvalidBatch
from tidemq.core.names import tag_problem

__all__ = [
    "ENVELOPE",
    "BatchColumns",
    "BinaryColumn",
    "Codec",
    "Envelope",
    "ListColumn",
    "MessageRecord",
    "binary_values",
    "check_tags",
    "columns_to_records",
    "decode_columns",
    "decode_messages",
    "encode_batch",
    "encode_values",
    "first_index_at",
    "may_have_keys",
    "message_offsets",
    "parse_envelope",
    "tag_bit",
    "tag_summary_for",
]

MAGIC: Final = 0xB7
VERSION: Final = 1
#: Batches with an offset-delta section (compacted data): see the module docstring.
VERSION_SPARSE: Final = 2

ENVELOPE: Final = struct.Struct("<BBBBIIIQqq")
assert ENVELOPE.size == 40
_CRC_START: Final = 8
_FLAGS: Final = struct.Struct("<II")
_U32: Final = struct.Struct("<I")
_U4: Final = np.dtype("<u4")

_COL_KEY, _COL_VALUE, _COL_TAG = 0, 1, 2
_I32_MAX: Final = (1 << 31) - 1
_I64_MIN: Final = -(1 << 63)
_I64_MAX: Final = (1 << 63) - 1
_PAD: Final = tuple(bytes(i) for i in range(8))
#: A body smaller than this is joined before its CRC; a larger one is not copied twice.
_JOIN_BELOW: Final = 64 * 1024


class Codec(IntEnum):
    NONE = 0
    ZSTD = 1
    LZ4 = 2


_CODECS: Final = tuple(Codec)  # indexed by value: Codec(x) costs ~5x more
assert all(i == c for i, c in enumerate(_CODECS))


@dataclass(frozen=True, slots=True)
class Envelope:
    codec: Codec
    crc: int
    count: int
    body_size: int
    tag_summary: int
    base_timestamp_ms: int
    max_timestamp_ms: int
    #: A version-2 batch: its messages may skip offsets (only compaction writes these).
    sparse: bool = False


class MessageRecord(NamedTuple):
    """One message as a producer gives it and a consumer gets it back.

    ``value`` None is a tombstone; ``keys`` are RocketMQ business keys; ``timestamp_ms`` is
    milliseconds since the epoch. A named tuple, not a dataclass, because decoding builds
    one per message and a tuple is built in C (a frozen dataclass's ``__init__`` costs
    ~5x more); it compares, hashes and unpacks as a tuple.
    """

    value: bytes | None
    key: bytes | None = None
    tag: str | None = None
    keys: tuple[str, ...] = ()
    headers: tuple[tuple[str, bytes], ...] = ()
    timestamp_ms: int = 0


# What MessageRecord._make does, minus its Python frame: mapped over zip(), it builds
# every record of a batch without running Python code.
_new_record: Final[Callable[[Iterable[object]], MessageRecord]] = partial(
    tuple.__new__, MessageRecord
)


# The decoded column types are named tuples too: decode_columns builds ten of them per
# batch, and that was a tenth of its time as frozen dataclasses.


class BinaryColumn(NamedTuple):
    """Arrow variable-binary layout: offsets (count+1), concatenated data, optional validity.

    Entry i is ``data[offsets[i]:offsets[i + 1]]``; decoding has checked that the offsets
    start at zero, never decrease and end at ``len(data)``. A null entry's bytes mean
    nothing (they are empty when tidemq wrote them).
    """

    offsets: npt.NDArray[np.uint32]
    data: memoryview
    validity: npt.NDArray[np.bool_] | None  # None: every entry present
    validity_bitmap: memoryview | None  # the packed bitmap as stored (Arrow's layout)


class ListColumn(NamedTuple):
    """Arrow list layout: per-message offsets into a child column (or two for headers).

    Message i holds entries ``list_offsets[i]:list_offsets[i + 1]`` of ``items`` (and of
    ``values``); the offsets are checked as a BinaryColumn's, ending at the entry count.
    """

    list_offsets: npt.NDArray[np.uint32]
    items: BinaryColumn
    values: BinaryColumn | None = None  # headers only: the value of each (key, value) entry


@dataclass(frozen=True, slots=True)  # not a NamedTuple: `count` would shadow tuple.count
class BatchColumns:
    """A decoded batch, column by column; every column has `count` entries (lists)."""

    count: int
    timestamps_ms: npt.NDArray[np.int64]
    key: BinaryColumn
    value: BinaryColumn
    tag: BinaryColumn
    keys: ListColumn
    headers: ListColumn
    #: Version 2 only: each message's offset minus the record's base offset (strictly
    #: increasing from 0); None when message i is at base + i.
    offset_deltas: npt.NDArray[np.int64] | None = None


def message_offsets(cols: BatchColumns, base_offset: int) -> npt.NDArray[np.int64]:
    """The offset of each message of a batch whose record starts at `base_offset`."""
    if cols.offset_deltas is None:
        return np.arange(base_offset, base_offset + cols.count, dtype=np.int64)
    return cols.offset_deltas + base_offset


def first_index_at(cols: BatchColumns, base_offset: int, offset: int) -> int:
    """The position in the batch of its first message at or after `offset` (`count` when
    none is): where a read that starts at `offset` begins in this batch."""
    if cols.offset_deltas is None:
        return min(max(0, offset - base_offset), cols.count)
    return int(np.searchsorted(cols.offset_deltas, offset - base_offset, side="left"))


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
# Each column becomes a list of sections (bitmap, offsets, data); `_assemble` lays them out
# with the padding the format requires. Work is done per column in C where it can be
# (join, count, map, numpy cumsum); columns that are all null or all empty are only zeros.


def _all_null(n: int) -> list[bytes]:
    """Sections of a nullable column of n nulls: zero bitmap, zero offsets, no data."""
    return [bytes((n + 7) // 8), bytes(4 * (n + 1)), b""]


def _empty_lists(n: int) -> list[bytes]:
    """List offsets of n empty lists, then the offsets (one zero) and data of no items."""
    return [bytes(4 * (n + 1)), _PAD[4], b""]


def _utf8(text: str, what: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:
        raise InvalidBatch(f"{what} {text[:40]!r} is not encodable as UTF-8") from None


def _utf8_column(
    texts: Sequence[str], what: str, max_bytes: int | None = None
) -> tuple[bytes, Sequence[Sized]]:
    """(concatenated UTF-8, items whose len() are the byte sizes) of a string column."""
    joined = "".join(texts)
    items: Sequence[Sized]
    if joined.isascii():
        # One encode for the column; in ASCII a character is a byte, so the str lengths are
        # the byte lengths.
        data, items = joined.encode("ascii"), texts
    else:
        encoded = [_utf8(text, what) for text in texts]
        data, items = b"".join(encoded), encoded
    if max_bytes is not None and items and max(map(len, items)) > max_bytes:
        i = next(i for i, item in enumerate(items) if len(item) > max_bytes)
        raise InvalidBatch(f"{what} {texts[i][:40]!r} is {len(items[i])} bytes, over {max_bytes}")
    return data, items


#: Up to this many items, offsets are packed with struct instead of a numpy cumsum.
_FEW_ITEMS: Final = 8


def _data_sections(data: bytes, items: Sequence[Sized], what: str) -> list[bytes]:
    """Offsets and data sections of items (`data` is their concatenation)."""
    if not data:
        return [bytes(4 * (len(items) + 1)), b""]
    if len(data) > limits.MAX_BATCH_BYTES:
        # Also keeps every offset far below 2**31, as Arrow's int32 offsets need.
        raise BatchTooLarge(f"{what} data of {len(data)} bytes exceeds the batch format limit")
    if len(items) <= _FEW_ITEMS:
        # A few items (one message: the fast path of a single send): struct beats numpy's
        # call overhead (one item: 1.3 against 4.4 us; encode_batch of one 100 B message
        # went from 14.8 to 9.9 us).
        ends = list(accumulate(map(len, items), initial=0))
        return [struct.pack(f"<{len(ends)}I", *ends), data]
    # array.extend(map(len)) plus one numpy cumsum: ~2x faster than array(accumulate()).
    lengths = array("I", (0,))
    lengths.extend(map(len, items))
    return [np.frombuffer(lengths, dtype=np.uint32).cumsum(dtype=_U4).tobytes(), data]


def _bitmap(items: Sequence[object]) -> bytes:
    """Arrow validity bitmap: bit i set when items[i] is not None."""
    present = bytes(map(operator.is_not, items, repeat(None)))
    return np.packbits(np.frombuffer(present, dtype=np.uint8), bitorder="little").tobytes()


def _nullable_sections(items: Sequence[bytes | None], what: str) -> tuple[int, list[bytes]]:
    """(1 if it has a bitmap else 0, sections) of a nullable binary column."""
    nulls = items.count(None)
    if not nulls:
        return 0, _data_sections(b"".join(items), items, what)  # type: ignore[arg-type]
    if nulls == len(items):
        return 1, _all_null(len(items))
    filled = [b"" if item is None else item for item in items]
    return 1, [_bitmap(items), *_data_sections(b"".join(filled), filled, what)]


def _tag_sections(tags: Sequence[str | None]) -> tuple[int, list[bytes], int]:
    """(1 if it has a bitmap else 0, sections, tag summary) of the tag column."""
    nulls = tags.count(None)
    if nulls == len(tags):
        return 1, _all_null(len(tags)), 0
    # Tags are few and repeated: encode, check and hash each distinct one once.
    encoded: dict[str | None, bytes] = {None: b""}
    summary = 0
    for tag in set(tags):
        if tag is not None:
            raw = _utf8(tag, "tag")
            if len(raw) > limits.MAX_TAG_BYTES:
                raise InvalidBatch(
                    f"tag {tag[:40]!r} is {len(raw)} bytes, over {limits.MAX_TAG_BYTES}"
                )
            problem = tag_problem(tag)  # stored but never matched by any subscription
            if problem is not None:
                raise InvalidBatch(f"tag {tag[:40]!r} {problem}")
            encoded[tag] = raw
            summary |= 1 << (crc32c.crc32c(raw) & 63)
    items = list(map(encoded.__getitem__, tags))
    sections = _data_sections(b"".join(items), items, "tag")
    if not nulls:
        return 0, sections, summary
    return 1, [_bitmap(tags), *sections], summary


def _list_offsets(lists: Sequence[Sized], limit: int, what: str) -> bytes:
    lengths = array("I", (0,))
    lengths.extend(map(len, lists))
    if max(lengths) > limit:
        i = next(i for i, items in enumerate(lists) if len(items) > limit)
        raise InvalidBatch(f"message {i} has {len(lists[i])} {what}, more than {limit}")
    return np.frombuffer(lengths, dtype=np.uint32).cumsum(dtype=_U4).tobytes()


def _keys_sections(keys_lists: Sequence[Sequence[str]]) -> list[bytes]:
    if not any(keys_lists):
        return _empty_lists(len(keys_lists))
    list_offsets = _list_offsets(keys_lists, limits.MAX_KEYS_PER_MESSAGE, "keys")
    data, items = _utf8_column(list(chain.from_iterable(keys_lists)), "key")
    return [list_offsets, *_data_sections(data, items, "keys")]


def _header_sections(headers: Sequence[Sequence[tuple[str, bytes]]]) -> list[bytes]:
    if not any(headers):
        return [*_empty_lists(len(headers)), _PAD[4], b""]
    list_offsets = _list_offsets(headers, limits.MAX_HEADERS_PER_MESSAGE, "headers")
    names, values = zip(*chain.from_iterable(headers), strict=True)
    name_data, name_items = _utf8_column(names, "header key", limits.MAX_HEADER_KEY_BYTES)
    if max(map(len, values)) > limits.MAX_HEADER_VALUE_BYTES:
        i = next(i for i, v in enumerate(values) if len(v) > limits.MAX_HEADER_VALUE_BYTES)
        raise InvalidBatch(
            f"header {names[i][:40]!r} value is {len(values[i])} bytes, "
            f"over {limits.MAX_HEADER_VALUE_BYTES}"
        )
    return [
        list_offsets,
        *_data_sections(name_data, name_items, "header keys"),
        *_data_sections(b"".join(values), values, "header values"),
    ]


def _check_count(count: int) -> None:
    if not 1 <= count <= limits.MAX_BATCH_MESSAGES:
        raise InvalidBatch(f"a batch holds 1 to {limits.MAX_BATCH_MESSAGES} messages, got {count}")


def _check_timestamps(base_ts: int, max_ts: int) -> None:
    if base_ts < _I64_MIN or max_ts > _I64_MAX:
        raise InvalidBatch(f"message timestamps {base_ts}..{max_ts} do not fit in 64 bits")
    if max_ts - base_ts > _I32_MAX:
        raise InvalidBatch(
            f"message timestamps in one batch span {max_ts - base_ts} ms, "
            f"more than {_I32_MAX} (~24.8 days)"
        )


def _assemble(
    sections: list[bytes],
    *,
    count: int,
    flags: int,
    codec: Codec,
    max_batch_bytes: int,
    tag_summary: int,
    base_ts: int,
    max_ts: int,
    version: int = VERSION,
) -> bytes:
    """Lay out the body (each section after the padding that aligns it), compress, seal."""
    parts = [_FLAGS.pack(flags, 0)]
    size = 8
    for section in sections:
        pad = -size % 8
        if pad:
            parts.append(_PAD[pad])
        parts.append(section)
        size += pad + len(section)
    if size > limits.MAX_BATCH_BYTES:
        # Checked on the body, not only the payload: decoders refuse a larger body_size
        # even when it compresses below max_batch_bytes.
        raise BatchTooLarge(
            f"batch body of {size} bytes exceeds the format limit of {limits.MAX_BATCH_BYTES}"
        )
    if codec is not Codec.NONE:
        parts = [_compress(codec, b"".join(parts))]
    elif size < _JOIN_BELOW:
        parts = [b"".join(parts)]  # small: one CRC call beats one per section
    total = ENVELOPE.size + sum(map(len, parts))
    if total > max_batch_bytes:
        raise BatchTooLarge(f"batch of {total} bytes exceeds the limit of {max_batch_bytes}")
    head = ENVELOPE.pack(MAGIC, version, codec, 0, 0, count, size, tag_summary, base_ts, max_ts)
    # The CRC runs over the sections in place and the payload is joined once: one copy of
    # the values (their column), not two (the body, then the payload around it).
    crc = crc32c.crc32c(head[_CRC_START:], crc32c.crc32c(head[:4]))
    for part in parts:
        crc = crc32c.crc32c(part, crc)
    return b"".join((head[:4], _U32.pack(crc), head[_CRC_START:], *parts))


def encode_batch(
    messages: Sequence[MessageRecord],
    *,
    codec: Codec = Codec.NONE,
    max_batch_bytes: int = limits.MAX_BATCH_BYTES,
    offset_deltas: Sequence[int] | None = None,
) -> bytes:
    """Encode messages into one batch payload; `decode_messages` gives them back equal.

    With `offset_deltas` (compaction only: strictly increasing from 0, one per message)
    the batch is version 2 and its messages may skip offsets.

    Raises InvalidBatch naming the message or field that breaks a limit: 1 to
    MAX_BATCH_MESSAGES messages; timestamps in 64 bits spanning at most 2**31 - 1 ms; the
    tag, keys and headers bounds of `tidemq.core.limits`; strings encodable as UTF-8.
    Raises BatchTooLarge when the payload exceeds `max_batch_bytes` or the body the format
    limit. Fields of the wrong type raise TypeError (or AttributeError).
    """
    if len(messages) == 1 and offset_deltas is None:
        one = _encode_one(messages[0], codec, max_batch_bytes)
        if one is not None:
            return one
    return encode_columns(messages, codec, max_batch_bytes, offset_deltas)


def encode_columns(
    messages: Sequence[MessageRecord],
    codec: Codec,
    max_batch_bytes: int,
    offset_deltas: Sequence[int] | None,
) -> bytes:
    """`encode_batch` column by column, for any batch (the one-message shortcut gives the
    same bytes: tests compare them)."""
    count = len(messages)
    _check_count(count)
    # MessageRecord is a tuple: zip(*) turns the rows into columns in C.
    values, keys, tags, keys_lists, headers, timestamps = zip(*messages, strict=True)
    base_ts, max_ts = min(timestamps), max(timestamps)
    _check_timestamps(base_ts, max_ts)
    if base_ts == max_ts:
        deltas = bytes(4 * count)
    else:
        deltas = (np.array(timestamps, dtype=np.int64) - base_ts).astype("<i4").tobytes()
    key_flag, key_sections = _nullable_sections(keys, "key")
    value_flag, value_sections = _nullable_sections(values, "value")
    tag_flag, tag_sections, summary = _tag_sections(tags)
    return _assemble(
        [
            deltas,
            *key_sections,
            *value_sections,
            *tag_sections,
            *_keys_sections(keys_lists),
            *_header_sections(headers),
            *_offset_sections(offset_deltas, count),
        ],
        count=count,
        flags=key_flag << _COL_KEY | value_flag << _COL_VALUE | tag_flag << _COL_TAG,
        codec=codec,
        max_batch_bytes=max_batch_bytes,
        tag_summary=summary,
        base_ts=base_ts,
        max_ts=max_ts,
        version=VERSION if offset_deltas is None else VERSION_SPARSE,
    )


#: The sections of one message's null tag, empty keys list and empty headers list, as
#: `_tag_sections`, `_keys_sections` and `_header_sections` make them for one message.
_ONE_NULL: Final = (b"\0", bytes(8), b"")
_ONE_EMPTY_LISTS: Final = (bytes(8), _PAD[4], b"")
_ONE_EMPTY_HEADERS: Final = (bytes(8), _PAD[4], b"", _PAD[4], b"")
_ZERO_DELTA: Final = bytes(4)
_OFFSETS_OF_ONE: Final = struct.Struct("<II")


def _one_data(data: bytes, what: str) -> tuple[bytes, bytes]:
    """`_data_sections(data, [data], what)` of one item."""
    if len(data) > limits.MAX_BATCH_BYTES:
        raise BatchTooLarge(f"{what} data of {len(data)} bytes exceeds the batch format limit")
    return _OFFSETS_OF_ONE.pack(0, len(data)), data


def _layout(sections: Sequence[bytes], start: int) -> bytes:
    """`sections` laid out as `_assemble` lays them out from body offset `start` (each
    after the padding that aligns it to 8), joined."""
    parts: list[bytes] = []
    size = start
    for section in sections:
        pad = -size % 8
        parts += (_PAD[pad], section)
        size += pad + len(section)
    return b"".join(parts)


#: The body of one message with a null key and a bytes value, none of tag, keys or
#: headers, around its value: flags, the zero timestamp delta and the null key column up
#: to the value's offsets (8-aligned, so the offsets and the value need no padding), then
#: after the value (padded to 8) the null tag column and the empty keys and headers lists.
_PLAIN_HEAD: Final = _layout(
    (_FLAGS.pack(1 << _COL_KEY | 1 << _COL_TAG, 0), _ZERO_DELTA, *_ONE_NULL), 0
)
_PLAIN_TAIL: Final = _layout((*_ONE_NULL, *_ONE_EMPTY_LISTS, *_ONE_EMPTY_HEADERS), 0)
assert len(_PLAIN_HEAD) % 8 == 0
_PLAIN_FIXED: Final = len(_PLAIN_HEAD) + _OFFSETS_OF_ONE.size + len(_PLAIN_TAIL)


def _encode_plain(value: bytes, timestamp_ms: int, max_batch_bytes: int) -> bytes:
    """`encode_batch` of one message with a null key and a bytes value, none of tag, keys
    or headers, uncompressed (the plain one-message send): the body is a fixed head, the
    value's offsets, the value, its padding and a fixed tail; the same bytes as
    `_assemble` makes, the same limits."""
    n = len(value)
    pad = _PAD[-n % 8]
    size = _PLAIN_FIXED + n + len(pad)
    if size > limits.MAX_BATCH_BYTES:
        raise BatchTooLarge(
            f"batch body of {size} bytes exceeds the format limit of {limits.MAX_BATCH_BYTES}"
        )
    if ENVELOPE.size + size > max_batch_bytes:
        raise BatchTooLarge(
            f"batch of {ENVELOPE.size + size} bytes exceeds the limit of {max_batch_bytes}"
        )
    head = ENVELOPE.pack(MAGIC, VERSION, 0, 0, 0, 1, size, 0, timestamp_ms, timestamp_ms)
    offsets = _OFFSETS_OF_ONE.pack(0, n)
    body = b"".join((_PLAIN_HEAD, offsets, value, pad, _PLAIN_TAIL))
    crc = crc32c.crc32c(body, crc32c.crc32c(head[_CRC_START:], crc32c.crc32c(head[:4])))
    return b"".join((head[:4], _U32.pack(crc), head[_CRC_START:], body))


def _encode_one(record: MessageRecord, codec: Codec, max_batch_bytes: int) -> bytes | None:
    """`encode_batch([record])`, the same bytes, for the common one-message send (bytes
    value, no tag, keys or headers): the sections are laid out directly, with no columns
    built (12 -> ~5 us for 100 B). None for any other record: the general path encodes it
    (and raises what it raises)."""
    value, key, tag, keys, headers, timestamp_ms = record
    if (
        type(value) is not bytes
        or tag is not None
        or keys
        or headers
        or (key is not None and type(key) is not bytes)
        or type(timestamp_ms) is not int
        or not _I64_MIN <= timestamp_ms <= _I64_MAX
    ):
        return None
    if key is None and codec is Codec.NONE:
        return _encode_plain(value, timestamp_ms, max_batch_bytes)
    key_sections: tuple[bytes, ...]
    if key is None:
        key_flag, key_sections = 1, _ONE_NULL
    else:
        key_flag, key_sections = 0, _one_data(key, "key")
    return _assemble(
        [
            _ZERO_DELTA,
            *key_sections,
            *_one_data(value, "value"),
            *_ONE_NULL,
            *_ONE_EMPTY_LISTS,
            *_ONE_EMPTY_HEADERS,
        ],
        count=1,
        flags=key_flag << _COL_KEY | 1 << _COL_TAG,
        codec=codec,
        max_batch_bytes=max_batch_bytes,
        tag_summary=0,
        base_ts=timestamp_ms,
        max_ts=timestamp_ms,
    )


def _offset_sections(offset_deltas: Sequence[int] | None, count: int) -> list[bytes]:
    if offset_deltas is None:
        return []
    deltas = np.asarray(offset_deltas, dtype=np.int64)
    if len(deltas) != count:
        raise InvalidBatch(f"{len(deltas)} offset deltas given for {count} messages")
    if deltas[0] != 0 or np.count_nonzero(np.diff(deltas) <= 0) or deltas[-1] > _I32_MAX:
        raise InvalidBatch("offset deltas must start at 0 and strictly increase")
    return [deltas.astype(_U4).tobytes()]


def encode_values(
    values: Sequence[bytes | None],
    *,
    timestamp_ms: int,
    keys: Sequence[bytes | None] | None = None,
    tags: Sequence[str | None] | None = None,
    headers: Mapping[str, bytes] | None = None,
    codec: Codec = Codec.NONE,
    max_batch_bytes: int = limits.MAX_BATCH_BYTES,
) -> bytes:
    """Fast path for the common case, the producer's `send_batch`: values sharing one
    timestamp and the same headers, optional keys and tags (one per value, None for none),
    no business keys. Builds the columns straight from the lists, with no object per
    message.

    Gives byte for byte what `encode_batch` gives for the equivalent records, and raises
    what it raises (also InvalidBatch when `keys` or `tags` and `values` differ in
    length). A None value (tombstone) is accepted, through `encode_batch`.
    """
    count = len(values)
    if keys is not None and len(keys) != count:
        raise InvalidBatch(f"{len(keys)} keys given for {count} values")
    if tags is not None and len(tags) != count:
        raise InvalidBatch(f"{len(tags)} tags given for {count} values")
    header_items = tuple(headers.items()) if headers else ()
    _check_count(count)
    _check_timestamps(timestamp_ms, timestamp_ms)
    try:
        value_data = b"".join(values)  # type: ignore[arg-type] # a None: TypeError below
    except TypeError:
        if None not in values:
            raise
        key_list = [None] * count if keys is None else keys
        tag_list = [None] * count if tags is None else tags
        return encode_batch(
            [
                MessageRecord(v, k, t, (), header_items, timestamp_ms)
                for v, k, t in zip(values, key_list, tag_list, strict=True)
            ],
            codec=codec,
            max_batch_bytes=max_batch_bytes,
        )
    if keys is None:
        key_flag, key_sections = 1, _all_null(count)
    else:
        key_flag, key_sections = _nullable_sections(keys, "key")
    if tags is None:
        tag_flag, tag_sections, summary = 1, _all_null(count), 0
    else:
        tag_flag, tag_sections, summary = _tag_sections(tags)
    if header_items:
        header_sections = _repeated_header_sections(header_items, count)
    else:
        header_sections = [*_empty_lists(count), _PAD[4], b""]
    return _assemble(
        [
            bytes(4 * count),  # every timestamp delta is zero
            *key_sections,
            *_data_sections(value_data, values, "value"),  # type: ignore[arg-type] # no None here
            *tag_sections,
            *_empty_lists(count),  # keys
            *header_sections,
        ],
        count=count,
        flags=key_flag << _COL_KEY | tag_flag << _COL_TAG,
        codec=codec,
        max_batch_bytes=max_batch_bytes,
        tag_summary=summary,
        base_ts=timestamp_ms,
        max_ts=timestamp_ms,
    )


def _repeated_header_sections(header: tuple[tuple[str, bytes], ...], count: int) -> list[bytes]:
    """Sections of a header column where each of `count` messages carries `header`."""
    # One message's column, checked (and errors worded) as encode_batch does, tiled.
    _, key_offsets, key_data, value_offsets, value_data = _header_sections([header])
    per = len(header)
    out = [np.arange(0, per * (count + 1), per, dtype=_U4).tobytes()]
    for offsets, data, what in (
        (key_offsets, key_data, "header keys"),
        (value_offsets, value_data, "header values"),
    ):
        if len(data) * count > limits.MAX_BATCH_BYTES:
            raise BatchTooLarge(
                f"{what} data of {len(data) * count} bytes exceeds the batch format limit"
            )
        tiled = np.zeros(per * count + 1, dtype=_U4)
        np.cumsum(np.tile(np.diff(np.frombuffer(offsets, dtype=_U4)), count), out=tiled[1:])
        out += [tiled.tobytes(), data * count]
    return out


def _compress(codec: Codec, body: bytes) -> bytes:
    if codec is Codec.NONE:
        return body
    if codec is Codec.ZSTD:
        import zstandard  # noqa: PLC0415 - optional codecs load on first use

        return zstandard.ZstdCompressor(level=1).compress(body)
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

            # decompress() sizes its output by the frame header's content size when there
            # is one, ignoring max_output_size: a forged header would have it allocate (and
            # a real bomb fill) gigabytes. Check the claim first.
            claimed = zstandard.frame_content_size(stored)
            if claimed > body_size:
                raise InvalidBatch(f"zstd frame claims {claimed} bytes, envelope says {body_size}")
            body = zstandard.ZstdDecompressor().decompress(
                stored, max_output_size=body_size, allow_extra_data=False
            )
        else:
            import lz4.frame  # noqa: PLC0415

            # lz4.frame.decompress() has no output bound; the streaming decompressor has.
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


def _read_envelope(
    view: memoryview, verify_crc: bool
) -> tuple[int, int, int, int, int, int, int, int]:
    """(codec, crc, count, body_size, tag_summary, base_ts, max_ts, version) of a payload,
    checked.
    (Parsed to a tuple: decode_columns has no use for an Envelope object.)"""
    if len(view) < ENVELOPE.size:
        raise InvalidBatch(f"batch of {len(view)} bytes is shorter than its envelope")
    magic, version, codec, _flags, crc, count, body_size, summary, base_ts, max_ts = (
        ENVELOPE.unpack_from(view)
    )
    if magic != MAGIC or version not in (VERSION, VERSION_SPARSE):
        raise InvalidBatch(f"bad batch magic/version {magic:#x}/{version}")
    if codec >= len(_CODECS):
        raise InvalidBatch(f"unknown batch codec {codec}")
    if not 1 <= count <= limits.MAX_BATCH_MESSAGES:
        raise InvalidBatch(f"batch count {count} outside 1..{limits.MAX_BATCH_MESSAGES}")
    if body_size > limits.MAX_BATCH_BYTES:
        raise BatchTooLarge(f"batch body of {body_size} bytes exceeds the format limit")
    if max_ts < base_ts or max_ts - base_ts > _I32_MAX:
        raise InvalidBatch("batch timestamp range is inverted or too wide")
    if verify_crc:
        actual = crc32c.crc32c(view[_CRC_START:], crc32c.crc32c(view[:4]))
        if actual != crc:
            raise InvalidBatch(f"batch CRC mismatch: stored {crc:#010x}, computed {actual:#010x}")
    return codec, crc, count, body_size, summary, base_ts, max_ts, version


def parse_envelope(payload: bytes | memoryview, *, verify_crc: bool = True) -> Envelope:
    """Check the envelope (and the CRC of the whole payload) without touching the body.

    Raises InvalidBatch for a short payload, a bad magic, version or codec, a count outside
    1..MAX_BATCH_MESSAGES, an inverted or too wide timestamp range or a CRC mismatch;
    BatchTooLarge for a body_size over the format limit.
    """
    codec, crc, count, body_size, summary, base_ts, max_ts, version = _read_envelope(
        memoryview(payload).cast("B"), verify_crc
    )
    return Envelope(
        _CODECS[codec],
        crc,
        count,
        body_size,
        summary,
        base_ts,
        max_ts,
        sparse=version == VERSION_SPARSE,
    )


_ZEROS: Final = bytes(4 * 1025)


def _zeros(size: int) -> bytes:
    return _ZEROS[:size] if size <= len(_ZEROS) else bytes(size)


def _frozen_zeros(n: int, dtype: npt.DTypeLike) -> npt.NDArray[Any]:
    array = np.zeros(n, dtype=dtype)
    array.flags.writeable = False
    return array


# Columns that hold nothing, shared by every decode (their arrays are read-only): the
# column of zero entries (keys or headers of a batch that has none), and, by batch size,
# all-null columns (no key, no tag) and lists that are all empty. Recognising them with
# one bytes comparison, rather than checking their sections one by one, is a third of
# decode_columns' time for the common batch of values without keys, tags or headers.
_EMPTY_COLUMN: Final = BinaryColumn(_frozen_zeros(1, _U4), memoryview(b""), None, None)


@lru_cache(maxsize=16)
def _null_column(n: int) -> BinaryColumn:
    bitmap = memoryview(bytes((n + 7) // 8))
    return BinaryColumn(
        _frozen_zeros(n + 1, _U4), memoryview(b""), _frozen_zeros(n, np.bool_), bitmap
    )


@lru_cache(maxsize=16)
def _no_lists(n: int, with_values: bool) -> ListColumn:
    return ListColumn(
        _frozen_zeros(n + 1, _U4), _EMPTY_COLUMN, _EMPTY_COLUMN if with_values else None
    )


class _Reader:
    """Bounds-checked cursor over a body; every failure is InvalidBatch.

    Hot code: it makes few numpy calls, and cheap ones (count_nonzero, not ndarray.any(),
    which costs 3x more on small arrays); all-zero sections (the offsets of empty or
    all-null columns, bitmaps of all-null ones) are checked by one bytes comparison.
    """

    __slots__ = ("body", "pos", "size")

    def __init__(self, body: memoryview) -> None:
        self.body = body
        self.pos = 0
        self.size = len(body)

    def take(self, size: int, what: str) -> memoryview:
        start = (self.pos + 7) & -8
        end = start + size
        if end > self.size:
            raise InvalidBatch(f"batch body truncated in {what}")
        self.pos = end
        return self.body[start:end]

    def offsets(self, n: int, what: str) -> tuple[npt.NDArray[np.uint32], int]:
        """n+1 offsets, checked to start at zero and never decrease; and the last one."""
        raw = self.take(4 * n + 4, what)
        offs = np.frombuffer(raw, dtype=_U4)
        last = int(offs[n])
        if last == 0:
            # Memoryview == compares item by item; bytes == is one memcmp.
            if n and raw.tobytes() != _zeros(4 * n + 4):
                raise InvalidBatch(f"batch {what} offsets are not monotone from zero")
        elif offs[0] != 0 or np.count_nonzero(np.less(offs[1:], offs[:-1])):
            raise InvalidBatch(f"batch {what} offsets are not monotone from zero")
        return offs, last

    def zeros_ahead(self, sizes: tuple[int, ...]) -> bool:
        """Whether the next sections, of these sizes (with their padding), are all zero
        bytes; if so, skip them. An all-null or all-empty column is just that."""
        start = end = (self.pos + 7) & -8
        for size in sizes:
            end = ((end + 7) & -8) + size
        if end > self.size or self.body[start:end].tobytes() != _zeros(end - start):
            return False
        self.pos = end
        return True

    def binary(self, n: int, what: str, has_bitmap: bool) -> BinaryColumn:
        if has_bitmap and self.zeros_ahead(((n + 7) >> 3, 4 * n + 4, 0)):
            return _null_column(n)  # no entry present, all empty
        if n == 0 and not has_bitmap:
            if self.take(4, what).tobytes() != b"\0\0\0\0":
                raise InvalidBatch(f"batch {what} offsets are not monotone from zero")
            self.take(0, what)
            return _EMPTY_COLUMN
        bitmap = validity = None
        if has_bitmap:
            bitmap = self.take((n + 7) >> 3, what)
            bits = bitmap.tobytes()
            if bits == _zeros(len(bits)):
                validity = np.zeros(n, dtype=np.bool_)  # all null: nothing to unpack
            else:
                validity = np.unpackbits(
                    np.frombuffer(bits, dtype=np.uint8), count=n, bitorder="little"
                ).view(np.bool_)
        offs, size = self.offsets(n, what)
        # The data section is as long as the last offset says, so every offset (monotone,
        # from zero) points inside it.
        return BinaryColumn(offs, self.take(size, what), validity, bitmap)


def decode_columns(payload: bytes | memoryview, *, verify_crc: bool = True) -> BatchColumns:
    """Decode a payload to columns (numpy offsets, memoryview data). No per-message loop.

    The arrays and views share memory with `payload` (or with the inflated body). Raises
    InvalidBatch (or BatchTooLarge, from the envelope) for anything malformed; the module
    docstring says what a returned BatchColumns is guaranteed to satisfy.
    """
    view = memoryview(payload).cast("B")  # sizes and slices in bytes, whatever the format
    codec, _, n, body_size, _, base_ts, max_ts, version = _read_envelope(view, verify_crc)
    body = _decompress(_CODECS[codec], view[ENVELOPE.size :], body_size)
    rd = _Reader(body)
    flags = _FLAGS.unpack(rd.take(8, "flags"))[0]
    raw_deltas = rd.take(4 * n, "timestamps")
    timestamps: npt.NDArray[np.int64]
    if base_ts == max_ts:
        if raw_deltas.tobytes() != _zeros(4 * n):
            raise InvalidBatch("batch timestamp deltas fall outside the envelope's range")
        timestamps = np.full(n, base_ts, dtype=np.int64)
    else:
        deltas = np.frombuffer(raw_deltas, dtype="<i4")
        # In-range deltas keep base + delta from wrapping around in int64, and keep the
        # envelope's range true for the index's time lookups.
        if int(deltas.min()) < 0 or int(deltas.max()) > max_ts - base_ts:
            raise InvalidBatch("batch timestamp deltas fall outside the envelope's range")
        timestamps = deltas.astype(np.int64)
        timestamps += base_ts
    key = rd.binary(n, "key", bool(flags & 1 << _COL_KEY))
    value = rd.binary(n, "value", bool(flags & 1 << _COL_VALUE))
    tag = rd.binary(n, "tag", bool(flags & 1 << _COL_TAG))
    if rd.zeros_ahead((4 * n + 4, 4, 0)):
        keys = _no_lists(n, False)
    else:
        keys_lists, n_keys = rd.offsets(n, "keys list")
        keys = ListColumn(keys_lists, rd.binary(n_keys, "keys", False))
    if rd.zeros_ahead((4 * n + 4, 4, 0, 4, 0)):
        headers = _no_lists(n, True)
    else:
        header_lists, n_headers = rd.offsets(n, "headers list")
        header_keys = rd.binary(n_headers, "header keys", False)
        headers = ListColumn(
            header_lists, header_keys, rd.binary(n_headers, "header values", False)
        )
    offset_deltas = None
    if version == VERSION_SPARSE:
        raw = np.frombuffer(rd.take(4 * n, "offset deltas"), dtype=_U4)
        if raw[0] != 0 or np.count_nonzero(raw[1:] <= raw[:-1]):
            raise InvalidBatch("batch offset deltas do not start at 0 and strictly increase")
        offset_deltas = raw.astype(np.int64)
    if rd.pos != len(body):
        raise InvalidBatch(f"{len(body) - rd.pos} unexpected bytes after the batch body")
    return BatchColumns(n, timestamps, key, value, tag, keys, headers, offset_deltas)


#: A byte that no tag a subscription can match holds, in ASCII: controls, space, "|".
_BAD_TAG_BYTE: Final = re.compile(rb"[\x00-\x20\x7f|]")


def may_have_keys(payload: bytes | memoryview, envelope: Envelope) -> bool:
    """False when no message of the batch has a non-empty key nor any `keys`; True when
    one may (then `decode_columns` tells). Reads only section sizes: the key index asks it
    of every batch, and a full decode of a keyless 256-message batch costs ~20 us against
    ~2 us for this. A compressed body cannot be probed without inflating it: True."""
    if envelope.codec is not Codec.NONE:
        return True
    body = memoryview(payload).cast("B")[ENVELOPE.size :]
    n = envelope.count
    try:
        flags = _FLAGS.unpack_from(body)[0]
        pos = 8 + 4 * n
        sizes = []
        for column in (_COL_KEY, _COL_VALUE, _COL_TAG):
            if flags & 1 << column:
                pos = ((pos + 7) & -8) + ((n + 7) >> 3)
            offsets_at = (pos + 7) & -8
            size = _U32.unpack_from(body, offsets_at + 4 * n)[0]
            sizes.append(size)
            pos = ((offsets_at + 4 * n + 4 + 7) & -8) + size
        if sizes[0]:
            return True
        items: int = _U32.unpack_from(body, ((pos + 7) & -8) + 4 * n)[0]
    except struct.error:
        return True  # malformed: the full decode names what is wrong
    return items > 0


def check_tags(payload: bytes | memoryview, envelope: Envelope | None = None) -> None:
    """Refuse, with InvalidBatch, a batch holding a tag no subscription can match
    (`tidemq.core.names.tag_problem`): what `encode_batch` refuses, checked again by the
    store for producers that skip the encoder. A batch without tags (tag summary 0, the
    common case) is not decoded; an ASCII tag column is checked with one scan. Pass the
    payload's `envelope` when it is parsed already."""
    if envelope is None:
        envelope = parse_envelope(payload, verify_crc=False)
    if envelope.tag_summary == 0:
        return
    column = decode_columns(payload, verify_crc=False).tag
    data = bytes(column.data)
    if data.isascii() and _BAD_TAG_BYTE.search(data) is None:
        return
    for raw in set(_slices(data, column.offsets)):
        try:
            tag = raw.decode()
        except UnicodeDecodeError:
            raise InvalidBatch(f"tag {raw[:40]!r} is not valid UTF-8") from None
        problem = tag_problem(tag)
        if problem is not None:
            raise InvalidBatch(f"tag {tag[:40]!r} {problem}")


def _slices(data: bytes, offsets: npt.NDArray[np.uint32]) -> list[bytes]:
    return [data[a:b] for a, b in pairwise(offsets.tolist())]


def _nulls(col: BinaryColumn, n: int) -> list[int] | None:
    """Positions of the null entries; None when every entry is null."""
    if col.validity is None:
        return []
    present = int(np.count_nonzero(col.validity))
    if present == n:
        return []
    if present == 0:
        return None
    return np.flatnonzero(~col.validity).tolist()


def _to_bytes(col: BinaryColumn) -> list[bytes | None]:
    n = len(col.offsets) - 1
    nulls = _nulls(col, n)
    if nulls is None:
        return [None] * n
    out: list[bytes | None]
    out = _slices(col.data.tobytes(), col.offsets) if col.data else [b""] * n  # type: ignore[assignment]
    for i in nulls:
        out[i] = None
    return out


def binary_values(col: BinaryColumn) -> list[bytes | None]:
    """A binary column's entries as bytes (None for a null one)."""
    return _to_bytes(col)


def _to_str(col: BinaryColumn) -> list[str | None]:
    n = len(col.offsets) - 1
    nulls = _nulls(col, n)
    if nulls is None:
        return [None] * n
    data = col.data.tobytes()
    out: list[str | None]
    if not data:
        out = [""] * n
    elif data.isascii():
        # In ASCII byte offsets are character offsets: decode once, slice the str.
        text = data.decode("ascii")
        out = [text[a:b] for a, b in pairwise(col.offsets.tolist())]
    else:
        raw = _slices(data, col.offsets)
        for i in nulls:  # the bytes of a null entry need not be UTF-8
            raw[i] = b""
        try:
            out = [item.decode() for item in raw]
        except UnicodeDecodeError:
            raise InvalidBatch("a string column holds invalid UTF-8") from None
    for i in nulls:
        out[i] = None
    return out


def _split(
    items: Sequence[object], list_offsets: npt.NDArray[np.uint32]
) -> list[tuple[object, ...]]:
    """Each message's tuple of a list column's items."""
    n = len(list_offsets) - 1
    if not items:
        return [()] * n
    bounds = list_offsets.tolist()
    per = bounds[1]
    if per and bounds == list(range(0, per * n + 1, per)):
        # Every message has `per` items (a common shape): zip cuts the tuples in C.
        return list(zip(*[iter(items)] * per, strict=True))
    return [tuple(items[a:b]) for a, b in pairwise(bounds)]


def decode_messages(payload: bytes | memoryview, *, verify_crc: bool = True) -> list[MessageRecord]:
    """Decode a payload back to MessageRecords, equal to those that were encoded.

    Raises what `decode_columns` raises, and InvalidBatch for a string that is not UTF-8.
    """
    return columns_to_records(decode_columns(payload, verify_crc=verify_crc))


def columns_to_records(cols: BatchColumns) -> list[MessageRecord]:
    """The MessageRecords of decoded columns (InvalidBatch for a string not UTF-8)."""
    headers = cols.headers
    assert headers.values is not None
    pairs: Sequence[tuple[str | None, bytes | None]] = ()
    if headers.items is not _EMPTY_COLUMN:
        pairs = list(zip(_to_str(headers.items), _to_bytes(headers.values), strict=True))
    return list(
        map(
            _new_record,
            zip(
                _to_bytes(cols.value),
                _to_bytes(cols.key),
                _to_str(cols.tag),
                _split(_to_str(cols.keys.items), cols.keys.list_offsets),
                _split(pairs, headers.list_offsets),
                cols.timestamps_ms.tolist(),
                strict=True,
            ),
        )
    )
