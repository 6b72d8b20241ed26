"""Writing a struct `value` column as Confluent-framed Avro, Protobuf or JSON
(`valueFormat=avro|protobuf|json` on the batch writer and the streaming sink, with
`schemaRegistry`, and optionally `subject`, `schemaVersion` and `protobufMessage`).

Resolved once, on the driver, when the write starts (`resolve_write_format`): the
subject's version (latest by default; the subject defaults to `<topic>-value` with the
`topic` option) gives the schema and its id. When the subject has no version yet (and no
`schemaVersion` is asked for), a schema is derived from the column's Spark type
(`value_schemas.py`: an Avro record, a proto3 message or a JSON Schema object, named
`topLevelRecord` as Spark's own `to_avro` names it) and registered. Executors then encode
each row's struct with that schema and frame it with the id (`encode_value_column`); a
row that does not fit the schema fails the task naming its index in the batch. JSON
values are written as they are (maps as objects; the schema's constraints are the
registry's and the readers' to check).
"""

from __future__ import annotations

import datetime as dt
import io
import json
from collections.abc import Mapping
from typing import Any

import fastavro
import pyarrow as pa

from tidemq.core.errors import InvalidBatch, InvalidRequest
from tidemq.schema.wire import frame
from tidemq.spark.value_format import ValueFormat, format_request, protobuf_imports
from tidemq.spark.value_schemas import derived_schema

__all__ = ["encode_value_column", "resolve_write_format"]


def resolve_write_format(
    options: Mapping[str, str], value_type: Any, topic: str | None
) -> ValueFormat | None:
    """The format to encode the `value` column with (None: raw bytes or strings), with its
    schema id, from lower-cased `options`. ValueError naming what is wrong."""
    request = format_request(options)
    if request is None:
        return None
    fmt = request.kind
    if not pa.types.is_struct(value_type):
        raise ValueError(f"valueFormat={fmt} writes a struct 'value' column, not {value_type}")
    subject = options.get("subject") or (f"{topic}-value" if topic else None)
    if subject is None:
        raise ValueError(f"valueFormat={fmt} needs subject=... unless the topic option is set")
    registry = request.login.registry(request.registry_url)
    version = options.get("schemaversion")
    try:
        answer = registry.version_answer(subject, version or "latest")
    except InvalidRequest as exc:
        if version is not None or "40401" not in str(exc):
            raise ValueError(f"valueFormat={fmt}: subject {subject!r}: {exc}") from None
        text, kind = derived_schema(fmt, value_type)
        answer = {"id": registry.register_text(subject, text, kind), "schema": text}
        answer["schemaType"] = kind
    kind = str(answer.get("schemaType", "AVRO"))
    if kind.lower() != fmt:
        raise ValueError(f"subject {subject!r} holds a {kind} schema, not valueFormat={fmt}")
    if fmt == "avro":  # a schema fastavro cannot write fails here
        fastavro.parse_schema(json.loads(answer["schema"]))
    found = ValueFormat(
        request.registry_url,
        str(answer["schema"]),
        fmt,
        schema_id=int(answer["id"]),
        message=request.message,
        login=request.login,
        imports=protobuf_imports(registry, answer),
    )
    if fmt == "protobuf":
        found.spark_json()  # the message exists (and has a Spark type)
    return found


def encode_value_column(batch: Any, fmt: ValueFormat) -> Any:
    """`batch` (a pa.RecordBatch of rows to write) with its struct `value` column encoded
    and framed (null rows stay null: tombstones)."""
    index = batch.schema.get_field_index("value")
    rows = batch.column(index).to_pylist()
    encoded: list[bytes | None] = []
    if fmt.kind == "json":
        value_type = batch.schema.field(index).type
        for row in rows:
            encoded.append(
                None
                if row is None
                else frame(
                    fmt.schema_id, json.dumps(_json_row(row, value_type), default=_json).encode()
                )
            )
    elif fmt.kind == "protobuf":
        encoded = _protobuf_values(rows, fmt)
    else:
        parsed = fastavro.parse_schema(json.loads(fmt.reader_schema))
        for i, row in enumerate(rows):
            if row is None:
                encoded.append(None)
                continue
            out = io.BytesIO()
            try:
                fastavro.schemaless_writer(out, parsed, _avro_row(row))
            except (ValueError, TypeError, KeyError, AttributeError) as exc:
                raise InvalidBatch(
                    f"row {i} of the batch does not fit the subject's Avro schema ({exc})"
                ) from None
            encoded.append(frame(fmt.schema_id, out.getvalue()))
    column = pa.array(encoded, type=pa.binary())
    columns = [column if i == index else batch.column(i) for i in range(batch.num_columns)]
    fields = [pa.field("value", pa.binary()) if f.name == "value" else f for f in batch.schema]
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))


def _protobuf_values(rows: list[Any], fmt: ValueFormat) -> list[bytes | None]:
    """Rows as the subject's message (its struct's fields by name; maps, lists, nested
    structs, enum names), framed with the schema id and the message's indexes."""
    from google.protobuf import json_format  # noqa: PLC0415 - protobuf on demand

    from tidemq.client.protobuf_serde import message_class, message_indexes  # noqa: PLC0415
    from tidemq.schema.wire import encode_message_indexes  # noqa: PLC0415
    from tidemq.spark.protobuf_types import json_of_row  # noqa: PLC0415

    cls = message_class(fmt.reader_schema, [0], name=fmt.message, imports=fmt.imports)
    prefix = encode_message_indexes(message_indexes(cls.DESCRIPTOR))
    out: list[bytes | None] = []
    for i, row in enumerate(rows):
        if row is None:
            out.append(None)
            continue
        try:
            message = json_format.ParseDict(json_of_row(row, cls.DESCRIPTOR), cls())
        except (json_format.ParseError, TypeError, ValueError) as exc:
            raise InvalidBatch(
                f"row {i} of the batch does not fit the subject's Protobuf message ({exc})"
            ) from None
        out.append(frame(fmt.schema_id, prefix + message.SerializeToString()))
    return out


def _avro_row(value: Any) -> Any:
    """Arrow's Python values as fastavro writes them (maps come as lists of pairs)."""
    if isinstance(value, dict):
        return {k: _avro_row(v) for k, v in value.items()}
    if isinstance(value, list):
        if value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
            return {k: _avro_row(v) for k, v in value}
        return [_avro_row(v) for v in value]
    return value


def _json_row(value: Any, t: Any) -> Any:
    """Arrow's Python value of type `t` as JSON has it: maps (which Arrow gives as lists
    of pairs) as objects."""
    if value is None:
        return None
    if pa.types.is_struct(t):
        return {
            t.field(i).name: _json_row(value.get(t.field(i).name), t.field(i).type)
            for i in range(t.num_fields)
        }
    if pa.types.is_map(t):
        return {str(k): _json_row(v, t.item_type) for k, v in value}
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return [_json_row(v, t.value_type) for v in value]
    return value


def _json(value: Any) -> Any:
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return value.decode("latin-1")
    raise TypeError(f"{type(value).__name__} is not JSON")
