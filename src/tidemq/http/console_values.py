"""Messages as the web console shows them: JSON-ready dicts, the value as text (or base64
when it is not UTF-8), and, when the value is in Confluent's wire format with a schema
id the registry knows, decoded with that schema (Avro, JSON Schema, or Protobuf, with
the files it imports).

A value that does not decode is shown as it is, with the reason: the console is where an
operator looks at a bad message, so a decoding failure must never hide it.
"""

from __future__ import annotations

import base64
import io
import json
from collections.abc import Callable
from typing import Any, Final

import fastavro
from google.protobuf import json_format

from tidemq.client.protobuf_serde import message_class
from tidemq.core.message import Message
from tidemq.schema.formats import ParsedSchema
from tidemq.schema.model import SchemaType
from tidemq.schema.protobuf_schema import serialized
from tidemq.schema.wire import MAGIC_ID, WireFormatError, decode_message_indexes, unframe

__all__ = ["MAX_SHOWN_BYTES", "SchemaLookup", "ValueDecoder", "message_record"]

#: Longest value shown whole; longer ones are cut there (the page stays light).
MAX_SHOWN_BYTES: Final = 64 * 1024
#: Schemas kept parsed (by id) for decoding.
_MAX_CACHED: Final = 256

#: schema id -> the registered schema; None when the id is not registered.
SchemaLookup = Callable[[int], ParsedSchema | None]


def _text_or_base64(data: bytes) -> dict[str, Any]:
    shown = data[:MAX_SHOWN_BYTES]
    out: dict[str, Any] = {"size": len(data), "truncated": len(data) > len(shown)}
    try:
        out["text"] = shown.decode("utf-8")
    except UnicodeDecodeError:
        out["base64"] = base64.b64encode(shown).decode("ascii")
    return out


class ValueDecoder:
    """Decodes framed values with the registry's schemas, keeping parsed readers per id."""

    def __init__(self, schemas: SchemaLookup) -> None:
        self._schemas = schemas
        self._readers: dict[tuple[int, tuple[int, ...]], Callable[[bytes], Any]] = {}

    def show(self, data: bytes | None) -> dict[str, Any] | None:
        if data is None:
            return None
        out = _text_or_base64(data)
        if data[:1] != bytes([MAGIC_ID]):
            return out
        try:
            framed = unframe(data)
        except WireFormatError:
            return out
        out["schema_id"] = framed.schema_id
        try:
            out["decoded"] = self._decode(framed.schema_id, bytes(framed.payload))
        except Exception as exc:
            out["decode_error"] = f"{type(exc).__name__}: {exc}"
        return out

    def _decode(self, schema_id: int, payload: bytes) -> Any:
        parsed = self._schemas(schema_id)
        if parsed is None:
            raise LookupError(f"schema id {schema_id} is not registered")
        indexes: tuple[int, ...] = ()
        if parsed.schema_type is SchemaType.PROTOBUF:
            found, rest = decode_message_indexes(memoryview(payload))
            indexes, payload = tuple(found), bytes(rest)
        key = (schema_id, indexes)
        reader = self._readers.get(key)
        if reader is None:
            if len(self._readers) >= _MAX_CACHED:
                self._readers.clear()
            reader = self._readers[key] = _reader(parsed, list(indexes))
        return reader(payload)


def _reader(parsed: ParsedSchema, indexes: list[int]) -> Callable[[bytes], Any]:
    if parsed.schema_type is SchemaType.AVRO:
        named: dict[str, Any] = {}
        for document in parsed.referenced:
            fastavro.parse_schema(document, named_schemas=named)
        schema = fastavro.parse_schema(parsed.document, named_schemas=named)
        return lambda payload: fastavro.schemaless_reader(io.BytesIO(payload), schema, None)
    if parsed.schema_type is SchemaType.JSON:
        return json.loads
    cls = message_class(serialized(parsed.document), indexes, imports=parsed.referenced)
    return lambda payload: json_format.MessageToDict(cls.FromString(payload))


def message_record(m: Message, decoder: ValueDecoder) -> dict[str, Any]:
    """One message for the console's JSON API."""
    return {
        "id": m.message_id,
        "topic": m.topic,
        "queue": m.queue,
        "offset": m.offset,
        "timestamp_ms": m.timestamp_ms,
        "key": decoder.show(m.key),
        "tag": m.tag,
        "keys": list(m.keys),
        "headers": {k: _text_or_base64(bytes(v)) for k, v in m.headers.items()},
        # None: a compact topic's tombstone.
        "value": decoder.show(None if m.value is None else bytes(m.value)),
        "deliver_at_ms": m.deliver_at_ms,
    }
