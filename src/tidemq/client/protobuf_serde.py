"""Protobuf values in Confluent's wire format (what confluent-kafka's ProtobufSerializer
writes and its ProtobufDeserializer reads), with a generated (or dynamically built)
message class:

    to_bytes = tidemq.ProtobufSerializer(registry, Order)     # Order: a message class
    producer.send("orders", to_bytes("orders", Order(id=1)))
    from_bytes = tidemq.ProtobufDeserializer(Order)
    order = from_bytes(message.value)

The schema registered is the class's file, serialized (a base64 FileDescriptorProto, as
Confluent's Python serializer registers it), under the topic's subject; the value is the
magic byte, the schema id, the message's indexes within its file, then its bytes.
The files it imports are registered too, each under its file name as subject (Confluent's
default reference subject), and named as references; Protobuf's own well-known types
(`google/protobuf/*.proto`), which every reader knows, are skipped, as Confluent's
serializer skips them.

Readers without generated code (the CLI, Spark) build the writer's
message class at run time (`WriterMessages`): from the schema of the value's id and the
schemas its references name, fetched recursively (`registered_imports`), each added to a
descriptor pool under the file name its importer uses, as Confluent's deserializer does.
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping
from typing import Any, Generic, TypeVar

from google.protobuf.descriptor import Descriptor
from google.protobuf.message import DecodeError, Message

from tidemq.client.serde import SchemaRegistry, SubjectStrategy, topic_name_strategy
from tidemq.schema.wire import decode_message_indexes, encode_message_indexes, frame, unframe

__all__ = [
    "ProtobufDeserializer",
    "ProtobufImports",
    "ProtobufSerializer",
    "WriterMessages",
    "message_class",
    "message_indexes",
    "registered_imports",
]

M = TypeVar("M", bound=Message)

#: Imports every reader resolves itself (Confluent's serializers skip them too).
_BUILTIN_PREFIX = "google/protobuf/"


def message_indexes(descriptor: Any) -> list[int]:
    """Where a message type (a `Descriptor`) sits in its file: its index among the
    top-level messages, then among each level of nested ones."""
    path: list[int] = []
    d: Descriptor | None = descriptor
    while d is not None:
        parent = d.containing_type
        siblings = list(parent.nested_types if parent else d.file.message_types_by_name.values())
        path.append(siblings.index(d))
        d = parent
    return path[::-1]


class ProtobufSerializer(Generic[M]):
    """`serializer(topic, message) -> bytes`: a message of `message_class`, framed."""

    def __init__(
        self,
        registry: SchemaRegistry,
        message_class: type[M],
        *,
        subject_strategy: SubjectStrategy = topic_name_strategy,
    ) -> None:
        descriptor = message_class.DESCRIPTOR
        self._file = descriptor.file
        self._references: list[dict[str, Any]] | None = None
        self._registry = registry
        self._class = message_class
        self._schema = base64.b64encode(descriptor.file.serialized_pb).decode("ascii")
        self._indexes = encode_message_indexes(message_indexes(descriptor))
        self._name = descriptor.full_name
        self._strategy = subject_strategy

    def prepare(self, topic: str) -> int:
        """Register (or look up) the schema, and the files it imports, under the topic's
        subject; its id (cached)."""
        if self._references is None:
            self._references = self._register_imports(self._file)
        return self._registry.register_text(
            self._strategy(topic, self._name), self._schema, "PROTOBUF", self._references
        )

    def _register_imports(self, file: Any) -> list[dict[str, Any]]:
        references = []
        for dep in file.dependencies:
            if dep.name.startswith(_BUILTIN_PREFIX):
                continue
            nested = self._register_imports(dep)
            text = base64.b64encode(dep.serialized_pb).decode("ascii")
            version = self._registry.register_version(dep.name, text, "PROTOBUF", nested)
            references.append({"name": dep.name, "subject": dep.name, "version": version})
        return references

    def __call__(self, topic: str, value: Any) -> bytes:
        if not isinstance(value, self._class):
            raise TypeError(f"expected a {self._name} message, got {type(value).__name__}")
        return frame(self.prepare(topic), self._indexes + value.SerializeToString())


class ProtobufDeserializer(Generic[M]):
    """`deserializer(data) -> message`: a framed value read as a `message_class`
    message (the writer's message must be that type: its indexes are checked)."""

    def __init__(self, message_class: type[M]) -> None:
        self._class = message_class
        self._indexes = message_indexes(message_class.DESCRIPTOR)

    def __call__(self, data: bytes | memoryview) -> M:
        framed = unframe(data)
        indexes, payload = decode_message_indexes(framed.payload)
        if indexes != self._indexes:
            raise TypeError(
                f"the value holds message {indexes} of its schema, not "
                f"{self._class.DESCRIPTOR.full_name} ({self._indexes})"
            )
        try:
            return self._class.FromString(bytes(payload))
        except DecodeError as exc:
            raise TypeError(
                f"the value is not a {self._class.DESCRIPTOR.full_name}: {exc}"
            ) from None


#: The files a schema imports, as (file name, serialized schema in base64), each after
#: the files it imports itself: what `message_class` needs besides the schema.
ProtobufImports = tuple[tuple[str, str], ...]


def registered_imports(
    registry: SchemaRegistry, references: Iterable[Mapping[str, Any]]
) -> ProtobufImports:
    """The files a schema's `references` ({"name", "subject", "version"} each, as the
    registry answers them) name, fetched from the registry with their own references,
    recursively (each file once, its imports before it)."""
    found: dict[str, str] = {}

    def walk(refs: Iterable[Mapping[str, Any]], chain: tuple[str, ...]) -> None:
        for ref in refs:
            name = str(ref["name"])
            if name in found:
                continue
            if name in chain:
                raise ValueError(f"the references import one another: {' -> '.join(chain)}")
            answer = registry.version_answer(str(ref["subject"]), str(ref["version"]))
            if answer.get("schemaType") != "PROTOBUF":
                raise ValueError(
                    f"reference {name} ({ref['subject']} version {ref['version']}) is a "
                    f"{answer.get('schemaType', 'AVRO')} schema, not PROTOBUF"
                )
            walk(answer.get("references") or [], (*chain, name))
            found[name] = str(answer["schema"])

    walk(references, ())
    return tuple(found.items())


def message_class(
    schema: str, indexes: list[int], *, name: str = "", imports: ProtobufImports = ()
) -> type[Message]:
    """The message class a registered Protobuf schema (serialized, base64) declares at
    `indexes` (or under the full `name`, when given), built at run time (for readers
    without generated code: the CLI, Spark). `imports`: the files it imports
    (`registered_imports`); Protobuf's well-known types need none."""
    from google.protobuf import descriptor_pb2, message_factory  # noqa: PLC0415

    proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(schema))
    files = dict(imports)
    if not proto.name or proto.name in files:
        proto.name = next(
            n for i in range(len(files) + 1) if (n := f"schema{i}.proto") not in files
        )
    pool = _pool_with(proto, files)
    file = pool.FindFileByName(proto.name)
    if name:
        try:
            return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))
        except KeyError:
            raise ValueError(f"the schema declares no message {name}") from None
    messages = list(file.message_types_by_name.values())
    descriptor = messages[indexes[0]]
    for i in indexes[1:]:
        descriptor = descriptor.nested_types[i]
    return message_factory.GetMessageClass(descriptor)


def _pool_with(proto: Any, files: Mapping[str, str]) -> Any:
    """A descriptor pool holding `proto` and, before it, every file it imports (from
    `files`, by the name the import uses, or the well-known types)."""
    from google.protobuf import (  # noqa: PLC0415 - the well-known types join the default pool
        any_pb2,  # noqa: F401
        descriptor_pb2,
        descriptor_pool,
        duration_pb2,  # noqa: F401
        empty_pb2,  # noqa: F401
        struct_pb2,  # noqa: F401
        timestamp_pb2,  # noqa: F401
        wrappers_pb2,  # noqa: F401
    )

    pool = descriptor_pool.DescriptorPool()
    default = descriptor_pool.Default()
    added: set[str] = set()

    def add(file: Any) -> None:
        added.add(file.name)
        for imported in file.dependency:
            if imported in added:
                continue
            if imported in files:
                dep = descriptor_pb2.FileDescriptorProto.FromString(
                    base64.b64decode(files[imported])
                )
                dep.name = imported  # the name the importer knows it by
                add(dep)
            elif imported.startswith(_BUILTIN_PREFIX):
                added.add(imported)
                pool.AddSerializedFile(default.FindFileByName(imported).serialized_pb)
            else:
                raise TypeError(
                    f"{file.name} imports {imported}, which none of the schema's references names"
                )
        pool.Add(file)

    add(proto)
    return pool


class WriterMessages:
    """Framed values read as their writer's message type (from the registry with the
    files it imports, built at run time, cached per schema id and message indexes):
    readers without generated code."""

    def __init__(self, registry: SchemaRegistry) -> None:
        self._registry = registry
        self._classes: dict[tuple[int, tuple[int, ...]], type[Message]] = {}

    def read(self, value: bytes | memoryview) -> Message:
        framed = unframe(value)
        indexes, payload = decode_message_indexes(framed.payload)
        return self.message_class(framed.schema_id, indexes).FromString(bytes(payload))

    def message_class(self, schema_id: int, indexes: list[int]) -> type[Message]:
        """The message type `indexes` name in the schema of `schema_id` (fetched once)."""
        key = (schema_id, tuple(indexes))
        cls = self._classes.get(key)
        if cls is None:
            answer = self._registry.schema_answer(schema_id)
            imports = registered_imports(self._registry, answer.get("references") or [])
            cls = self._classes[key] = message_class(
                str(answer["schema"]), indexes, imports=imports
            )
        return cls
