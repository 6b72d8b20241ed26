"""Schemas derived from a Spark struct, for a write (`valueFormat=avro|protobuf|json`)
whose subject has no schema yet. The struct arrives as its Arrow type (the writer's
batches are Arrow); the top-level message or record is named `topLevelRecord`, as Spark's
`to_avro` names it.

* Avro: a record; nullable fields become `["null", T]` with default null; timestamps
  `timestamp-micros`, dates `date`.
* Protobuf (proto3, the serialized form confluent-kafka registers): a message whose
  fields are numbered in the struct's order; nested structs become nested messages
  (named after their field, CamelCase), arrays `repeated`, maps `map<K, V>`, nullable
  scalars proto3 `optional` (so null and zero stay apart), timestamps
  `google.protobuf.Timestamp` (a well-known type: no reference needed). Protobuf has no
  array of arrays, no map of arrays, no null element in a repeated field, and map keys
  are strings, integers or booleans; a struct needing those is refused, naming the field.
* JSON Schema (draft 7): objects with `properties` and `required` (the non-nullable
  fields), nullable fields `["T", "null"]`, integers `integer`, floats `number`,
  timestamps and dates strings with `format` `date-time` / `date`, maps with string keys
  objects with `additionalProperties`. Binary has no JSON type and is refused.

Field names must be identifiers for Protobuf (they are its field names); any name does
for Avro (cleaned) and JSON.
"""

from __future__ import annotations

import base64
import json
import re
from typing import Any, Final, NamedTuple

import pyarrow as pa
from google.protobuf import descriptor_pb2

__all__ = [
    "TOP_RECORD",
    "avro_schema_of_arrow",
    "derived_schema",
    "json_schema_of_arrow",
    "protobuf_schema_of_arrow",
]

#: Spark's `to_avro` names the top record so; the other formats follow it.
TOP_RECORD: Final = "topLevelRecord"

_F = descriptor_pb2.FieldDescriptorProto
_IDENTIFIER: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_TIMESTAMP_FILE: Final = "google/protobuf/timestamp.proto"


def derived_schema(kind: str, struct: Any) -> tuple[str, str]:
    """(schema text as registered, schema type) derived from an Arrow struct type for
    `kind` ("avro", "protobuf" or "json"). ValueError naming a field with no type."""
    if kind == "avro":
        return json.dumps(avro_schema_of_arrow(struct, TOP_RECORD), separators=(",", ":")), "AVRO"
    if kind == "protobuf":
        proto = protobuf_schema_of_arrow(struct, TOP_RECORD)
        return base64.b64encode(proto.SerializeToString()).decode("ascii"), "PROTOBUF"
    return json.dumps(json_schema_of_arrow(struct, TOP_RECORD), separators=(",", ":")), "JSON"


# ---------------------------------------------------------------------------- Avro


def avro_schema_of_arrow(struct: Any, name: str) -> dict[str, Any]:
    """An Avro record schema for an Arrow struct type."""
    fields = []
    for i in range(struct.num_fields):
        f = struct.field(i)
        avro = _avro_of(f.type, f"{name}_{f.name}")
        if f.nullable:
            fields.append({"name": f.name, "type": ["null", avro], "default": None})
        else:
            fields.append({"name": f.name, "type": avro})
    return {"type": "record", "name": _avro_name(name), "fields": fields}


def _avro_name(name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return cleaned if re.match(r"[A-Za-z_]", cleaned) else f"_{cleaned}"


def _avro_of(t: Any, name: str) -> Any:  # noqa: PLR0911 - one branch per Arrow type family
    if pa.types.is_boolean(t):
        return "boolean"
    if pa.types.is_integer(t):
        return "long" if t.bit_width > 32 else "int"
    if pa.types.is_floating(t):
        return "double" if t.bit_width > 32 else "float"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "bytes"
    if pa.types.is_timestamp(t):
        return {"type": "long", "logicalType": "timestamp-micros"}
    if pa.types.is_date32(t):
        return {"type": "int", "logicalType": "date"}
    if pa.types.is_struct(t):
        return avro_schema_of_arrow(t, name)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        item = _avro_of(t.value_type, f"{name}_item")
        return {"type": "array", "items": ["null", item]}
    if pa.types.is_map(t) and (pa.types.is_string(t.key_type)):
        return {"type": "map", "values": ["null", _avro_of(t.item_type, f"{name}_value")]}
    raise ValueError(f"valueFormat=avro cannot derive an Avro type for {t} (field {name})")


# ---------------------------------------------------------------------------- Protobuf


def protobuf_schema_of_arrow(struct: Any, name: str) -> descriptor_pb2.FileDescriptorProto:
    """A proto3 file declaring message `name` for an Arrow struct type (see the module
    docstring). ValueError naming the field that has no Protobuf type."""
    proto = descriptor_pb2.FileDescriptorProto(name=f"{name}.proto", syntax="proto3")
    _message(proto, proto.message_type.add(), struct, name, f".{name}")
    return proto


class _Place(NamedTuple):
    """Where a field's type is declared: the message's full name (leading dot), the
    field's path for errors, the names its scope has taken, a nested message's name."""

    full: str
    where: str
    taken: set[str]
    type_name: str


def _is_list(t: Any) -> bool:
    return bool(pa.types.is_list(t) or pa.types.is_large_list(t))


def _camel(name: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in name.split("_") if p) or "Field"


def _message(
    file: descriptor_pb2.FileDescriptorProto,
    out: descriptor_pb2.DescriptorProto,
    struct: Any,
    name: str,
    full: str,
) -> None:
    out.name = name
    # Field and nested type names share one scope: a nested type must not take a field's.
    taken = {struct.field(i).name for i in range(struct.num_fields)}
    optional: list[descriptor_pb2.FieldDescriptorProto] = []
    for i in range(struct.num_fields):
        f = struct.field(i)
        where = f"{full.lstrip('.')}.{f.name}"
        if not _IDENTIFIER.fullmatch(f.name):
            raise ValueError(
                f"valueFormat=protobuf: field {where!r} is not a Protobuf field name "
                "(letters, digits and _, not starting with a digit); rename it"
            )
        field = out.field.add(name=f.name, number=i + 1, label=_F.LABEL_OPTIONAL)
        if pa.types.is_map(f.type):
            entry = out.nested_type.add(name=_unique(f"{_camel(f.name)}Entry", taken))
            entry.options.map_entry = True
            key = entry.field.add(name="key", number=1, label=_F.LABEL_OPTIONAL)
            _map_key(key, f.type.key_type, where)
            value = entry.field.add(name="value", number=2, label=_F.LABEL_OPTIONAL)
            place = _Place(full, f"{where} (map value)", taken, f"{_camel(f.name)}Value")
            _element(file, out, value, f.type.item_type, place)
            field.label = _F.LABEL_REPEATED
            field.type = _F.TYPE_MESSAGE
            field.type_name = f"{full}.{entry.name}"
        elif _is_list(f.type):
            field.label = _F.LABEL_REPEATED
            place = _Place(full, f"{where} (element)", taken, _camel(f.name))
            _element(file, out, field, f.type.value_type, place)
        else:
            _typed(file, out, field, f.type, _Place(full, where, taken, _camel(f.name)))
            if f.nullable and field.type != _F.TYPE_MESSAGE:
                optional.append(field)
    for field in optional:  # proto3 `optional`: a synthetic oneof each, after the others
        field.proto3_optional = True
        field.oneof_index = len(out.oneof_decl)
        out.oneof_decl.add(name=_unique(f"_{field.name}", taken))


def _unique(name: str, taken: set[str]) -> str:
    while name in taken:
        name += "_"
    taken.add(name)
    return name


def _element(
    file: descriptor_pb2.FileDescriptorProto,
    out: descriptor_pb2.DescriptorProto,
    field: descriptor_pb2.FieldDescriptorProto,
    t: Any,
    place: _Place,
) -> None:
    """An array's element or a map's value: no arrays or maps inside (Protobuf has none)."""
    if _is_list(t) or pa.types.is_map(t):
        raise ValueError(
            f"valueFormat=protobuf: {place.where} is {t}: Protobuf has no array or map directly "
            "inside an array or a map (wrap it in a struct)"
        )
    _typed(file, out, field, t, place)


_PROTO_SCALARS: Final = (
    (pa.types.is_boolean, _F.TYPE_BOOL),
    (lambda t: pa.types.is_integer(t) and t.bit_width > 32, _F.TYPE_INT64),
    (pa.types.is_integer, _F.TYPE_INT32),
    (lambda t: pa.types.is_floating(t) and t.bit_width > 32, _F.TYPE_DOUBLE),
    (pa.types.is_floating, _F.TYPE_FLOAT),
    (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), _F.TYPE_STRING),
    (lambda t: pa.types.is_binary(t) or pa.types.is_large_binary(t), _F.TYPE_BYTES),
)


def _typed(
    file: descriptor_pb2.FileDescriptorProto,
    out: descriptor_pb2.DescriptorProto,
    field: descriptor_pb2.FieldDescriptorProto,
    t: Any,
    place: _Place,
) -> None:
    for test, proto_type in _PROTO_SCALARS:
        if test(t):
            field.type = proto_type
            return
    if pa.types.is_timestamp(t):
        field.type = _F.TYPE_MESSAGE
        field.type_name = ".google.protobuf.Timestamp"
        if _TIMESTAMP_FILE not in file.dependency:
            file.dependency.append(_TIMESTAMP_FILE)
        return
    if pa.types.is_struct(t):
        name = _unique(place.type_name, place.taken)
        _message(file, out.nested_type.add(), t, name, f"{place.full}.{name}")
        field.type = _F.TYPE_MESSAGE
        field.type_name = f"{place.full}.{name}"
        return
    raise ValueError(
        f"valueFormat=protobuf cannot derive a Protobuf type for {t} (field {place.where}); "
        "cast it to a supported type (boolean, integers, floats, string, binary, timestamp, "
        "struct, array, map)"
    )


def _map_key(field: descriptor_pb2.FieldDescriptorProto, t: Any, where: str) -> None:
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        field.type = _F.TYPE_STRING
    elif pa.types.is_integer(t):
        field.type = _F.TYPE_INT64 if t.bit_width > 32 else _F.TYPE_INT32
    elif pa.types.is_boolean(t):
        field.type = _F.TYPE_BOOL
    else:
        raise ValueError(
            f"valueFormat=protobuf: map field {where} has {t} keys; Protobuf map keys are "
            "strings, integers or booleans"
        )


# ---------------------------------------------------------------------------- JSON Schema


def json_schema_of_arrow(struct: Any, name: str) -> dict[str, Any]:
    """A JSON Schema (draft 7) for an Arrow struct type, titled `name` (see the module
    docstring). ValueError naming the field that has no JSON type."""
    return {
        "$schema": "http://json-schema.org/draft-07/schema#",
        "title": name,
        **_json_of(struct, name),
    }


def _nullable(schema: dict[str, Any], nullable: bool) -> dict[str, Any]:
    if not nullable:
        return schema
    return {**schema, "type": [schema["type"], "null"]}


def _json_of(t: Any, where: str) -> dict[str, Any]:  # noqa: PLR0911 - one branch per type family
    if pa.types.is_boolean(t):
        return {"type": "boolean"}
    if pa.types.is_integer(t):
        return {"type": "integer"}
    if pa.types.is_floating(t):
        return {"type": "number"}
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return {"type": "string"}
    if pa.types.is_timestamp(t):
        return {"type": "string", "format": "date-time"}
    if pa.types.is_date32(t):
        return {"type": "string", "format": "date"}
    if pa.types.is_struct(t):
        properties = {}
        for i in range(t.num_fields):
            f = t.field(i)
            properties[f.name] = _nullable(_json_of(f.type, f"{where}.{f.name}"), f.nullable)
        required = [t.field(i).name for i in range(t.num_fields) if not t.field(i).nullable]
        out: dict[str, Any] = {"type": "object", "properties": properties}
        if required:
            out["required"] = required
        return out
    if _is_list(t):
        item = t.value_field
        return {
            "type": "array",
            "items": _nullable(_json_of(item.type, f"{where}[]"), item.nullable),
        }
    if pa.types.is_map(t) and (
        pa.types.is_string(t.key_type) or pa.types.is_large_string(t.key_type)
    ):
        item = t.item_field
        values = _nullable(_json_of(item.type, f"{where}{{}}"), item.nullable)
        return {"type": "object", "additionalProperties": values}
    raise ValueError(
        f"valueFormat=json cannot derive a JSON Schema type for {t} (field {where}); cast it "
        "to a supported type (boolean, integers, floats, string, timestamp, date, struct, "
        "array, map with string keys)"
    )
