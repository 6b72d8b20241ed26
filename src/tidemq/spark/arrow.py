"""Batch payloads as Arrow record batches, the form the Spark connector hands to Spark.

The batch body already is Arrow's layout (see `tidemq.core.batch`), so a RecordBatch is
built from `decode_columns`' buffers with `pa.Array.from_buffers`: zero-copy for keys,
values, tags, keys and headers, no Python loop per message. Only timestamps are computed
(milliseconds to microseconds).

Schema (`SCHEMA`), in Spark's Arrow types::

    key        binary                                   null: no key
    value      binary                                   null: tombstone
    tag        string                                   null: no tag
    keys       list<string>
    headers    list<struct<key: string, value: binary>>
    timestamp  timestamp[us, tz=UTC]

This module imports pyarrow at import time; `tidemq.spark` itself must not import it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from tidemq.core.batch import BinaryColumn, decode_columns
from tidemq.core.errors import InvalidBatch

__all__ = ["HEADER_TYPE", "SCHEMA", "batch_to_arrow", "batches_to_arrow"]

HEADER_TYPE: Final = pa.struct([("key", pa.string()), ("value", pa.binary())])
# Every field nullable, as in the DDL schema a Spark data source declares; keys, headers and
# timestamp simply never hold nulls. Microseconds: Spark's TimestampType in Arrow is
# timestamp[us, tz=UTC].
SCHEMA: Final = pa.schema(
    [
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("tag", pa.string()),
        ("keys", pa.list_(pa.string())),
        ("headers", pa.list_(HEADER_TYPE)),
        ("timestamp", pa.timestamp("us", tz="UTC")),
    ]
)
_TIMESTAMP_TYPE: Final = SCHEMA.field("timestamp").type
_KEYS_TYPE: Final = SCHEMA.field("keys").type
_HEADERS_TYPE: Final = SCHEMA.field("headers").type
# The millisecond range whose microsecond value fits in int64.
_MS_LIMIT: Final = (2**63 - 1) // 1000


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
    cols = decode_columns(payload, verify_crc=verify_crc)
    n = cols.count
    ms = cols.timestamps_ms
    if int(ms.min()) < -_MS_LIMIT or int(ms.max()) > _MS_LIMIT:
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


def batches_to_arrow(payloads: Iterable[bytes | memoryview], *, verify_crc: bool = True) -> Any:
    """Several batch payloads as one `pa.RecordBatch` of `SCHEMA`: their rows, in order.

    No payload gives an empty RecordBatch. The result owns its memory (the columns are
    concatenated), unless there is exactly one payload. Raises what `batch_to_arrow`
    raises, and `pa.ArrowInvalid` when a column's data passes Arrow's 2 GiB (int32
    offsets) limit for one array.
    """
    batches = [batch_to_arrow(p, verify_crc=verify_crc) for p in payloads]
    if not batches:
        return pa.RecordBatch.from_arrays(
            [pa.array([], type=field.type) for field in SCHEMA], schema=SCHEMA
        )
    if len(batches) == 1:
        return batches[0]
    return pa.Table.from_batches(batches, schema=SCHEMA).combine_chunks().to_batches()[0]
