"""Protobuf schemas in the registry: parsing the serialized form, identity, and
compatibility by Confluent's rules.

A Protobuf schema is registered in either form Confluent takes: serialized (a
`FileDescriptorProto`, base64 encoded: what confluent-kafka's Python serializer sends, and
asks back for with `?format=serialized`) or the `.proto` text (what Confluent's Java
tools send; `protobuf_text`). Its imports are references (each a registered subject).

Identity: the descriptor serialized deterministically without what does not change the
schema (the file name, which the Python client renames; `json_name`, which protoc fills
in; options but `map_entry`; source info), so the same messages registered twice, in
either form, get one id.

Compatibility (`protobuf_problems`, reader against writer), after Confluent's Protobuf
rules: the package must not change; a writer's message must still exist in the reader;
for every field number both have: the same kind of type (scalars in one wire-compatible
group: int32/uint32/int64/uint64/bool, sint32/sint64, fixed32/sfixed32, fixed64/sfixed64,
string/bytes; messages and enums by name), the same repeated-ness, and the same oneof
membership; a field the reader requires (proto2 `required`) must be in the writer.
Fields added or removed otherwise are compatible (unknown fields are skipped).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterator
from typing import Final

from google.protobuf import descriptor_pb2
from google.protobuf.message import DecodeError

from tidemq.schema.protobuf_text import parse_proto_text

__all__ = ["parse_protobuf", "protobuf_identity", "protobuf_problems", "serialized"]

FileProto = descriptor_pb2.FileDescriptorProto
MessageProto = descriptor_pb2.DescriptorProto
FieldProto = descriptor_pb2.FieldDescriptorProto

_T = FieldProto.Type
#: Scalar types whose values read as one another on the wire.
_GROUPS: Final = (
    {_T.TYPE_INT32, _T.TYPE_UINT32, _T.TYPE_INT64, _T.TYPE_UINT64, _T.TYPE_BOOL},
    {_T.TYPE_SINT32, _T.TYPE_SINT64},
    {_T.TYPE_FIXED32, _T.TYPE_SFIXED32},
    {_T.TYPE_FIXED64, _T.TYPE_SFIXED64},
    {_T.TYPE_STRING, _T.TYPE_BYTES},
)
#: Field numbers Protobuf reserves for itself.
_RESERVED_NUMBERS: Final = range(19000, 20000)
_MAX_FIELD_NUMBER: Final = (1 << 29) - 1


def parse_protobuf(text: str, imported: tuple[FileProto, ...] = ()) -> FileProto:
    """The descriptor of a serialized Protobuf schema; ValueError saying what is wrong.
    `imported`: the files the schema's references name (their types resolve the text
    form's names)."""
    stripped = text.strip()
    try:
        raw = base64.b64decode(stripped, validate=True)
    except (binascii.Error, ValueError):
        raw = None
    if raw is None or "message " in stripped or "syntax" in stripped:
        proto = parse_proto_text(text, imported)
    else:
        proto = FileProto()
        try:
            proto.ParseFromString(raw)
        except DecodeError as exc:
            raise ValueError(f"not a serialized FileDescriptorProto: {exc}") from None
    if not proto.message_type and not proto.enum_type:
        raise ValueError("the Protobuf schema declares no message and no enum")
    for name, message in _messages(proto):
        _check_message(name, message)
    return proto


def _check_message(name: str, message: MessageProto) -> None:
    numbers: set[int] = set()
    names: set[str] = set()
    for f in message.field:
        if not f.name or f.name in names:
            raise ValueError(f"message {name}: field name {f.name!r} is empty or repeated")
        if not 0 < f.number <= _MAX_FIELD_NUMBER or f.number in _RESERVED_NUMBERS:
            raise ValueError(f"message {name}: field {f.name} has an invalid number {f.number}")
        if f.number in numbers:
            raise ValueError(f"message {name}: field number {f.number} is used twice")
        numbers.add(f.number)
        names.add(f.name)


def protobuf_identity(proto: FileProto) -> str:
    copy = FileProto()
    copy.CopyFrom(proto)
    for name in ("name", "options", "source_code_info"):
        copy.ClearField(name)
    if copy.syntax == "proto2":
        copy.ClearField("syntax")  # protoc leaves it unset for proto2
    for _, message in _messages(copy):
        map_entry = message.options.map_entry
        message.ClearField("options")
        if map_entry:
            message.options.map_entry = True
        for f in message.field:
            f.ClearField("json_name")
            f.ClearField("options")
    return base64.b64encode(copy.SerializeToString(deterministic=True)).decode()


def serialized(proto: FileProto) -> str:
    """The serialized form (base64) of a schema, as `?format=serialized` answers it."""
    return base64.b64encode(proto.SerializeToString()).decode("ascii")


def _messages(proto: FileProto) -> Iterator[tuple[str, MessageProto]]:
    """(full name, message) of every message of the file, nested ones included."""
    prefix = f"{proto.package}." if proto.package else ""

    def walk(scope: str, messages: list[MessageProto]) -> Iterator[tuple[str, MessageProto]]:
        for m in messages:
            name = f"{scope}{m.name}"
            yield name, m
            yield from walk(f"{name}.", list(m.nested_type))

    yield from walk(prefix, list(proto.message_type))


def protobuf_problems(reader: FileProto, writer: FileProto) -> list[str]:
    """Why data written with `writer` may not be read with `reader` ([] when it may)."""
    problems: list[str] = []
    if reader.package != writer.package:
        problems.append(f"package changed from {writer.package!r} to {reader.package!r}")
    readers = dict(_messages(reader))
    for name, old in _messages(writer):
        new = readers.get(name)
        if new is None:
            if not old.options.map_entry:
                problems.append(f"message {name} was removed")
            continue
        problems += _field_problems(name, new, old)
    return problems


def _field_problems(name: str, reader: MessageProto, writer: MessageProto) -> list[str]:
    problems = []
    written = {f.number: f for f in writer.field}
    for f in reader.field:
        old = written.get(f.number)
        where = f"field {f.number} ({f.name}) of {name}"
        if old is None:
            if f.label == FieldProto.LABEL_REQUIRED:
                problems.append(f"required {where} was added")
            continue
        if not _same_kind(f, old):
            problems.append(f"{where} changed type from {_type(old)} to {_type(f)}")
        if (f.label == FieldProto.LABEL_REPEATED) != (old.label == FieldProto.LABEL_REPEATED):
            problems.append(f"{where} changed between repeated and singular")
        if _oneof(reader, f) != _oneof(writer, old):
            problems.append(f"{where} moved into or out of a oneof")
    return problems


def _same_kind(a: FieldProto, b: FieldProto) -> bool:
    if a.type == b.type:
        if a.type in (_T.TYPE_MESSAGE, _T.TYPE_ENUM, _T.TYPE_GROUP):
            return a.type_name.lstrip(".") == b.type_name.lstrip(".")
        return True
    return any(a.type in g and b.type in g for g in _GROUPS)


def _type(f: FieldProto) -> str:
    if f.type in (_T.TYPE_MESSAGE, _T.TYPE_ENUM):
        return f.type_name.lstrip(".")
    return str(FieldProto.Type.Name(f.type)).removeprefix("TYPE_").lower()


def _oneof(message: MessageProto, f: FieldProto) -> str | None:
    """The oneof a field belongs to (proto3 `optional`'s synthetic oneof counts as none)."""
    if not f.HasField("oneof_index") or f.proto3_optional:
        return None
    return message.oneof_decl[f.oneof_index].name
