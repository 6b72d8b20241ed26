"""The `.proto` text form of a Protobuf schema, as a `FileDescriptorProto`.

Parsed by `proto-schema-parser` (an ANTLR grammar of proto2 and proto3), then laid out as
protoc would: packages, imports, messages (nested), enums, fields with their labels
(proto3 `optional` as a synthetic oneof), oneofs, and map fields as repeated nested
`<Name>Entry` messages. Type names are resolved by Protobuf's scoping rules, innermost
scope first, against the file's own messages and enums and those of the files it imports
(the schema's references); a name none declares is taken as a message of that full name.
Options are not kept: they change neither the wire format nor compatibility.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

from google.protobuf import descriptor_pb2
from proto_schema_parser import ast
from proto_schema_parser.parser import Parser

__all__ = ["parse_proto_text"]

F = descriptor_pb2.FieldDescriptorProto
_SCALARS: Final[dict[str, int]] = {
    "double": F.TYPE_DOUBLE,
    "float": F.TYPE_FLOAT,
    "int64": F.TYPE_INT64,
    "uint64": F.TYPE_UINT64,
    "int32": F.TYPE_INT32,
    "fixed64": F.TYPE_FIXED64,
    "fixed32": F.TYPE_FIXED32,
    "bool": F.TYPE_BOOL,
    "string": F.TYPE_STRING,
    "bytes": F.TYPE_BYTES,
    "uint32": F.TYPE_UINT32,
    "sfixed32": F.TYPE_SFIXED32,
    "sfixed64": F.TYPE_SFIXED64,
    "sint32": F.TYPE_SINT32,
    "sint64": F.TYPE_SINT64,
}
_LABELS: Final = {
    "REPEATED": F.LABEL_REPEATED,
    "OPTIONAL": F.LABEL_OPTIONAL,
    "REQUIRED": F.LABEL_REQUIRED,
}


def parse_proto_text(
    text: str, imported: tuple[descriptor_pb2.FileDescriptorProto, ...] = ()
) -> descriptor_pb2.FileDescriptorProto:
    """The descriptor of a `.proto` file's text; ValueError saying what is wrong.
    `imported`: the files it imports (its references), whose types its names may use."""
    try:
        tree = Parser().parse(text)
    except Exception as exc:  # the grammar's errors carry no common base
        raise ValueError(f"the .proto text does not parse: {exc}") from None
    proto = descriptor_pb2.FileDescriptorProto(name="schema.proto")
    proto.syntax = tree.syntax or "proto2"
    for element in tree.file_elements:
        if isinstance(element, ast.Package):
            proto.package = element.name
        elif isinstance(element, ast.Import):
            proto.dependency.append(element.name)
    scope = f".{proto.package}" if proto.package else ""
    declared = dict(_imported_declarations(imported))
    declared.update(_declared(tree.file_elements, scope))
    for element in tree.file_elements:
        if isinstance(element, ast.Message):
            _message(proto.message_type.add(), element, scope, declared, proto.syntax)
        elif isinstance(element, ast.Enum):
            _enum(proto.enum_type.add(), element)
    return proto


def _declared(elements: list[Any], scope: str) -> Iterator[tuple[str, int]]:
    """(full name with a leading dot, TYPE_MESSAGE or TYPE_ENUM) of every declaration."""
    for e in elements:
        if isinstance(e, ast.Message):
            name = f"{scope}.{e.name}"
            yield name, F.TYPE_MESSAGE
            yield from _declared(e.elements, name)
        elif isinstance(e, ast.Enum):
            yield f"{scope}.{e.name}", F.TYPE_ENUM


def _imported_declarations(
    files: tuple[descriptor_pb2.FileDescriptorProto, ...],
) -> Iterator[tuple[str, int]]:
    """(full name with a leading dot, kind) of every message and enum `files` declare."""

    def walk(scope: str, messages: Any, enums: Any) -> Iterator[tuple[str, int]]:
        for e in enums:
            yield f"{scope}.{e.name}", F.TYPE_ENUM
        for m in messages:
            yield f"{scope}.{m.name}", F.TYPE_MESSAGE
            yield from walk(f"{scope}.{m.name}", m.nested_type, m.enum_type)

    for file in files:
        yield from walk(
            f".{file.package}" if file.package else "", file.message_type, file.enum_type
        )


def _resolve(name: str, scope: str, declared: dict[str, int]) -> tuple[str, int]:
    if name.startswith("."):
        return name, declared.get(name, F.TYPE_MESSAGE)
    parts = scope.split(".")
    while True:
        candidate = ".".join([*parts, name])
        if not candidate.startswith("."):
            candidate = "." + candidate
        if candidate in declared:
            return candidate, declared[candidate]
        if len(parts) <= 1:
            return "." + name, F.TYPE_MESSAGE  # an imported type
        parts.pop()


def _enum(out: descriptor_pb2.EnumDescriptorProto, enum: Any) -> None:
    out.name = enum.name
    for v in enum.elements:
        if isinstance(v, ast.EnumValue):
            out.value.add(name=v.name, number=v.number)


def _message(out: descriptor_pb2.DescriptorProto, msg: Any, scope: str, declared: dict[str, int],
             syntax: str) -> None:  # fmt: skip
    out.name = msg.name
    here = f"{scope}.{msg.name}"
    synthetic: list[F] = []  # proto3 `optional` fields: their oneofs go last, as protoc's
    for e in msg.elements:
        if isinstance(e, ast.Field):
            field = _field(out, e, here, declared)
            if syntax == "proto3" and field.label == F.LABEL_OPTIONAL and _optional(e):
                synthetic.append(field)
        elif isinstance(e, ast.MapField):
            _map_field(out, e, here, declared)
        elif isinstance(e, ast.OneOf):
            index = len(out.oneof_decl)
            out.oneof_decl.add(name=e.name)
            for f in e.elements:
                if isinstance(f, ast.Field):
                    _field(out, f, here, declared).oneof_index = index
        elif isinstance(e, ast.Message):
            _message(out.nested_type.add(), e, here, declared, syntax)
        elif isinstance(e, ast.Enum):
            _enum(out.enum_type.add(), e)
    for field in synthetic:
        field.proto3_optional = True
        field.oneof_index = len(out.oneof_decl)
        out.oneof_decl.add(name=f"_{field.name}")


def _optional(f: Any) -> bool:
    return f.cardinality is not None and f.cardinality.value == "OPTIONAL"


def _typed(field: F, type_name: str, scope: str, declared: dict[str, int]) -> None:
    scalar = _SCALARS.get(type_name)
    if scalar is not None:
        field.type = scalar  # type: ignore[assignment]
        return
    full, kind = _resolve(type_name, scope, declared)
    field.type = kind  # type: ignore[assignment]
    field.type_name = full


def _field(out: descriptor_pb2.DescriptorProto, f: Any, scope: str,
           declared: dict[str, int]) -> F:  # fmt: skip
    field = out.field.add(name=f.name, number=f.number)
    cardinality = f.cardinality.value if f.cardinality is not None else None
    field.label = _LABELS.get(cardinality or "", F.LABEL_OPTIONAL)
    _typed(field, f.type, scope, declared)
    return field


def _map_field(out: descriptor_pb2.DescriptorProto, f: Any, scope: str,
               declared: dict[str, int]) -> None:  # fmt: skip
    entry_name = "".join(p[:1].upper() + p[1:] for p in f.name.split("_")) + "Entry"
    entry = out.nested_type.add(name=entry_name)
    entry.options.map_entry = True
    key = entry.field.add(name="key", number=1, label=F.LABEL_OPTIONAL)
    _typed(key, f.key_type, scope, declared)
    value = entry.field.add(name="value", number=2, label=F.LABEL_OPTIONAL)
    _typed(value, f.value_type, scope, declared)
    field = out.field.add(name=f.name, number=f.number, label=F.LABEL_REPEATED)
    field.type = F.TYPE_MESSAGE
    field.type_name = f"{scope}.{entry_name}"
