"""Batch payloads as Arrow record batches: the rows the Spark connector hands to Spark and
the tier writes to Parquet.

The batch body already is Arrow's layout (see `tidemq.core.batch`), so a RecordBatch is
built from `decode_columns`' buffers with `pa.Array.from_buffers`: zero-copy for keys,
values, tags, keys and headers, no Python loop per message. Only timestamps are computed
(milliseconds to microseconds). Several payloads are concatenated at the level of the
decoded columns (offsets shifted, data joined once), then turned into Arrow arrays once.

Schema (`SCHEMA`), in Spark's Arrow types::

    key        binary                                   null: no key
    value      binary                                   null: tombstone
    tag        string                                   null: no tag
    keys       list<string>
    headers    list<struct<key: string, value: binary>>
    timestamp  timestamp[us, tz=UTC]

`records_to_arrow` turns a fetch answer (whole commit-log records) into the data
source's rows: the message columns plus topic, partition, offset and timestampType, in
the order and Arrow types of `source_schema` (what Spark's `to_arrow_schema(schema,
timezone="UTC")` gives for the source's schema).

This module imports pyarrow at import time; nothing imports it at package import (pyarrow
is needed by the Spark connector and the tier only). It lives in `core`, beside the batch
format it reads, so that both of them (which may not import each other) share it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from functools import lru_cache
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from tidemq.core.batch import (
    BatchColumns,
    BinaryColumn,
    ListColumn,
    decode_columns,
    first_index_at,
    message_offsets,
)
from tidemq.core.errors import CorruptRecordError, InvalidBatch
from tidemq.core.message import iter_records, with_append_time
from tidemq.core.record import RecordFlags, parse_header

__all__ = [
    "HEADER_TYPE",
    "SCHEMA",
    "SOURCE_COLUMNS",
    "TIMESTAMP_TYPE_CREATE_TIME",
    "TIMESTAMP_TYPE_LOG_APPEND_TIME",
    "batch_to_arrow",
    "batches_to_arrow",
    "records_to_arrow",
    "source_schema",
]

HEADER_TYPE: Final = pa.struct([("key", pa.string()), ("value", pa.binary())])
# List children named "element", as `pyspark.sql.pandas.types.to_arrow_schema` names them
# (types compare equal either way; the names then match Spark's schema exactly too).
_ELEMENT: Final = "element"
# Every field nullable, as in the DDL schema a Spark data source declares; keys, headers and
# timestamp simply never hold nulls. Microseconds: Spark's TimestampType in Arrow is
# timestamp[us, tz=UTC].
SCHEMA: Final = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("tag", pa.string()),
        ("keys", pa.list_(pa.field(_ELEMENT, pa.string()))),
        ("headers", pa.list_(pa.field(_ELEMENT, HEADER_TYPE))),
        ("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)
_TIMESTAMP_TYPE: Final = SCHEMA.field("timestamp").type
_KEYS_TYPE: Final = SCHEMA.field("keys").type
_HEADERS_TYPE: Final = SCHEMA.field("headers").type
# The millisecond range whose microsecond value fits in int64.
_MS_LIMIT: Final = (2**63 - 1) // 1000
_I32_MAX: Final = 2**31 - 1


def _offsets(offsets: npt.NDArray[np.uint32]) -> Any:
    """An offsets buffer for Arrow (which reads it as int32).

    decode_columns checked the offsets (from zero, non-decreasing, ending at the data size,
    which the batch format keeps below 64 MiB), so as int32 they are the same numbers.
    They are 4-byte aligned when the payload is 8-byte aligned; a payload sliced from an
    odd position is not, and C++ may not read int32s there: copy them then (n+1 words).
    """
    return pa.py_buffer(offsets if offsets.flags.aligned else offsets.copy())


def _binary(col: BinaryColumn, arrow_type: Any) -> Any:
    n = len(col.offsets) - 1
    if col.validity is None or col.validity_bitmap is None:
        validity, null_count = None, 0
    else:
        validity = pa.py_buffer(col.validity_bitmap)
        null_count = n - int(np.count_nonzero(col.validity))
    data = pa.py_buffer(col.data)
    return pa.Array.from_buffers(
        arrow_type, n, [validity, _offsets(col.offsets), data], null_count=null_count
    )


def _string(col: BinaryColumn) -> Any:
    array = _binary(col, pa.string())
    # Arrow strings must be UTF-8 and from_buffers does not check. ASCII is valid UTF-8
    # and one C pass tells it; anything else gets Arrow's full validation.
    if not col.data.tobytes().isascii():
        try:
            array.validate(full=True)
        except pa.ArrowInvalid as exc:
            raise InvalidBatch(f"a string column holds invalid UTF-8: {exc}") from None
    return array


def batch_to_arrow(payload: bytes | memoryview, *, verify_crc: bool = True) -> Any:
    """One batch payload as a `pa.RecordBatch` of `SCHEMA`, one row per message, in order.

    Rows equal `decode_messages(payload)`. The arrays share memory with `payload` (keep it
    unchanged while they live). Raises what `decode_columns` raises, InvalidBatch for a
    string column that is not UTF-8, and InvalidBatch for a timestamp whose microsecond
    value overflows int64 (beyond year 294,000).
    """
    return _columns_to_arrow(decode_columns(payload, verify_crc=verify_crc))


def _columns_to_arrow(cols: BatchColumns) -> Any:
    n = cols.count
    ms = cols.timestamps_ms
    if n and (int(ms.min()) < -_MS_LIMIT or int(ms.max()) > _MS_LIMIT):
        raise InvalidBatch("a message timestamp is out of range for microseconds")
    micros = ms * 1000
    keys = pa.Array.from_buffers(
        _KEYS_TYPE,
        n,
        [None, _offsets(cols.keys.list_offsets)],
        null_count=0,
        children=[_string(cols.keys.items)],
    )
    headers = cols.headers
    assert headers.values is not None
    n_headers = len(headers.items.offsets) - 1
    entries = pa.Array.from_buffers(
        HEADER_TYPE,
        n_headers,
        [None],
        null_count=0,
        children=[_string(headers.items), _binary(headers.values, pa.binary())],
    )
    header_lists = pa.Array.from_buffers(
        _HEADERS_TYPE,
        n,
        [None, _offsets(headers.list_offsets)],
        null_count=0,
        children=[entries],
    )
    return pa.RecordBatch.from_arrays(
        [
            _binary(cols.key, pa.binary()),
            _binary(cols.value, pa.binary()),
            _string(cols.tag),
            keys,
            header_lists,
            pa.Array.from_buffers(_TIMESTAMP_TYPE, n, [None, pa.py_buffer(micros)], null_count=0),
        ],
        schema=SCHEMA,
    )


# Several batches become one RecordBatch by concatenating their decoded columns (numpy
# offsets shifted, data joined: a few numpy calls per batch and column), then building
# the Arrow arrays once: far cheaper than one set of Arrow arrays per batch plus Arrow's
# concatenation, for batches of hundreds of messages.


def _merge_binary(cols: Sequence[BinaryColumn]) -> BinaryColumn:
    counts = [len(c.offsets) - 1 for c in cols]
    sizes = [len(c.data) for c in cols]
    n, total = sum(counts), sum(sizes)
    if total > _I32_MAX:
        raise pa.ArrowInvalid(f"{total} bytes in one column exceed Arrow's 2 GiB array limit")
    if total == 0:
        offsets = np.zeros(n + 1, dtype=np.uint32)
        data = memoryview(b"")
    else:
        offsets = np.empty(n + 1, dtype=np.uint32)
        at = shift = 0
        for c, k, size in zip(cols, counts, sizes, strict=True):
            np.add(c.offsets[:k], shift, out=offsets[at : at + k])
            at += k
            shift += size
        offsets[n] = total
        data = memoryview(b"".join(c.data for c in cols))
    if all(c.validity is None for c in cols):
        return BinaryColumn(offsets, data, None, None)
    validity = np.concatenate(
        [
            np.ones(k, dtype=np.bool_) if c.validity is None else c.validity
            for c, k in zip(cols, counts, strict=True)
        ]
    )
    bitmap = memoryview(np.packbits(validity, bitorder="little").tobytes())
    return BinaryColumn(offsets, data, validity, bitmap)


def _merge_lists(lists: Sequence[ListColumn], *, with_values: bool) -> ListColumn:
    counts = [len(c.list_offsets) - 1 for c in lists]
    items = [len(c.items.offsets) - 1 for c in lists]
    n = sum(counts)
    if sum(items) == 0:
        list_offsets = np.zeros(n + 1, dtype=np.uint32)
    else:
        list_offsets = np.empty(n + 1, dtype=np.uint32)
        at = shift = 0
        for c, k, m in zip(lists, counts, items, strict=True):
            np.add(c.list_offsets[:k], shift, out=list_offsets[at : at + k])
            at += k
            shift += m
        list_offsets[n] = shift
    values = None
    if with_values:
        columns = [c.values for c in lists]
        if any(v is None for v in columns):
            raise InvalidBatch("a headers column has no values")
        values = _merge_binary([v for v in columns if v is not None])
    return ListColumn(list_offsets, _merge_binary([c.items for c in lists]), values)


def _merge(cols: Sequence[BatchColumns]) -> BatchColumns:
    if len(cols) == 1:
        return cols[0]
    return BatchColumns(
        sum(c.count for c in cols),
        np.concatenate([c.timestamps_ms for c in cols]),
        _merge_binary([c.key for c in cols]),
        _merge_binary([c.value for c in cols]),
        _merge_binary([c.tag for c in cols]),
        _merge_lists([c.keys for c in cols], with_values=False),
        _merge_lists([c.headers for c in cols], with_values=True),
    )


def batches_to_arrow(payloads: Iterable[bytes | memoryview], *, verify_crc: bool = True) -> Any:
    """Several batch payloads as one `pa.RecordBatch` of `SCHEMA`: their rows, in order.

    No payload gives an empty RecordBatch. The result owns its memory (the columns are
    concatenated), unless there is exactly one payload. Raises what `batch_to_arrow`
    raises, and `pa.ArrowInvalid` when a column's data passes Arrow's 2 GiB (int32
    offsets) limit for one array.
    """
    cols = [decode_columns(p, verify_crc=verify_crc) for p in payloads]
    if not cols:
        return pa.RecordBatch.from_arrays(
            [pa.array([], type=field.type) for field in SCHEMA], schema=SCHEMA
        )
    return _columns_to_arrow(_merge(cols))


# --------------------------------------------------------------------------- the source's rows

#: The data source's columns, in order (``headers`` only with includeHeaders).
SOURCE_COLUMNS: Final = (
    "key",
    "value",
    "topic",
    "partition",
    "offset",
    "timestamp",
    "timestampType",
    "headers",
    "tag",
    "keys",
)
#: Kafka's timestampType: 0 CreateTime (the producer's clock, which every tidemq message
#: carries) ...
TIMESTAMP_TYPE_CREATE_TIME: Final = 0
#: ... and 1 for a topic with `message.timestamp.type=LogAppendTime` (the broker's clock).
TIMESTAMP_TYPE_LOG_APPEND_TIME: Final = 1
_SOURCE_TYPES: Final = {
    "key": pa.binary(),
    "value": pa.binary(),
    "topic": pa.string(),
    "partition": pa.int32(),
    "offset": pa.int64(),
    "timestamp": _TIMESTAMP_TYPE,
    "timestampType": pa.int32(),
    "headers": _HEADERS_TYPE,
    "tag": pa.string(),
    "keys": _KEYS_TYPE,
}


@lru_cache(maxsize=2)
def source_schema(include_headers: bool) -> Any:
    """The Arrow schema of the source's rows; every field nullable, as Spark declares."""
    return pa.schema(
        [
            (name, _SOURCE_TYPES[name])
            for name in SOURCE_COLUMNS
            if include_headers or name != "headers"
        ]
    )


def _offsets_column(runs: Sequence[npt.NDArray[np.int64]]) -> Any:
    return pa.array(runs[0] if len(runs) == 1 else np.concatenate(runs), type=pa.int64())


def records_to_arrow(
    topic: str,
    queue: int,
    body: bytes,
    sizes: Sequence[int],
    *,
    start: int,
    end: int,
    include_headers: bool = False,
    verify_crc: bool = True,
) -> Any:
    """The messages of fetched records (`body`, record sizes `sizes`) at offsets in
    [start, end), in offset order, as one `pa.RecordBatch` of `source_schema`; None when no
    message falls in the range.

    Per record: its header is checked (CRC) and its payload decoded to columns
    (`decode_columns`); the columns of all records are concatenated, turned into Arrow
    arrays once and sliced to the range, and the constant columns built once per call.
    No Python loop per message.
    Raises CorruptRecordError for a damaged record, InvalidBatch for a damaged payload.
    """
    decoded: list[BatchColumns] = []
    #: Per decoded record: Kafka's timestampType of its messages.
    kinds: list[int] = []
    #: Per decoded record: the offsets of its messages in the range (a compacted record
    #: may skip offsets), and how many of its first messages fall before the range.
    runs: list[npt.NDArray[np.int64]] = []
    skip = 0
    for record in iter_records(body, list(sizes)):
        header = parse_header(record)
        if header.size != len(record):
            raise CorruptRecordError("record size does not match its header")
        base = header.base_offset
        dense = not header.flags & RecordFlags.COMPACTED
        if base >= end or (dense and base + header.count <= start):
            continue  # wholly outside the range (known without decoding when dense)
        cols = decode_columns(record[header.payload_start :], verify_crc=verify_crc)
        if cols.count != header.count:
            raise CorruptRecordError(
                f"record at offset {base} holds {cols.count} messages, its header says "
                f"{header.count}"
            )
        first, stop = first_index_at(cols, base, start), first_index_at(cols, base, end)
        if first >= stop:
            continue
        if not decoded:
            skip = first
        appended = bool(header.flags & RecordFlags.LOG_APPEND_TIME)
        decoded.append(with_append_time(header, cols))
        kinds.append(TIMESTAMP_TYPE_LOG_APPEND_TIME if appended else TIMESTAMP_TYPE_CREATE_TIME)
        runs.append(message_offsets(cols, base)[first:stop])
    if not decoded:
        return None
    messages = _columns_to_arrow(_merge(decoded))
    # Only the first record can start before the range and only the last end after it.
    wanted = sum(len(run) for run in runs)
    if skip or wanted != messages.num_rows:
        messages = messages.slice(skip, wanted)
    if any(kinds):
        counts = [c.count for c in decoded]
        stamp_types = pa.array(
            np.repeat(np.array(kinds, dtype=np.int32), counts)[skip : skip + wanted]
        )
    else:
        stamp_types = pa.repeat(pa.scalar(TIMESTAMP_TYPE_CREATE_TIME, pa.int32()), wanted)
    n = messages.num_rows
    columns = {
        "key": messages.column("key"),
        "value": messages.column("value"),
        "topic": pa.repeat(pa.scalar(topic, pa.string()), n),
        "partition": pa.repeat(pa.scalar(queue, pa.int32()), n),
        "offset": _offsets_column(runs),
        "timestamp": messages.column("timestamp"),
        "timestampType": stamp_types,
        "headers": messages.column("headers"),
        "tag": messages.column("tag"),
        "keys": messages.column("keys"),
    }
    schema = source_schema(include_headers)
    return pa.RecordBatch.from_arrays([columns[name] for name in schema.names], schema=schema)
