"""`valueFormat=protobuf` on the executors: a batch's values decoded into the message's
struct column field by field, not row by row (ADR 0024).

The framing and the message indexes are read with numpy (`value_frames.py`; the usual
indexes, `[0]` as the single byte 0 or one index below 64, and nothing else), the values
are grouped by writer schema and message type, and each group's payloads are parsed by
protobuf's compiled (upb) `FromString` in a `map`. The decoded messages are then read a
column at a time: each field's values for the whole group in one pass
(`operator.attrgetter`), one `pa.array` call a field, nested messages as child columns
under a null mask (`HasField`), repeated messages as list offsets over one child column.
The Python cost that remains is one attribute read a field a value; the value-by-value
path (`protobuf_rows`: a dict a message, a recursive walk, `pa.array` over the dicts)
cost about six times as much (ADR 0024's figures).

The columns hold what the value-by-value path gives: enums, timestamps and map entries
go through the same `python_value`, and a group whose writer's message does not map to
the reader's struct type exactly (an older or newer schema version) is laid out by that
path's `protobuf_row`. Whatever the batch path cannot take (GUID framing, other message
indexes, a payload protobuf refuses, a value Arrow refuses) sends the batch down the
value-by-value path, which fails the task naming the offset of the value at fault, as
before. `tests/unit/test_spark_protobuf_decode.py` holds the two paths to the same
columns.
"""

from __future__ import annotations

import operator
from typing import TYPE_CHECKING, Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from google.protobuf.descriptor import FieldDescriptor

from tidemq.core.errors import InvalidBatch
from tidemq.spark.protobuf_types import (
    TIMESTAMP,
    is_map,
    is_repeated,
    protobuf_row,
    python_value,
    spark_json_of_message,
)
from tidemq.spark.value_frames import FRAMING, Frames, scatter

if TYPE_CHECKING:
    from tidemq.client.protobuf_serde import WriterMessages
    from tidemq.spark.value_format import ValueFormat

__all__ = [
    "columns_of_messages",
    "decode_protobuf_column",
    "protobuf_batch_column",
    "protobuf_rows",
]

_F = FieldDescriptor
#: Message indexes read by the batch path: one byte, an index below this (zigzag < 128).
_INDEX_LIMIT: Final = 64

#: registry URL -> its writers' message classes (per executor process).
_READERS: dict[str, WriterMessages] = {}
#: message class -> its Spark type (JSON form), to compare with the reader's.
_SPARK_JSON: dict[Any, Any] = {}
#: value format -> the Spark type (JSON form) of its reader's message.
_READER_JSON: dict[ValueFormat, Any] = {}


def _writer_messages(fmt: ValueFormat) -> WriterMessages:
    from tidemq.client.protobuf_serde import WriterMessages  # noqa: PLC0415

    found = _READERS.get(fmt.registry_url)
    if found is None:
        found = _READERS[fmt.registry_url] = WriterMessages(fmt.registry())
    return found


def decode_protobuf_column(
    column: Any, offsets: list[int], fmt: ValueFormat, arrow_type: Any, where: tuple[str, int]
) -> Any:
    """The values of a binary column (framed Protobuf; null stays null) as a pa.Array of
    `arrow_type` (the struct of the reader's message)."""
    found = protobuf_batch_column(column, fmt, arrow_type)
    if found is not None:
        return found
    return protobuf_rows(column.to_pylist(), offsets, fmt, arrow_type, where)


def protobuf_batch_column(column: Any, fmt: ValueFormat, arrow_type: Any) -> Any | None:
    """The batch path: the column decoded a group and a field at a time, or None when
    it cannot take a value (the value-by-value path then decides, and names it)."""
    frames = Frames(column)
    groups = _groups(frames) if frames.unframed < 0 else None
    if groups is None:
        return None
    try:
        return _batch_column(frames, groups, fmt, arrow_type)
    except Exception:
        # A payload protobuf refuses, a value Arrow refuses, a registry that does not
        # answer: the value-by-value path raises what was wrong, naming the offset.
        return None


def _batch_column(
    frames: Frames, groups: list[tuple[int, int, Any, int]], fmt: ValueFormat, arrow_type: Any
) -> Any:
    messages = _writer_messages(fmt)
    reader_json = _READER_JSON.get(fmt)
    if reader_json is None:
        reader_json = _READER_JSON[fmt] = fmt.spark_json()
    pieces = []
    for schema_id, index, rows, skip in groups:
        cls = messages.message_class(schema_id, [index])
        pieces.append(_group_column(frames.payload_list(rows, skip), cls, arrow_type, reader_json))
    return scatter(pieces, [rows for _, _, rows, _ in groups], len(frames.column), arrow_type)


def _groups(frames: Frames) -> list[tuple[int, int, Any, int]] | None:
    """(schema id, message index, rows, bytes before their payloads) of each group
    of present values, or None when a value's message indexes are not the usual ones."""
    starts = frames.starts[frames.present]
    lengths = frames.ends[frames.present] - starts
    first = frames.padded[starts + FRAMING]
    second = frames.padded[starts + FRAMING + 1].astype(np.int64)
    # [0] is written as the count 0; one index as the count 1 (zigzag 2), then the index.
    single = first == 0
    one = (first == 2) & (second < 2 * _INDEX_LIMIT) & (second % 2 == 0)
    skip = np.where(single, FRAMING + 1, FRAMING + 2)
    if not ((single | one) & (lengths >= skip)).all():
        return None
    index = np.where(single, 0, second // 2)
    keys = (frames.ids * _INDEX_LIMIT + index) * 2 + single
    found = []
    for key in np.unique(keys):
        chosen = np.flatnonzero(keys == key)
        schema_id, message_index = divmod(int(key) // 2, _INDEX_LIMIT)
        found.append((schema_id, message_index, frames.present[chosen], int(skip[chosen[0]])))
    return found


def _group_column(payloads: list[bytes], cls: Any, arrow_type: Any, reader_json: Any) -> Any:
    messages = list(map(cls.FromString, payloads))
    writer_json = _SPARK_JSON.get(cls)
    if writer_json is None:
        writer_json = _SPARK_JSON[cls] = spark_json_of_message(cls.DESCRIPTOR)
    if writer_json != reader_json:  # another version: laid out by field name, as before
        return pa.array([protobuf_row(m) for m in messages], type=arrow_type)
    return columns_of_messages(messages, cls.DESCRIPTOR, arrow_type)


def columns_of_messages(
    messages: list[Any], descriptor: Any, struct_type: Any, present: list[bool] | None = None
) -> Any:
    """Messages of `descriptor` as a pa.StructArray of `struct_type` (its Spark type in
    Arrow), a column a field; rows where `present` is False are null."""
    if not descriptor.fields:
        return pa.array(
            [{} if present is None or p else None for p in present or messages],
            type=struct_type,
        )
    arrays = [
        _column(messages, f, struct_type.field(i).type) for i, f in enumerate(descriptor.fields)
    ]
    mask = None if present is None else pc.invert(pa.array(present, type=pa.bool_()))
    return pa.StructArray.from_arrays(arrays, fields=list(struct_type), mask=mask)


def _is_struct(field: Any) -> bool:
    return bool(field.type == _F.TYPE_MESSAGE and field.message_type.full_name != TIMESTAMP)


def _column(messages: list[Any], field: Any, arrow_type: Any) -> Any:
    """One field's values, as `protobuf_row` gives them, for every message."""
    name = field.name
    values = list(map(operator.attrgetter(name), messages))
    if is_map(field):
        value_field = field.message_type.fields_by_name["value"]
        return pa.array(
            [[(k, python_value(value_field, v)) for k, v in m.items()] for m in values],
            type=arrow_type,
        )
    if is_repeated(field):
        return _repeated(values, field, arrow_type)
    present = None
    if field.type == _F.TYPE_MESSAGE or field.has_presence:
        # Fields with presence (messages, proto3 `optional`, oneof members): null unset.
        present = [m.HasField(name) for m in messages]
    if _is_struct(field):
        return columns_of_messages(values, field.message_type, arrow_type, present)
    values = _python_values(field, values)
    if present is not None:
        values = [v if p else None for v, p in zip(values, present, strict=True)]
    return pa.array(values, type=arrow_type)


def _repeated(lists: list[Any], field: Any, arrow_type: Any) -> Any:
    if _is_struct(field):
        bounds = np.zeros(len(lists) + 1, dtype=np.int32)
        np.cumsum([len(v) for v in lists], out=bounds[1:])
        flat = [m for v in lists for m in v]
        child = columns_of_messages(flat, field.message_type, arrow_type.value_type)
        return pa.ListArray.from_arrays(pa.array(bounds), child, type=arrow_type)
    if field.type in (_F.TYPE_ENUM, _F.TYPE_MESSAGE, _F.TYPE_GROUP):
        return pa.array([_python_values(field, v) for v in lists], type=arrow_type)
    return pa.array([list(v) for v in lists], type=arrow_type)


def _python_values(field: Any, values: Any) -> list[Any]:
    if field.type == _F.TYPE_ENUM:
        names = {n: v.name for n, v in field.enum_type.values_by_number.items()}
        return [names[v] if v in names else str(v) for v in values]
    if field.type in (_F.TYPE_MESSAGE, _F.TYPE_GROUP):
        return [python_value(field, v) for v in values]
    return list(values)


def protobuf_rows(
    values: list[Any],
    offsets: list[int],
    fmt: ValueFormat,
    arrow_type: Any,
    where: tuple[str, int],
) -> Any:
    """Each framed value read as the message its indexes name (in the writer's schema,
    fetched once per executor process), a dict a value laid out by field name into the
    reader's struct; fails on the first value that does not decode, naming its offset."""
    topic, queue = where
    messages = _writer_messages(fmt)
    decoded: list[Any] = []
    for value, offset in zip(values, offsets, strict=True):
        if value is None:
            decoded.append(None)
            continue
        try:
            decoded.append(protobuf_row(messages.read(value)))
        except Exception as exc:
            raise InvalidBatch(
                f"{topic}/{queue} offset {offset}: the value is not Protobuf of a registered "
                f"schema ({type(exc).__name__}: {exc})"
            ) from None
    return pa.array(decoded, type=arrow_type)
