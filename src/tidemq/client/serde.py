"""Serializers that write Confluent's wire format and use a schema registry (tidemq's, or
any that speaks Confluent's REST API): values that Confluent's deserializers read, and
that read what Confluent's serializers wrote.

    registry = tidemq.SchemaRegistry("http://127.0.0.1:8085")
    to_bytes = tidemq.AvroSerializer(registry, Order)        # a dataclass or Struct
    producer.send("orders", to_bytes("orders", Order(...)))
    from_bytes = tidemq.AvroDeserializer(registry, Order)
    order = from_bytes(message.value)                         # an Order again

The schema is registered (or looked up) under the subject of the topic's name strategy
on first use, and cached with its id; ids read are resolved once and cached. Registry
calls are blocking HTTP (`urllib`): one per subject and one per id read, in a process's
life. In asyncio code, call `serializer.prepare(topic)` at start (or in a thread) so that
no send waits on one.
"""

from __future__ import annotations

import base64
import io
import json
import ssl
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any, Final

import fastavro
import jsonschema
import jsonschema.exceptions
import jsonschema.validators

from tidemq.client.avro_types import avro_schema_of, from_avro_record, to_avro_record
from tidemq.core.errors import ConfigError, InvalidRequest, TidemqError
from tidemq.schema.wire import frame, unframe

__all__ = [
    "AvroDeserializer",
    "AvroSerializer",
    "JsonDeserializer",
    "JsonSerializer",
    "SchemaRegistry",
    "record_name_strategy",
    "topic_name_strategy",
    "topic_record_name_strategy",
]

_CONTENT_TYPE: Final = "application/vnd.schemaregistry.v1+json"
_TIMEOUT_S: Final = 30.0

#: (topic, record full name) -> subject
SubjectStrategy = Callable[[str, str], str]


def topic_name_strategy(topic: str, record: str) -> str:
    """Confluent's default: `<topic>-value`."""
    return f"{topic}-value"


def record_name_strategy(topic: str, record: str) -> str:
    return record


def topic_record_name_strategy(topic: str, record: str) -> str:
    return f"{topic}-{record}"


class SchemaRegistry:
    """A small client of the registry's REST API, with caches (thread-safe).

    `username`/`password`: HTTP Basic credentials, for the listener of a broker that
    requires logins (a broker user; send them over https). `ssl_context`: how an https
    URL's certificate is checked (default: the system's CAs), e.g.
    `ssl.create_default_context(cafile=...)`."""

    def __init__(
        self,
        url: str,
        *,
        username: str | None = None,
        password: str | None = None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ConfigError(f"the schema registry URL must be http(s)://..., got {url!r}")
        if (username is None) != (password is None):
            raise ConfigError("the schema registry's username and password go together")
        self.url = url.rstrip("/")
        self._auth = (
            None
            if username is None
            else "Basic " + base64.b64encode(f"{username}:{password}".encode()).decode()
        )
        self._ssl = ssl_context
        self._by_id: dict[int, dict[str, Any]] = {}
        self._ids: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()

    def request(self, method: str, path: str, body: Any = None) -> Any:
        """One REST call: the answer's JSON (its text when not JSON). InvalidRequest with
        the registry's message and error code; TidemqError when it cannot be reached."""
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": _CONTENT_TYPE, "Accept": _CONTENT_TYPE}
        if self._auth is not None:
            headers["Authorization"] = self._auth
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=_TIMEOUT_S, context=self._ssl) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as exc:
            try:
                detail = json.loads(exc.read())
                message = f"{detail['message']} (error {detail['error_code']})"
            except (ValueError, KeyError, TypeError):
                message = f"HTTP {exc.code}"
            raise InvalidRequest(f"schema registry {self.url}: {message}") from None
        except (urllib.error.URLError, OSError) as exc:
            reason = getattr(exc, "reason", exc)
            raise TidemqError(f"cannot reach the schema registry at {self.url}: {reason}") from None
        try:
            return json.loads(raw) if raw else None
        except ValueError:
            return raw.decode(errors="replace")

    def register(self, subject: str, schema: dict[str, Any], schema_type: str = "AVRO") -> int:
        """The id of `schema` under `subject`, registering it if needed (cached)."""
        text = json.dumps(schema, separators=(",", ":"))
        schema_id = self.register_text(subject, text, schema_type)
        with self._lock:
            self._by_id.setdefault(schema_id, schema)
        return schema_id

    def register_text(
        self,
        subject: str,
        text: str,
        schema_type: str,
        references: list[dict[str, Any]] | None = None,
    ) -> int:
        """The id of the schema `text` (as the registry takes it: JSON for Avro and JSON
        Schema, the serialized descriptor for Protobuf) under `subject`, with its
        `references` ({"name", "subject", "version"} each) (cached)."""
        key = (subject, text + json.dumps(references or []))
        with self._lock:
            cached = self._ids.get(key)
        if cached is not None:
            return cached
        path = f"/subjects/{urllib.parse.quote(subject, safe='')}/versions"
        body: dict[str, Any] = {"schema": text, "schemaType": schema_type}
        if references:
            body["references"] = references
        answer = self.request("POST", path, body)
        schema_id = int(answer["id"])
        with self._lock:
            self._ids[key] = schema_id
        return schema_id

    def register_version(
        self,
        subject: str,
        text: str,
        schema_type: str,
        references: list[dict[str, Any]] | None = None,
    ) -> int:
        """Register `text` under `subject` if needed, and the version it has there (what
        a reference to it names)."""
        self.register_text(subject, text, schema_type, references)
        path = f"/subjects/{urllib.parse.quote(subject, safe='')}"
        body: dict[str, Any] = {"schema": text, "schemaType": schema_type}
        if references:
            body["references"] = references
        return int(self.request("POST", path, body)["version"])

    def version(self, subject: str, version: str | int = "latest") -> dict[str, Any]:
        """The schema (Avro or JSON Schema) of a subject's version ("latest" by default)."""
        _, schema, kind = self.version_info(subject, version)
        if not isinstance(schema, dict):
            raise InvalidRequest(f"{subject} version {version} is a {kind} schema, not JSON")
        return schema

    def version_info(self, subject: str, version: str | int = "latest") -> tuple[int, Any, str]:
        """(schema id, schema, schema type) of a subject's version ("latest" by default):
        the parsed JSON of an Avro or JSON schema, the serialized text of a Protobuf one."""
        answer = self.version_answer(subject, version)
        kind = str(answer.get("schemaType", "AVRO"))
        text = str(answer["schema"])
        return int(answer["id"]), (text if kind == "PROTOBUF" else json.loads(text)), kind

    def version_answer(self, subject: str, version: str | int = "latest") -> dict[str, Any]:
        """The registry's answer for a subject's version: `id`, `version`, `schemaType`,
        `schema` (a Protobuf one serialized) and `references` (when it has some)."""
        quoted = urllib.parse.quote(subject, safe="")
        answer: dict[str, Any] = self.request(
            "GET", f"/subjects/{quoted}/versions/{version}?format=serialized"
        )
        return answer

    def schema_text(self, schema_id: int) -> tuple[str, str]:
        """(the schema's text as registered, its schema type) of an id."""
        answer = self.schema_answer(schema_id)
        return str(answer["schema"]), str(answer.get("schemaType", "AVRO"))

    def schema_answer(self, schema_id: int) -> dict[str, Any]:
        """The registry's answer for an id: `schema` (a Protobuf one serialized),
        `schemaType` and `references` (when it has some)."""
        answer: dict[str, Any] = self.request("GET", f"/schemas/ids/{schema_id}?format=serialized")
        return answer

    def schema(self, schema_id: int) -> dict[str, Any]:
        """The schema of an id (cached: ids never change meaning)."""
        with self._lock:
            cached = self._by_id.get(schema_id)
        if cached is not None:
            return cached
        answer = self.request("GET", f"/schemas/ids/{schema_id}")
        schema: dict[str, Any] = json.loads(answer["schema"])
        with self._lock:
            self._by_id[schema_id] = schema
        return schema


class AvroSerializer:
    """`serializer(topic, value) -> bytes`: Avro binary in Confluent's framing. `schema`
    is a dataclass or Struct type (its schema derived from its type hints), or an Avro
    schema (dict or JSON text) for plain dict values."""

    def __init__(
        self,
        registry: SchemaRegistry,
        schema: type | dict[str, Any] | str,
        *,
        subject_strategy: SubjectStrategy = topic_name_strategy,
    ) -> None:
        self._registry = registry
        if isinstance(schema, type):
            self.schema: dict[str, Any] = avro_schema_of(schema)
        elif isinstance(schema, str):
            self.schema = json.loads(schema)
        else:
            self.schema = dict(schema)
        self._parsed = fastavro.parse_schema(self.schema)
        name = self.schema.get("name", "")
        namespace = self.schema.get("namespace")
        self._record_name = f"{namespace}.{name}" if namespace else name
        self._strategy = subject_strategy
        self._ids: dict[str, int] = {}

    def prepare(self, topic: str) -> int:
        """Register (or look up) the schema for `topic` now; its id."""
        schema_id = self._ids.get(topic)
        if schema_id is None:
            subject = self._strategy(topic, self._record_name)
            schema_id = self._ids[topic] = self._registry.register(subject, self.schema)
        return schema_id

    def __call__(self, topic: str, value: Any) -> bytes:
        schema_id = self._ids.get(topic) or self.prepare(topic)
        out = io.BytesIO()
        try:
            fastavro.schemaless_writer(out, self._parsed, to_avro_record(value))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise TypeError(
                f"value does not fit the Avro schema {self._record_name}: {exc}"
            ) from None
        return frame(schema_id, out.getvalue())


class AvroDeserializer:
    """`deserializer(data) -> value`: reads Confluent-framed Avro with the writer's schema
    (from the registry, by the id in the value); with `target` (a dataclass or Struct
    type), resolved to that type's schema and returned as an instance of it, else a dict."""

    def __init__(self, registry: SchemaRegistry, target: type | None = None) -> None:
        self._registry = registry
        self._target = target
        self._reader = None if target is None else fastavro.parse_schema(avro_schema_of(target))
        self._writers: dict[int, Any] = {}

    def __call__(self, data: bytes | memoryview) -> Any:
        framed = unframe(data)
        writer = self._writers.get(framed.schema_id)
        if writer is None:
            writer = fastavro.parse_schema(self._registry.schema(framed.schema_id))
            self._writers[framed.schema_id] = writer
        record = fastavro.schemaless_reader(io.BytesIO(framed.payload), writer, self._reader)
        return record if self._target is None else from_avro_record(self._target, record)


class JsonSerializer:
    """`serializer(topic, value) -> bytes`: a JSON value checked against a JSON Schema, in
    Confluent's framing (what Confluent's JSONDeserializer reads)."""

    def __init__(
        self,
        registry: SchemaRegistry,
        schema: dict[str, Any] | str,
        *,
        subject_strategy: SubjectStrategy = topic_name_strategy,
    ) -> None:
        self._registry = registry
        self.schema: dict[str, Any] = (
            json.loads(schema) if isinstance(schema, str) else dict(schema)
        )
        validator_class = jsonschema.validators.validator_for(self.schema)
        validator_class.check_schema(self.schema)
        self._validator = validator_class(self.schema)
        self._title = str(self.schema.get("title", ""))
        self._strategy = subject_strategy

    def prepare(self, topic: str) -> int:
        return self._registry.register(self._strategy(topic, self._title), self.schema, "JSON")

    def __call__(self, topic: str, value: Any) -> bytes:
        schema_id = self.prepare(topic)
        error = jsonschema.exceptions.best_match(self._validator.iter_errors(value))
        if error is not None:
            where = "/" + "/".join(str(p) for p in error.absolute_path)
            raise TypeError(f"value does not fit the JSON schema at {where}: {error.message}")
        return frame(schema_id, json.dumps(value, separators=(",", ":")).encode())


class JsonDeserializer:
    """`deserializer(data) -> value`: Confluent-framed JSON, checked against the writer's
    schema (from the registry) unless `validate=False`."""

    def __init__(self, registry: SchemaRegistry, *, validate: bool = True) -> None:
        self._registry = registry
        self._validate = validate
        self._validators: dict[int, Any] = {}

    def __call__(self, data: bytes | memoryview) -> Any:
        framed = unframe(data)
        try:
            value = json.loads(bytes(framed.payload))
        except ValueError as exc:
            raise TypeError(f"the value is not JSON: {exc}") from None
        if self._validate:
            validator = self._validators.get(framed.schema_id)
            if validator is None:
                schema = self._registry.schema(framed.schema_id)
                validator = jsonschema.validators.validator_for(schema)(schema)
                self._validators[framed.schema_id] = validator
            error = jsonschema.exceptions.best_match(validator.iter_errors(value))
            if error is not None:
                raise TypeError(f"the value does not fit its JSON schema: {error.message}")
        return value
