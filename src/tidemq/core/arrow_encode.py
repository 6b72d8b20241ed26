"""Arrow rows back to a batch payload, without a Python object per message.

The tier (`tidemq.tiered.parquet_rows`) stores messages as Parquet rows; serving them
again means one batch payload per stored record. The batch body already is Arrow's
layout (`tidemq.core.batch`), so the sections are cut from the Arrow arrays' buffers
(offsets rebased to zero, validity bitmaps repacked) and laid out by the batch encoder's
own `_assemble`. The result is byte for byte what `encode_batch` gives for the same
messages (`tests/unit/test_tier_rows.py` checks it on random batches), so a record comes
back exactly as it was stored.

The rows are trusted: they were a valid batch when stored (limits, UTF-8 and tag rules
are not checked again).
"""

from __future__ import annotations

from typing import Any, Final

import crc32c
import numpy as np
import pyarrow as pa

from tidemq.core.batch import _PAD, Codec, _all_null, _assemble, _empty_lists

__all__ = ["rows_to_payload"]

_U4: Final = np.dtype("<u4")
_COL_KEY, _COL_VALUE, _COL_TAG = 0, 1, 2


def _offsets(array: Any) -> tuple[bytes, int, int]:
    """(offsets rebased to zero as u32, first, last) of a binary/string/list array."""
    raw = np.frombuffer(array.buffers()[1], dtype="<i4")  # Arrow's int32 offsets
    offsets = raw[array.offset : array.offset + len(array) + 1]
    first, last = int(offsets[0]), int(offsets[-1])
    return (offsets - first).astype(_U4).tobytes(), first, last


def _data(array: Any) -> list[bytes]:
    """Offsets and data sections of a binary or string array (nulls: empty)."""
    offsets, first, last = _offsets(array)
    if first == last:
        return [bytes(4 * (len(array) + 1)), b""]
    buffer = array.buffers()[2]
    return [offsets, buffer[first:last].to_pybytes()]


def _bitmap(array: Any) -> bytes:
    present = array.is_valid().to_numpy(zero_copy_only=False).astype(np.uint8)
    return np.packbits(present, bitorder="little").tobytes()


def _nullable(array: Any) -> tuple[int, list[bytes]]:
    """(1 if it has a bitmap else 0, sections), as `_nullable_sections` lays them out."""
    nulls = array.null_count
    if not nulls:
        return 0, _data(array)
    if nulls == len(array):
        return 1, _all_null(len(array))
    return 1, [_bitmap(array), *_data(array)]


def _tags(array: Any) -> tuple[int, list[bytes], int]:
    """(flag, sections, tag summary), as `_tag_sections` gives them."""
    n = len(array)
    if array.null_count == n:
        return 1, _all_null(n), 0
    summary = 0
    for tag in array.unique().drop_null().to_pylist():
        summary |= 1 << (crc32c.crc32c(tag.encode()) & 63)
    flag, sections = _nullable(array)
    return flag, sections, summary


def _keys(array: Any) -> list[bytes]:
    lists, first, last = _offsets(array)
    if first == last:
        return _empty_lists(len(array))
    items = array.values.slice(first, last - first)
    return [lists, *_data(items)]


def _headers(array: Any) -> list[bytes]:
    lists, first, last = _offsets(array)
    if first == last:
        return [*_empty_lists(len(array)), _PAD[4], b""]
    entries = array.values.slice(first, last - first)
    return [lists, *_data(entries.field("key")), *_data(entries.field("value"))]


def rows_to_payload(rows: Any, timestamps_ms: Any, codec: Codec) -> bytes:
    """The batch payload of `rows` (a pa.Table or RecordBatch with the source's `key`,
    `value`, `tag`, `keys`, `headers` columns, one stored batch, in offset order) with
    the producer's `timestamps_ms` (numpy int64, one per row)."""
    count = rows.num_rows

    def column(name: str) -> Any:
        col = rows.column(name)
        return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col

    base_ts, max_ts = int(timestamps_ms.min()), int(timestamps_ms.max())
    deltas = (
        bytes(4 * count) if base_ts == max_ts else (timestamps_ms - base_ts).astype("<i4").tobytes()
    )
    key_flag, key_sections = _nullable(column("key"))
    value_flag, value_sections = _nullable(column("value"))
    tag_flag, tag_sections, summary = _tags(column("tag"))
    return _assemble(
        [
            deltas,
            *key_sections,
            *value_sections,
            *tag_sections,
            *_keys(column("keys")),
            *_headers(column("headers")),
        ],
        count=count,
        flags=key_flag << _COL_KEY | value_flag << _COL_VALUE | tag_flag << _COL_TAG,
        codec=codec,
        max_batch_bytes=1 << 62,  # as stored: it fitted the limits then
        tag_summary=summary,
        base_ts=base_ts,
        max_ts=max_ts,
    )
