"""`valueFormat=avro` and `valueFormat=json`: the source decodes Confluent-framed Avro or
JSON values into a struct column, with the schema from the registry (`schemaRegistry`,
`subject`, `schemaVersion`).

JSON values are parsed and laid out by the subject's JSON Schema (`json_types.py`), a
batch at a time (`json_decode.py`); a value that is not framed, not JSON, or whose
fields do not fit the schema's types fails the task naming the topic, queue and offset
(the schema's other constraints are the producer's serializer's to check). Protobuf
values are read with their writer's message type and laid out a field at a time into
the struct of the reader's message (`protobuf_decode.py`).

The reader schema is resolved once, on the driver, when Spark asks for the source's
schema: the subject's version (latest by default; the subject defaults to
`<topic>-value` for a single subscribed topic). Each value is read with its writer's
schema (by the id in the value, fetched once per executor process) resolved to that
reader schema, so values written with older compatible versions decode to the same
struct; a batch's values are decoded a block at a time, into Arrow columns where polars
can (`avro_decode.py`). A value that is not framed, or whose schema does not resolve,
fails the task naming the topic, queue and offset.
"""

from __future__ import annotations

import json
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa

from tidemq.spark.avro_decode import decode_avro_column
from tidemq.spark.json_decode import decode_json_column
from tidemq.spark.json_types import spark_json_of_json_schema

if TYPE_CHECKING:
    from tidemq.client.protobuf_serde import ProtobufImports

    # The serde imports jsonschema (a fifth of the source's imports): only when a value
    # format is used, not in every process that plans or reads plain values.
    from tidemq.client.serde import SchemaRegistry

__all__ = [
    "VALUE_FORMAT_OPTIONS",
    "ValueFormat",
    "decode_values",
    "resolve_value_format",
    "spark_json_of",
]

VALUE_FORMAT_OPTIONS: Final = (
    "valueFormat",
    "schemaRegistry",
    "subject",
    "schemaVersion",
    "protobufMessage",
    "schemaRegistry.username",
    "schemaRegistry.password",
    "schemaRegistry.caFile",
)

#: Avro primitive -> Spark's JSON name of the type (`StructType.fromJson` reads these:
#: this module stays free of pyspark, which only the source and sink import).
_PRIMITIVE: Final[dict[str, Any]] = {
    "boolean": "boolean",
    "int": "integer",
    "long": "long",
    "float": "float",
    "double": "double",
    "bytes": "binary",
    "string": "string",
}


@dataclass(frozen=True, slots=True)
class RegistryLogin:
    """`schemaRegistry.username`, `.password` and `.caFile` (picklable: plain strings;
    the same CA path must exist on the driver and every executor)."""

    username: str = ""
    password: str = field(default="", repr=False)
    ca_file: str = ""

    @classmethod
    def of(cls, opts: Mapping[str, str]) -> RegistryLogin:
        """From lower-cased options; ValueError for half a login."""
        found = cls(
            opts.get("schemaregistry.username", ""),
            opts.get("schemaregistry.password", ""),
            opts.get("schemaregistry.cafile", ""),
        )
        if bool(found.username) != bool(found.password):
            raise ValueError("schemaRegistry.username and schemaRegistry.password go together")
        return found

    def registry(self, url: str) -> SchemaRegistry:
        from tidemq.client.serde import SchemaRegistry  # noqa: PLC0415 - see the imports

        context = ssl.create_default_context(cafile=self.ca_file) if self.ca_file else None
        return SchemaRegistry(
            url,
            username=self.username or None,
            password=self.password or None,
            ssl_context=context,
        )


@dataclass(frozen=True, slots=True)
class ValueFormat:
    """What executors need (picklable): the reader schema and where the registry is."""

    registry_url: str
    #: JSON for Avro and JSON Schema; the serialized descriptor (base64) for Protobuf.
    reader_schema: str
    #: "avro", "json" or "protobuf".
    kind: str = "avro"
    #: The id values are written with (writers only; readers take each value's own).
    schema_id: int = -1
    #: Protobuf: the message type of the value column (full name; "": the file's first).
    message: str = ""
    #: How executors reach the registry (HTTP Basic login, the CA of an https URL).
    login: RegistryLogin = field(default_factory=RegistryLogin)
    #: Protobuf: the files the reader schema imports (its references, recursively).
    imports: ProtobufImports = ()

    def registry(self) -> SchemaRegistry:
        return self.login.registry(self.registry_url)

    def spark_json(self) -> dict[str, Any]:
        """The value column's Spark type, in Spark's JSON form of a StructType."""
        if self.kind == "protobuf":
            from tidemq.client.protobuf_serde import message_class  # noqa: PLC0415
            from tidemq.spark.protobuf_types import spark_json_of_message  # noqa: PLC0415

            descriptor = message_class(
                self.reader_schema, [0], name=self.message, imports=self.imports
            ).DESCRIPTOR
            return spark_json_of_message(descriptor)
        schema = json.loads(self.reader_schema)
        if self.kind == "json":
            data_type = spark_json_of_json_schema(schema)
        else:
            data_type = spark_json_of(schema, {})
        if not isinstance(data_type, dict) or data_type.get("type") != "struct":
            what = "an object schema with properties" if self.kind == "json" else "a record"
            raise ValueError(f"valueFormat={self.kind} needs {what}")
        return data_type


def _lower(options: Mapping[str, str]) -> dict[str, str]:
    return {k.lower(): v for k, v in options.items()}


@dataclass(frozen=True, slots=True)
class FormatRequest:
    """What the value-format options ask for (reads and writes alike), checked."""

    kind: str
    registry_url: str
    login: RegistryLogin
    #: `protobufMessage` ("" unless given).
    message: str


def format_request(opts: Mapping[str, str]) -> FormatRequest | None:
    """The value format lower-cased `opts` ask for (None: raw); ValueError naming the
    option that is wrong."""
    fmt = opts.get("valueformat", "raw").lower()
    if fmt == "raw":
        for name in VALUE_FORMAT_OPTIONS[1:]:
            if name.lower() in opts:
                raise ValueError(f"option {name!r} needs valueFormat=avro, json or protobuf")
        return None
    if fmt not in ("avro", "json", "protobuf"):
        raise ValueError(f"valueFormat must be raw, avro, json or protobuf, got {fmt!r}")
    url = opts.get("schemaregistry")
    if not url:
        raise ValueError(f"valueFormat={fmt} needs schemaRegistry=http://HOST:PORT")
    message = opts.get("protobufmessage", "")
    if message and fmt != "protobuf":
        raise ValueError("option 'protobufMessage' needs valueFormat=protobuf")
    return FormatRequest(fmt, url, RegistryLogin.of(opts), message)


def resolve_value_format(options: Mapping[str, str]) -> ValueFormat | None:
    """The value format the options ask for (None: raw bytes), its schema resolved from
    the registry (on the driver). ValueError naming the option that is wrong."""
    opts = _lower(options)
    request = format_request(opts)
    if request is None:
        return None
    fmt = request.kind
    subject = opts.get("subject")
    if subject is None:
        topic = opts.get("subscribe", "")
        if not topic or "," in topic:
            raise ValueError(
                f"valueFormat={fmt} needs subject=... unless subscribe names one topic"
            )
        subject = f"{topic}-value"
    version = opts.get("schemaversion", "latest")
    registry = request.login.registry(request.registry_url)
    answer = registry.version_answer(subject, version)
    kind = str(answer.get("schemaType", "AVRO"))
    if kind.lower() != fmt:
        raise ValueError(f"subject {subject!r} holds a {kind} schema, not valueFormat={fmt}")
    found = ValueFormat(
        request.registry_url,
        str(answer["schema"]),
        fmt,
        message=request.message,
        login=request.login,
        imports=protobuf_imports(registry, answer),
    )
    found.spark_json()  # refuse a schema with no Spark type now, on the driver
    return found


def protobuf_imports(registry: SchemaRegistry, answer: Mapping[str, Any]) -> ProtobufImports:
    """The files a registered Protobuf schema (the registry's `answer` for it) imports,
    fetched once on the driver for every executor; () for other schema types."""
    if answer.get("schemaType") != "PROTOBUF" or not answer.get("references"):
        return ()
    from tidemq.client.protobuf_serde import registered_imports  # noqa: PLC0415

    return registered_imports(registry, answer["references"])


def spark_json_of(schema: Any, named: dict[str, Any]) -> Any:
    """The Spark type of an Avro schema, in Spark's JSON form (records: structs; unions
    with null: nullable)."""
    if isinstance(schema, str):
        found = _PRIMITIVE.get(schema) or named.get(schema)
        if found is None:
            raise ValueError(f"Avro type {schema!r} has no Spark type")
        return found
    if isinstance(schema, list):
        members = [m for m in schema if m != "null"]
        if len(members) != 1:
            raise ValueError(f"Avro union {schema} has no Spark type (only [null, T])")
        return spark_json_of(members[0], named)
    logical = _LOGICAL.get(schema.get("logicalType"))
    if logical is not None:
        return logical
    complex_type = _COMPLEX.get(schema.get("type"))
    if complex_type is not None:
        return complex_type(schema, named)
    return spark_json_of(schema.get("type"), named)


def _record(schema: Any, named: dict[str, Any]) -> Any:
    struct = {
        "type": "struct",
        "fields": [
            {
                "name": f["name"],
                "type": spark_json_of(f["type"], named),
                "nullable": True,
                "metadata": {},
            }
            for f in schema["fields"]
        ],
    }
    named[schema["name"]] = struct
    return struct


def _enum(schema: Any, named: dict[str, Any]) -> Any:
    named[schema["name"]] = "string"
    return "string"


_LOGICAL: Final[dict[Any, str]] = {
    "timestamp-millis": "timestamp",
    "timestamp-micros": "timestamp",
    "date": "date",
}
_COMPLEX: Final[dict[Any, Any]] = {
    "record": _record,
    "enum": _enum,
    "array": lambda s, named: {
        "type": "array",
        "elementType": spark_json_of(s["items"], named),
        "containsNull": True,
    },
    "map": lambda s, named: {
        "type": "map",
        "keyType": "string",
        "valueType": spark_json_of(s["values"], named),
        "valueContainsNull": True,
    },
    "fixed": lambda s, named: "binary",
}


def decode_values(batch: Any, fmt: ValueFormat, arrow_type: Any, topic: str, queue: int) -> Any:
    """`batch` (a pa.RecordBatch of the source) with its `value` column decoded, a batch
    at a time (ADR 0022, 0024)."""
    column = batch.column(batch.schema.get_field_index("value"))
    offsets = batch.column(batch.schema.get_field_index("offset")).to_pylist()
    where = (topic, queue)
    if fmt.kind == "avro":
        return _with_values(batch, decode_avro_column(column, offsets, fmt, arrow_type, where))
    if fmt.kind == "json":
        return _with_values(batch, decode_json_column(column, offsets, arrow_type, where))
    if fmt.kind == "protobuf":
        from tidemq.spark.protobuf_decode import decode_protobuf_column  # noqa: PLC0415

        decoded = decode_protobuf_column(column, offsets, fmt, arrow_type, where)
        return _with_values(batch, decoded)
    raise ValueError(f"unknown valueFormat {fmt.kind!r}")


def _with_values(batch: Any, column: Any) -> Any:
    columns = [
        column if name == "value" else batch.column(i) for i, name in enumerate(batch.schema.names)
    ]
    fields = [pa.field("value", column.type) if f.name == "value" else f for f in batch.schema]
    return pa.RecordBatch.from_arrays(columns, schema=pa.schema(fields))
