"""Parsing a schema of each type: checked, in the form the registry stores and returns,
and with the identity two registrations of "the same schema" share.

AVRO: parsed by fastavro (named types of referenced schemas resolved first); stored as
compact JSON in the order given; identity: the JSON with keys sorted. JSON: checked
against its declared (or the latest) JSON Schema metaschema by `jsonschema`; stored and
identified the same way. PROTOBUF: the serialized form (a base64 FileDescriptorProto,
`protobuf_schema`); stored as given; identity: the descriptor without its file name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import fastavro.schema
import jsonschema
import jsonschema.exceptions
import jsonschema.validators

from tidemq.schema.model import ErrorCode, Reference, RegistryError, SchemaType
from tidemq.schema.protobuf_schema import parse_protobuf, protobuf_identity, serialized

__all__ = ["ParsedSchema", "parse_schema"]


@dataclass(frozen=True, slots=True)
class ParsedSchema:
    schema_type: SchemaType
    #: As stored and returned: compact JSON, the writer's key order.
    text: str
    #: Two registrations are the same schema when type, identity and references match.
    identity: str
    references: tuple[Reference, ...]
    #: The parsed JSON document.
    document: Any
    #: Referenced schemas' documents, in dependency order (Avro named types first); for
    #: Protobuf, (file name, serialized schema) of every file it imports, recursively, each
    #: after its own imports (what `protobuf_serde.message_class` takes as `imports`).
    referenced: tuple[Any, ...] = ()


def _invalid(message: str) -> RegistryError:
    return RegistryError(ErrorCode.INVALID_SCHEMA, message)


def _load_json(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise _invalid(f"{what} is not valid JSON: {exc}") from None


def parse_schema(
    schema_type: SchemaType,
    text: str,
    references: tuple[Reference, ...] = (),
    referenced: tuple[ParsedSchema, ...] = (),
) -> ParsedSchema:
    """Check `text` as a schema of `schema_type`; `referenced` are the parsed schemas its
    `references` name, in order. RegistryError (42201, invalid schema) says what is
    wrong."""
    if not isinstance(text, str) or not text.strip():
        raise _invalid("the schema is empty")
    if schema_type is SchemaType.PROTOBUF:
        try:
            imported = tuple(r.document for r in referenced if r.schema_type is schema_type)
            proto = parse_protobuf(text, imported)
        except ValueError as exc:
            raise _invalid(f"invalid Protobuf schema: {exc}") from None
        return ParsedSchema(
            schema_type=schema_type,
            text=text.strip(),
            identity=protobuf_identity(proto),
            references=references,
            document=proto,
            referenced=_protobuf_imports(references, referenced),
        )
    document = _load_json(text, f"the {schema_type.value} schema")
    if schema_type is SchemaType.AVRO:
        _check_avro(document, referenced)
    else:
        _check_json_schema(document)
    return ParsedSchema(
        schema_type=schema_type,
        text=json.dumps(document, separators=(",", ":")),
        identity=json.dumps(document, separators=(",", ":"), sort_keys=True),
        references=references,
        document=document,
        referenced=tuple(r.document for r in referenced),
    )


def _protobuf_imports(
    references: tuple[Reference, ...], referenced: tuple[ParsedSchema, ...]
) -> tuple[tuple[str, str], ...]:
    found: dict[str, str] = {}
    for ref, schema in zip(references, referenced, strict=False):
        if schema.schema_type is SchemaType.PROTOBUF:
            found.update((name, text) for name, text in schema.referenced if name not in found)
            found.setdefault(ref.name, serialized(schema.document))
    return tuple(found.items())


def _check_avro(document: Any, referenced: tuple[ParsedSchema, ...]) -> None:
    named: dict[str, Any] = {}
    try:
        for ref in referenced:
            fastavro.schema.parse_schema(ref.document, named_schemas=named)
        fastavro.schema.parse_schema(document, named_schemas=named)
    except (fastavro.schema.SchemaParseException, fastavro.schema.UnknownType) as exc:
        raise _invalid(f"invalid Avro schema: {exc}") from None
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        raise _invalid(f"invalid Avro schema: {type(exc).__name__}: {exc}") from None


def _check_json_schema(document: Any) -> None:
    if not isinstance(document, dict | bool):
        raise _invalid(f"a JSON schema is an object or a boolean, not {type(document).__name__}")
    validator = jsonschema.validators.validator_for(document, default=jsonschema.Draft7Validator)
    try:
        validator.check_schema(document)  # type: ignore[arg-type]  # booleans are schemas too
    except jsonschema.exceptions.SchemaError as exc:
        raise _invalid(
            f"invalid JSON schema at {_path(exc.absolute_path)}: {exc.message}"
        ) from None


def _path(parts: Any) -> str:
    return "/" + "/".join(str(p) for p in parts)
