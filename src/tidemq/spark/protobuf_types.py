"""`valueFormat=protobuf`: a Protobuf message type as a Spark struct, and messages as the
Python values Arrow builds that struct from. No pyspark here (Spark's JSON form of types).

Types: 32-bit ints -> integer, 64-bit ints -> long (unsigned 64-bit too: values past 2^63
fail the task), float, double, bool, string, bytes -> binary, enums -> string (the value's
name), `google.protobuf.Timestamp` -> timestamp (as Spark's `from_protobuf` reads it),
messages -> structs (null when unset; so are proto3 `optional` fields and oneof members),
repeated -> arrays, maps -> maps. Recursive message types have no Spark type and are
refused when the query starts.
"""

from __future__ import annotations

import base64
import datetime as dt
from typing import Any, Final

from google.protobuf.descriptor import FieldDescriptor

__all__ = [
    "TIMESTAMP",
    "is_map",
    "is_repeated",
    "json_of_row",
    "protobuf_row",
    "python_value",
    "spark_json_of_message",
]

_F = FieldDescriptor
#: Read as a Spark timestamp, as Spark's own `from_protobuf` reads it.
TIMESTAMP: Final = "google.protobuf.Timestamp"
_SCALARS: Final[dict[int, str]] = {
    _F.TYPE_DOUBLE: "double",
    _F.TYPE_FLOAT: "float",
    _F.TYPE_INT64: "long",
    _F.TYPE_UINT64: "long",
    _F.TYPE_SINT64: "long",
    _F.TYPE_FIXED64: "long",
    _F.TYPE_SFIXED64: "long",
    _F.TYPE_INT32: "integer",
    _F.TYPE_UINT32: "long",
    _F.TYPE_SINT32: "integer",
    _F.TYPE_FIXED32: "long",
    _F.TYPE_SFIXED32: "integer",
    _F.TYPE_BOOL: "boolean",
    _F.TYPE_STRING: "string",
    _F.TYPE_BYTES: "binary",
    _F.TYPE_ENUM: "string",
}


def is_map(field: Any) -> bool:
    return (
        field.type == _F.TYPE_MESSAGE
        and field.message_type is not None
        and field.message_type.GetOptions().map_entry
    )


def is_repeated(field: Any) -> bool:
    # `is_repeated` (protobuf >= 5); older runtimes have only `label`.
    repeated = getattr(field, "is_repeated", None)
    if repeated is None:
        return bool(field.label == _F.LABEL_REPEATED)
    return bool(repeated)


def spark_json_of_message(descriptor: Any, seen: tuple[str, ...] = ()) -> dict[str, Any]:
    """The Spark type (JSON form) of a message `Descriptor`."""
    if descriptor.full_name in seen:
        raise ValueError(f"message {descriptor.full_name} is recursive: no Spark type")
    seen = (*seen, descriptor.full_name)
    return {
        "type": "struct",
        "fields": [
            {"name": f.name, "type": _field_type(f, seen), "nullable": True, "metadata": {}}
            for f in descriptor.fields
        ],
    }


def _field_type(field: Any, seen: tuple[str, ...]) -> Any:
    if is_map(field):
        entry = field.message_type
        return {
            "type": "map",
            "keyType": _value_type(entry.fields_by_name["key"], seen),
            "valueType": _value_type(entry.fields_by_name["value"], seen),
            "valueContainsNull": True,
        }
    element = _value_type(field, seen)
    if is_repeated(field):
        return {"type": "array", "elementType": element, "containsNull": True}
    return element


def _value_type(field: Any, seen: tuple[str, ...]) -> Any:
    if field.type == _F.TYPE_MESSAGE and field.message_type.full_name == TIMESTAMP:
        return "timestamp"
    if field.type in (_F.TYPE_MESSAGE, _F.TYPE_GROUP):
        return spark_json_of_message(field.message_type, seen)
    return _SCALARS[field.type]


def protobuf_row(message: Any) -> dict[str, Any]:
    """A message as the Python values of its struct (see the module docstring)."""
    out: dict[str, Any] = {}
    for f in message.DESCRIPTOR.fields:
        value = getattr(message, f.name)
        if is_map(f):
            value_field = f.message_type.fields_by_name["value"]
            out[f.name] = [(k, python_value(value_field, v)) for k, v in value.items()]
        elif is_repeated(f):
            out[f.name] = [python_value(f, v) for v in value]
        elif f.type == _F.TYPE_MESSAGE or f.has_presence:
            # Fields with presence (messages, proto3 `optional`, oneof members): null unset.
            out[f.name] = python_value(f, value) if message.HasField(f.name) else None
        else:
            out[f.name] = python_value(f, value)
    return out


def python_value(field: Any, value: Any) -> Any:
    """One value of `field` (an element, for repeated fields) as `protobuf_row` gives it."""
    if field.type == _F.TYPE_ENUM:
        found = field.enum_type.values_by_number.get(value)
        return found.name if found is not None else str(value)
    if field.type == _F.TYPE_MESSAGE:
        if field.message_type.full_name == TIMESTAMP:
            return value.ToDatetime(tzinfo=dt.UTC)
        return protobuf_row(value)
    return value


def json_of_row(row: dict[str, Any], descriptor: Any) -> dict[str, Any]:
    """A struct row in the JSON form `json_format.ParseDict` takes for the message
    `descriptor` (the writer's side of `protobuf_row`). ValueError for a struct field
    the message does not have."""
    unknown = sorted(set(row) - set(descriptor.fields_by_name))
    if unknown:
        raise ValueError(f"{descriptor.full_name} has no field {', '.join(unknown)}")
    out: dict[str, Any] = {}
    for f in descriptor.fields:
        value = row.get(f.name)
        if value is None:
            continue
        if is_map(f):
            entries = value.items() if isinstance(value, dict) else value
            value_field = f.message_type.fields_by_name["value"]
            out[f.name] = {str(k): _json_value(value_field, v) for k, v in entries}
        elif is_repeated(f):
            out[f.name] = [_json_value(f, v) for v in value]
        else:
            out[f.name] = _json_value(f, value)
    return out


def _json_value(field: Any, value: Any) -> Any:
    if field.type == _F.TYPE_MESSAGE and isinstance(value, dict):
        return json_of_row(value, field.message_type)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, dt.datetime):
        utc = value if value.tzinfo else value.replace(tzinfo=dt.UTC)
        return utc.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
    if isinstance(value, dt.date):
        return value.isoformat()
    return value
