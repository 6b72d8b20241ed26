"""`gen.Kinds`: a Protobuf message with a field of every kind the Spark source maps
(every scalar type, enums of its own file and of an imported one, proto3 `optional`, a
oneof, a nested message with repeated and deeper messages, repeated messages, scalars
and enums, maps with scalar and message values, a `google.protobuf.Timestamp`, an
imported message: a reference), declared third in its file (message indexes [2]). Two
versions: the second adds a field. For the tests of the Spark decoders."""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory, timestamp_pb2

__all__ = ["kinds_class"]

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = (
    ("i32", _F.TYPE_INT32),
    ("i64", _F.TYPE_INT64),
    ("u32", _F.TYPE_UINT32),
    ("u64", _F.TYPE_UINT64),
    ("s32", _F.TYPE_SINT32),
    ("s64", _F.TYPE_SINT64),
    ("f32", _F.TYPE_FIXED32),
    ("f64", _F.TYPE_FIXED64),
    ("sf32", _F.TYPE_SFIXED32),
    ("sf64", _F.TYPE_SFIXED64),
    ("fl", _F.TYPE_FLOAT),
    ("db", _F.TYPE_DOUBLE),
    ("ok", _F.TYPE_BOOL),
    ("s", _F.TYPE_STRING),
    ("raw", _F.TYPE_BYTES),
)


def _common() -> Any:
    common = descriptor_pb2.FileDescriptorProto(name="gen/common.proto", package="gen")
    common.syntax = "proto3"
    money = common.message_type.add(name="Money")
    money.field.add(name="cents", number=1, type=_F.TYPE_INT64, label=_F.LABEL_OPTIONAL)
    money.field.add(name="currency", number=2, type=_F.TYPE_STRING, label=_F.LABEL_OPTIONAL)
    level = common.enum_type.add(name="Level")
    for number, name in enumerate(("LOW", "HIGH", "TOP")):
        level.value.add(name=name, number=number)
    return common


def _add(message: Any, name: str, number: int, kind: int, **more: Any) -> Any:
    return message.field.add(
        name=name, number=number, type=kind, label=more.pop("label", _F.LABEL_OPTIONAL), **more
    )


def _map(message: Any, name: str, number: int, key: int, value: tuple[int, str]) -> None:
    entry = message.nested_type.add(name=name.capitalize() + "Entry")
    entry.options.map_entry = True
    _add(entry, "key", 1, key)
    if value[1]:
        _add(entry, "value", 2, value[0], type_name=value[1])
    else:
        _add(entry, "value", 2, value[0])
    _add(message, name, number, _F.TYPE_MESSAGE, label=_F.LABEL_REPEATED,
         type_name=f".gen.Kinds.{entry.name}")  # fmt: skip


def _kinds_file(version: int) -> Any:
    kinds = descriptor_pb2.FileDescriptorProto(name="gen/kinds.proto", package="gen")
    kinds.syntax = "proto3"
    kinds.dependency.extend(["gen/common.proto", "google/protobuf/timestamp.proto"])
    deep = kinds.message_type.add(name="Deep")
    _add(deep, "d", 1, _F.TYPE_STRING)
    _add(deep, "xs", 2, _F.TYPE_INT32, label=_F.LABEL_REPEATED)
    inner = kinds.message_type.add(name="Inner")
    color = inner.enum_type.add(name="Color")
    color.value.add(name="RED", number=0)
    color.value.add(name="BLUE", number=1)
    _add(inner, "c", 1, _F.TYPE_ENUM, type_name=".gen.Inner.Color")
    _add(inner, "deep", 2, _F.TYPE_MESSAGE, label=_F.LABEL_REPEATED, type_name=".gen.Deep")
    _add(inner, "one", 3, _F.TYPE_MESSAGE, type_name=".gen.Deep")
    m = kinds.message_type.add(name="Kinds")
    for number, (name, kind) in enumerate(_SCALARS, start=1):
        _add(m, name, number, kind)
    _add(m, "level", 16, _F.TYPE_ENUM, type_name=".gen.Level")
    _add(m, "color", 17, _F.TYPE_ENUM, type_name=".gen.Inner.Color")
    m.oneof_decl.add(name="choice")
    m.oneof_decl.add(name="_maybe")  # proto3 `optional`: a synthetic oneof, after the rest
    _add(m, "maybe", 18, _F.TYPE_INT64, oneof_index=1, proto3_optional=True)
    _add(m, "total", 19, _F.TYPE_MESSAGE, type_name=".gen.Money")
    _add(m, "tags", 20, _F.TYPE_STRING, label=_F.LABEL_REPEATED)
    _add(m, "lines", 21, _F.TYPE_MESSAGE, label=_F.LABEL_REPEATED, type_name=".gen.Money")
    _add(m, "levels", 22, _F.TYPE_ENUM, label=_F.LABEL_REPEATED, type_name=".gen.Level")
    _map(m, "counts", 23, _F.TYPE_STRING, (_F.TYPE_INT32, ""))
    _map(m, "prices", 24, _F.TYPE_INT64, (_F.TYPE_MESSAGE, ".gen.Money"))
    _add(m, "inner", 25, _F.TYPE_MESSAGE, type_name=".gen.Inner")
    _add(m, "name", 26, _F.TYPE_STRING, oneof_index=0)
    _add(m, "number", 27, _F.TYPE_INT64, oneof_index=0)
    _add(m, "at", 28, _F.TYPE_MESSAGE, type_name=".google.protobuf.Timestamp")
    _add(m, "ds", 29, _F.TYPE_DOUBLE, label=_F.LABEL_REPEATED)
    _add(m, "stamps", 30, _F.TYPE_MESSAGE, label=_F.LABEL_REPEATED,
         type_name=".google.protobuf.Timestamp")  # fmt: skip
    if version > 1:
        _add(m, "note", 31, _F.TYPE_STRING)
    return kinds


def kinds_class(version: int = 1) -> Any:
    """`gen.Kinds` of `version` (1 or 2), in a descriptor pool of its own."""
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(timestamp_pb2.DESCRIPTOR.serialized_pb)
    pool.Add(_common())
    pool.Add(_kinds_file(version))
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("gen.Kinds"))
