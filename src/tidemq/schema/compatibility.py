"""Compatibility of a new schema with a subject's earlier versions, by Confluent's modes.

BACKWARD: consumers using the new schema can read data written with the previous one
(reader = new, writer = old); FORWARD: consumers of the previous schema can read data
written with the new one (reader = old, writer = new); FULL: both. The `_TRANSITIVE`
modes check every earlier version, the others the latest only; NONE checks nothing.

Avro uses the `avro` package's reader/writer checker (Avro's schema resolution rules).
Protobuf: `protobuf_schema.protobuf_problems` (Confluent's Protobuf rules).
JSON Schema has no library checker; ours (`_json_problems`) applies the rules below to
the reader and writer schemas, recursively, naming the path of each problem:

* the reader's type must accept every type the writer's allows (integer fits number);
* a property the reader requires must be required by the writer too;
* a property the writer has and the reader lacks is fine in an open reader (no
  `additionalProperties: false`), an error in a closed one;
* enums, string lengths, numeric bounds and array items: the reader must accept all the
  writer allows (a narrowed range or a removed enum value is an error).
"""

from __future__ import annotations

import json
from typing import Any

import avro.compatibility
import avro.errors
import avro.name
import avro.schema

from tidemq.schema.formats import ParsedSchema
from tidemq.schema.model import Compatibility, SchemaType
from tidemq.schema.protobuf_schema import protobuf_problems

__all__ = ["compatibility_problems"]

#: Problems reported per check (the first ones say enough).
_MAX_PROBLEMS = 10


def compatibility_problems(
    level: Compatibility, new: ParsedSchema, earlier: list[ParsedSchema]
) -> list[str]:
    """Why `new` is incompatible with `earlier` (oldest first) under `level`; [] when it
    is compatible."""
    if level is Compatibility.NONE or not earlier:
        return []
    against = earlier if level.transitive else earlier[-1:]
    problems: list[str] = []
    for i, old in enumerate(reversed(against)):
        name = "the latest version" if i == 0 else f"the version {i} before the latest"
        if old.schema_type is not new.schema_type:
            problems.append(
                f"schema type {new.schema_type.value} differs from {old.schema_type.value} "
                f"of {name}"
            )
            continue
        if level.backward:
            problems += [f"{p} (new schema reading data of {name})" for p in _check(new, old)]
        if level.forward:
            problems += [f"{p} ({name} reading data of the new schema)" for p in _check(old, new)]
    return problems[:_MAX_PROBLEMS]


def _check(reader: ParsedSchema, writer: ParsedSchema) -> list[str]:
    if reader.schema_type is SchemaType.AVRO:
        return _avro_problems(reader, writer)
    if reader.schema_type is SchemaType.PROTOBUF:
        return protobuf_problems(reader.document, writer.document)
    return _json_problems(reader.document, writer.document, "#")


def _avro(parsed: ParsedSchema) -> avro.schema.Schema:
    names = avro.name.Names()
    for document in parsed.referenced:
        avro.schema.make_avsc_object(document, names)
    return avro.schema.make_avsc_object(parsed.document, names)


def _avro_problems(reader: ParsedSchema, writer: ParsedSchema) -> list[str]:
    try:
        checker = avro.compatibility.ReaderWriterCompatibilityChecker()  # type: ignore[no-untyped-call]
        result = checker.get_compatibility(_avro(reader), _avro(writer))
    except (avro.errors.AvroException, ValueError, TypeError) as exc:
        return [f"the schemas cannot be compared: {exc}"]
    if result.compatibility is avro.compatibility.SchemaCompatibilityType.compatible:
        return []
    # The checker reports sets of names and locations for all its findings together.
    kinds = sorted({k.value.replace("_", " ") for k in result.incompatibilities})
    names = ", ".join(sorted(str(m) for m in result.messages))
    where = ", ".join(
        _field_at(reader.document, str(loc)) for loc in sorted(result.locations, key=str)
    )
    text = f"{'; '.join(kinds)} at {where}"
    return [text if "field '" in where or not names else f"{text}: {names}"]


def _field_at(document: Any, location: str) -> str:
    """A checker location (/fields/0/type) with the field it points at: "field 'id'
    (/fields/0/type)"."""
    node, names = document, []
    for part in location.strip("/").split("/"):
        if isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
            if isinstance(node, dict) and "name" in node:
                names.append(str(node["name"]))
        elif isinstance(node, dict):
            node = node.get(part)
        else:
            break
    return f"field '{'.'.join(names)}' ({location})" if names else location


# --------------------------------------------------------------------------- JSON Schema

_NUMERIC = {"integer", "number"}


def _types(schema: Any) -> set[str] | None:
    """The types a schema allows (None: any)."""
    if schema is True or schema == {}:
        return None
    if schema is False:
        return set()
    declared = schema.get("type")
    if declared is None:
        return None
    return {declared} if isinstance(declared, str) else set(declared)


def _json_problems(reader: Any, writer: Any, path: str) -> list[str]:
    if reader is True or reader == {}:
        return []
    if reader is False:
        return [] if writer is False else [f"{path}: the new reader accepts nothing"]
    if not isinstance(reader, dict) or not isinstance(writer, dict):
        return []
    problems = _type_problems(reader, writer, path)
    problems += _range_problems(reader, writer, path)
    if "enum" in reader:
        missing = [v for v in writer.get("enum", []) if v not in reader["enum"]]
        if "enum" not in writer:
            problems.append(f"{path}: enum added (the writer allows any value)")
        elif missing:
            problems.append(f"{path}: enum values {_show(missing)} removed")
    problems += _object_problems(reader, writer, path)
    if isinstance(reader.get("items"), dict) and isinstance(writer.get("items"), dict):
        problems += _json_problems(reader["items"], writer["items"], f"{path}/items")
    return problems


def _type_problems(reader: dict[str, Any], writer: dict[str, Any], path: str) -> list[str]:
    read, written = _types(reader), _types(writer)
    if read is None:
        return []
    if written is None:
        return [f"{path}: type narrowed to {_show(sorted(read))} (the writer allows any)"]
    accepted = read | ({"integer"} if "number" in read else set())
    lost = sorted(written - accepted)
    return [f"{path}: type {_show(lost)} no longer accepted"] if lost else []


_LOWER = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
_UPPER = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")


def _range_problems(reader: dict[str, Any], writer: dict[str, Any], path: str) -> list[str]:
    problems = []
    for key in _LOWER:
        if key in reader and (key not in writer or reader[key] > writer[key]):
            problems.append(f"{path}: {key} raised to {reader[key]}")
    for key in _UPPER:
        if key in reader and (key not in writer or reader[key] < writer[key]):
            problems.append(f"{path}: {key} lowered to {reader[key]}")
    return problems


def _object_problems(reader: dict[str, Any], writer: dict[str, Any], path: str) -> list[str]:
    problems = []
    read_props: dict[str, Any] = reader.get("properties", {})
    written_props: dict[str, Any] = writer.get("properties", {})
    written_required = set(writer.get("required", []))
    for name in sorted(set(reader.get("required", [])) - written_required):
        problems.append(f"{path}/properties/{name}: required property added")
    closed = reader.get("additionalProperties") is False
    for name, schema in sorted(written_props.items()):
        if name in read_props:
            problems += _json_problems(read_props[name], schema, f"{path}/properties/{name}")
        elif closed:
            problems.append(f"{path}/properties/{name}: property removed from a closed object")
    return problems


def _show(value: Any) -> str:
    return json.dumps(value)
