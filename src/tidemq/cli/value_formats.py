"""`--value-format` for `tidemq produce` and `tidemq consume`: JSON lines in, values in
Confluent's wire format out (Avro or JSON Schema, through the schema registry), and back
to JSON text when consuming.

    tidemq produce orders --value-format avro --value-schema order.avsc < orders.jsonl
    tidemq produce orders --value-format avro            # the latest orders-value schema
    tidemq consume orders --from-beginning --value-format avro
"""

from __future__ import annotations

import enum
import json
import os
import ssl
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Final

import typer

from tidemq.cli.common import CliUsageError, client_config
from tidemq.cli.produce_lines import LineFormatError
from tidemq.client.serde import (
    AvroDeserializer,
    AvroSerializer,
    JsonDeserializer,
    JsonSerializer,
    SchemaRegistry,
)
from tidemq.core.errors import TidemqError
from tidemq.schema.wire import encode_message_indexes, frame

__all__ = [
    "DEFAULT_REGISTRY",
    "Registry",
    "ValueFormat",
    "ValueFormatOpt",
    "ValueSchemaOpt",
    "decoder",
    "encoder",
]

DEFAULT_REGISTRY: Final = "http://127.0.0.1:8085"


class ValueFormat(enum.StrEnum):
    RAW = "raw"
    AVRO = "avro"
    JSON = "json"
    PROTOBUF = "protobuf"


Registry = Annotated[
    str,
    typer.Option(
        "--registry",
        "-r",
        envvar="TIDEMQ_REGISTRY_URL",
        metavar="URL",
        help="The schema registry's URL (a tidemq server's or broker's HTTP listener).",
    ),
]
ValueFormatOpt = Annotated[
    ValueFormat,
    typer.Option(
        "--value-format",
        case_sensitive=False,
        help="raw bytes (default), or avro / json / protobuf through the schema registry "
        "(JSON lines in, JSON out; protobuf: the first message of <topic>-value's latest "
        "schema).",
    ),
]
ValueSchemaOpt = Annotated[
    Path | None,
    typer.Option(
        "--value-schema",
        exists=True,
        dir_okay=False,
        help="The schema to write with (default: the latest of <topic>-value).",
        show_default=False,
    ),
]


def encoder(
    fmt: ValueFormat, topic: str, schema_file: Path | None, registry_url: str
) -> Callable[[bytes, int], bytes] | None:
    """(line's value, line number) -> the framed value; None for raw."""
    if fmt is ValueFormat.RAW:
        if schema_file is not None:
            raise CliUsageError("--value-schema needs --value-format avro or json")
        return None
    registry = _registry(registry_url)
    if fmt is ValueFormat.PROTOBUF:
        if schema_file is not None:
            raise CliUsageError("--value-schema takes an Avro or JSON schema, not protobuf")
        return _protobuf_encoder(registry, topic)
    if schema_file is not None:
        schema: dict[str, Any] = json.loads(schema_file.read_text())
    else:
        try:
            schema = registry.version(f"{topic}-value")
        except TidemqError as exc:
            raise CliUsageError(
                f"no --value-schema, and no schema registered for {topic}-value: {exc}"
            ) from None
    serialize = (
        AvroSerializer(registry, schema)
        if fmt is ValueFormat.AVRO
        else JsonSerializer(registry, schema)
    )

    def encode(value: bytes, number: int) -> bytes:
        try:
            return serialize(topic, json.loads(value))
        except (ValueError, TypeError) as exc:
            raise LineFormatError(f"line {number}: {exc}") from None

    return encode


def decoder(fmt: ValueFormat, registry_url: str) -> Callable[[bytes | None], bytes | None]:
    """A value -> its JSON text (UTF-8); the value itself for raw."""
    if fmt is ValueFormat.RAW:
        return lambda value: value
    registry = _registry(registry_url)
    read: Callable[[bytes], Any]
    if fmt is ValueFormat.PROTOBUF:
        read = _protobuf_reader(registry)
    elif fmt is ValueFormat.AVRO:
        read = AvroDeserializer(registry)
    else:
        read = JsonDeserializer(registry)

    def decode(value: bytes | None) -> bytes | None:
        if value is None:
            return None
        return json.dumps(read(value), ensure_ascii=False, default=str).encode()

    return decode


def _protobuf_encoder(registry: SchemaRegistry, topic: str) -> Callable[[bytes, int], bytes]:
    """JSON lines -> the first message of the subject's latest Protobuf schema."""
    from google.protobuf import json_format  # noqa: PLC0415 - protobuf on demand

    from tidemq.client.protobuf_serde import message_class, registered_imports  # noqa: PLC0415

    try:
        answer = registry.version_answer(f"{topic}-value")
    except TidemqError as exc:
        raise CliUsageError(f"no Protobuf schema registered for {topic}-value: {exc}") from None
    kind = answer.get("schemaType", "AVRO")
    if kind != "PROTOBUF":
        raise CliUsageError(f"{topic}-value holds a {kind} schema, not PROTOBUF")
    schema_id = int(answer["id"])
    try:
        imports = registered_imports(registry, answer.get("references") or [])
        cls = message_class(str(answer["schema"]), [0], imports=imports)
    except (TidemqError, TypeError, ValueError) as exc:
        raise CliUsageError(f"{topic}-value's Protobuf schema cannot be built: {exc}") from None
    prefix = encode_message_indexes([0])

    def encode(value: bytes, number: int) -> bytes:
        try:
            message = json_format.Parse(value, cls())
        except json_format.ParseError as exc:
            raise LineFormatError(f"line {number}: {exc}") from None
        return frame(schema_id, prefix + message.SerializeToString())

    return encode


def _protobuf_reader(registry: SchemaRegistry) -> Callable[[bytes], Any]:
    """A framed Protobuf value -> a dict, with its writer's message type."""
    from google.protobuf import json_format  # noqa: PLC0415 - protobuf on demand
    from google.protobuf.message import DecodeError  # noqa: PLC0415

    from tidemq.client.protobuf_serde import WriterMessages  # noqa: PLC0415

    messages = WriterMessages(registry)

    def read(value: bytes) -> Any:
        try:
            return json_format.MessageToDict(messages.read(value))
        except (TypeError, ValueError, DecodeError) as exc:  # a schema that cannot be built
            raise TidemqError(f"a value cannot be read as Protobuf: {exc}") from None

    return read


#: The CA (PEM) an https registry URL is verified against (default: the system's CAs,
#: or the command's --tls-ca-file).
REGISTRY_CA_ENV = "TIDEMQ_REGISTRY_CA_FILE"


def _registry(url: str) -> SchemaRegistry:
    """The registry at `url`, logging in as the commands log in to brokers
    (TIDEMQ_USERNAME / TIDEMQ_PASSWORD, HTTP Basic) and trusting TIDEMQ_REGISTRY_CA_FILE
    or the command's --tls-ca-file for https."""
    config = client_config()
    ca_file = os.environ.get(REGISTRY_CA_ENV)
    context = ssl.create_default_context(cafile=ca_file) if ca_file else config.ssl_context
    try:
        return SchemaRegistry(
            url, username=config.username, password=config.password, ssl_context=context
        )
    except (TidemqError, OSError) as exc:
        raise CliUsageError(str(exc)) from None
