"""tidemq's schema registry with a client nobody here wrote: confluent-kafka's
SchemaRegistryClient and its Avro and JSON serializers, unchanged, against the HTTP
listener of a real broker (register, look up, evolve, reject an incompatible change,
delete); and the registry's state surviving a restart (it lives on `_schemas`)."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import enum
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec
import pytest
from confluent_kafka.schema_registry import (
    AsyncSchemaRegistryClient,
    Schema,
    SchemaRegistryClient,
)
from confluent_kafka.schema_registry.avro import AvroDeserializer, AvroSerializer
from confluent_kafka.schema_registry.error import SchemaRegistryError
from confluent_kafka.schema_registry.json_schema import JSONDeserializer, JSONSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from tests.integration.conftest import ThreadedBroker, broker_config
from tests.support.server_process import server_process
from typer.testing import CliRunner

import tidemq
import tidemq.aio
from tidemq.cli.main import app
from tidemq.http.listener import HttpListener
from tidemq.schema.model import RegistryError
from tidemq.schema.wire import frame, unframe

if TYPE_CHECKING:
    from tests.integration.conftest import ClusterEnv, Loop

pytestmark = pytest.mark.timeout(120)

ORDER_V1 = {
    "type": "record",
    "name": "Order",
    "fields": [{"name": "id", "type": "long"}, {"name": "amount", "type": "double"}],
}
ORDER_V2 = {
    **ORDER_V1,
    "fields": [*ORDER_V1["fields"], {"name": "note", "type": "string", "default": ""}],
}
ORDER_BAD = {**ORDER_V1, "fields": [{"name": "id", "type": "string"}]}


class Node:
    def __init__(self, data: Path) -> None:
        self.data = data
        self.broker = ThreadedBroker(broker_config(data))
        self.broker.start()
        self.http = HttpListener(self.broker.address, port=0)
        self.url = "http://" + self.broker.call(self.http.start())

    def stop(self) -> None:
        try:
            self.broker.call(self.http.stop())
        finally:
            self.broker.stop()


@pytest.fixture
def node(tmp_path: Path) -> Iterator[Node]:
    n = Node(tmp_path / "broker")
    try:
        yield n
    finally:
        n.stop()


def _avro(schema: dict[str, Any]) -> Schema:
    return Schema(json.dumps(schema), "AVRO")


@pytest.fixture
def client(node: Node) -> Iterator[SchemaRegistryClient]:
    with SchemaRegistryClient({"url": node.url}) as c:
        yield c


def test_confluents_client_registers_evolves_and_deletes(
    node: Node, client: SchemaRegistryClient
) -> None:
    first = client.register_schema("orders-value", _avro(ORDER_V1))
    assert client.register_schema("orders-value", _avro(ORDER_V1)) == first
    assert json.loads(client.get_schema(first).schema_str or "") == ORDER_V1
    second = client.register_schema("orders-value", _avro(ORDER_V2))
    assert second != first
    assert client.get_versions("orders-value") == [1, 2]
    latest = client.get_latest_version("orders-value")
    assert (latest.version, latest.schema_id) == (2, second)
    found = client.lookup_schema("orders-value", _avro(ORDER_V1))
    assert (found.version, found.schema_id) == (1, first)
    assert client.get_subjects() == ["orders-value"]
    assert client.test_compatibility("orders-value", _avro(ORDER_BAD)) is False
    with pytest.raises(SchemaRegistryError) as info:
        client.register_schema("orders-value", _avro(ORDER_BAD))
    assert info.value.http_status_code == 409
    assert "id" in info.value.error_message
    client.set_compatibility("orders-value", "NONE")
    assert client.get_compatibility("orders-value") == "NONE"
    client.register_schema("orders-value", _avro(ORDER_BAD))  # NONE: anything goes
    with pytest.raises(SchemaRegistryError) as info:
        client.get_version("orders-value", 9)
    assert info.value.error_code == 40402
    assert client.delete_version("orders-value", 3) == 3
    assert client.delete_subject("orders-value") == [1, 2]
    assert client.get_subjects() == []
    assert client.delete_subject("orders-value", permanent=True) == [1, 2, 3]
    with (
        SchemaRegistryClient({"url": node.url}) as fresh,  # no cache
        pytest.raises(SchemaRegistryError) as info,
    ):
        fresh.get_schema(first)
    assert info.value.error_code == 40403


def test_confluents_serializers_write_what_tidemq_carries_and_reads_back(
    node: Node, client: SchemaRegistryClient
) -> None:
    ctx = SerializationContext("payments", MessageField.VALUE)
    serialize = AvroSerializer(client, json.dumps(ORDER_V1))
    deserialize = AvroDeserializer(client)
    value = serialize({"id": 7, "amount": 9.5}, ctx)
    assert value is not None
    assert unframe(value).schema_id == client.get_latest_version("payments-value").schema_id
    with tidemq.Admin(node.broker.address) as admin, tidemq.Producer(node.broker.address) as p:
        admin.create_topic("payments", 1)
        p.send("payments", value)
    with tidemq.StreamConsumer(node.broker.address, start="earliest") as consumer:
        consumer.assign([("payments", 0)])
        got = []
        for _ in range(50):
            got += consumer.poll(timeout_ms=100)
            if got:
                break
    assert deserialize(got[0].value, ctx) == {"id": 7, "amount": 9.5}
    json_schema = {"type": "object", "properties": {"sku": {"type": "string"}}}
    to_json = JSONSerializer(json.dumps(json_schema), client)
    from_json = JSONDeserializer(json.dumps(json_schema))
    jctx = SerializationContext("skus", MessageField.VALUE)
    assert from_json(to_json({"sku": "A-1"}, jctx), jctx) == {"sku": "A-1"}
    assert client.get_latest_version("skus-value").schema.schema_type == "JSON"


def test_the_registry_survives_a_restart(tmp_path: Path) -> None:
    node = Node(tmp_path / "broker")
    try:
        with SchemaRegistryClient({"url": node.url}) as client:
            schema_id = client.register_schema("s-value", _avro(ORDER_V1))
            client.set_compatibility(level="FULL")
    finally:
        node.stop()
    node = Node(tmp_path / "broker")
    try:
        client = SchemaRegistryClient({"url": node.url})
        assert json.loads(client.get_schema(schema_id).schema_str or "") == ORDER_V1
        assert client.get_compatibility() == "FULL"
        # Ids continue after the restart, never reused.
        assert client.register_schema("t-value", _avro(ORDER_V2)) == schema_id + 1
        client.close()
    finally:
        node.stop()


def test_tidemq_server_serves_the_registry_and_keeps_it_across_kill_9(tmp_path: Path) -> None:
    """`tidemq server` (what `make run` starts) with its HTTP listener: a registration
    acknowledged before kill -9 is there after the restart."""
    with server_process(tmp_path) as server:
        assert server.http_address
        with SchemaRegistryClient({"url": f"http://{server.http_address}"}) as client:
            schema_id = client.register_schema("k-value", _avro(ORDER_V1))
        os.kill(server.pid, signal.SIGKILL)
        server.proc.wait(30)
    with (
        server_process(tmp_path) as server,
        SchemaRegistryClient({"url": f"http://{server.http_address}"}) as client,
    ):
        assert client.get_latest_version("k-value").schema_id == schema_id
        assert client.get_schema_types() == ["AVRO", "JSON", "PROTOBUF"]


def test_every_node_of_a_cluster_serves_one_registry(loop: Loop, cluster: ClusterEnv) -> None:
    """Two nodes (each with its listener, reading the one `_schemas` of the cluster):
    what one registers the other serves; registrations racing on both nodes get one id per
    schema and one version per registration, never two schemas under one id."""

    async def scenario() -> None:
        nodes = [HttpListener(cluster.bootstrap, port=0) for _ in range(2)]
        urls = [f"http://{await n.start()}" for n in nodes]
        try:
            async with (
                AsyncSchemaRegistryClient({"url": urls[0]}) as a,
                AsyncSchemaRegistryClient({"url": urls[1]}) as b,
            ):
                await a.set_compatibility(level="NONE")
                first = await a.register_schema("x-value", _avro(ORDER_V1))
                assert (await b.get_latest_version("x-value")).schema_id == first
                schemas = [
                    {**ORDER_V1, "fields": [{"name": f"f{i}", "type": "int"}]} for i in range(8)
                ]
                ids = await asyncio.gather(
                    *(
                        (a if i % 2 else b).register_schema(f"race-{i % 3}", _avro(s))
                        for i, s in enumerate(schemas)
                    ),
                    # The same schema on both nodes at once: one id, under any subject.
                    a.register_schema("same", _avro(ORDER_V2)),
                    b.register_schema("same", _avro(ORDER_V2)),
                    b.register_schema("same-too", _avro(ORDER_V2)),
                )
                assert len(set(ids[:8])) == 8
                assert ids[8] == ids[9] == ids[10]
                for client in (a, b):
                    for i, s in enumerate(schemas):
                        got = await client.get_schema(ids[i])
                        assert json.loads(got.schema_str or "") == s
                    assert await client.get_versions("same") == [1]
        finally:
            for n in nodes:
                await n.stop()

    loop.run(scenario())


def test_the_schema_cli(tmp_path: Path) -> None:
    """`tidemq schema ...` against `tidemq server`, as a user would run it."""
    v1, v2, bad = tmp_path / "v1.avsc", tmp_path / "v2.avsc", tmp_path / "bad.avsc"
    v1.write_text(json.dumps(ORDER_V1))
    v2.write_text(json.dumps(ORDER_V2))
    bad.write_text(json.dumps(ORDER_BAD))
    with server_process(tmp_path) as server:
        url = f"http://{server.http_address}"

        def cli(*args: str) -> Any:
            return CliRunner().invoke(app, ["schema", *args, "--registry", url])

        assert "id 1, version 1" in cli("register", "orders-value", "--file", str(v1)).stdout
        assert cli("register", "orders-value", "-f", str(v2)).exit_code == 0
        assert cli("list").stdout.split() == ["orders-value"]
        rows = json.loads(cli("versions", "orders-value", "-o", "json").stdout)
        assert [(r["version"], r["id"]) for r in rows] == [(1, 1), (2, 2)]
        assert json.loads(cli("get", "--id", "1", "-o", "json").stdout)["schema"]
        assert json.loads(cli("get", "orders-value").stdout) == ORDER_V2
        refused = cli("check", "orders-value", "--file", str(bad))
        assert refused.exit_code == 1
        assert "field 'id'" in refused.stderr
        assert cli("check", "orders-value", "--file", str(v2)).exit_code == 0
        assert cli("config", "orders-value", "--set", "full").stdout.strip() == "FULL"
        assert cli("config").stdout.strip() == "BACKWARD"
        assert cli("delete", "orders-value").exit_code == 0
        assert cli("delete", "orders-value", "--permanent").exit_code == 0
        missing = cli("versions", "orders-value")
        assert missing.exit_code == 1
        assert "not found. (error 40401)" in missing.stderr
        unreachable = CliRunner().invoke(
            app, ["schema", "list", "--registry", "http://127.0.0.1:1"]
        )
        assert unreachable.exit_code == 1
        assert "cannot reach the schema registry" in unreachable.stderr


class Tier(enum.Enum):
    BASIC = "basic"
    GOLD = "gold"


@dataclasses.dataclass
class Customer:
    name: str
    tier: Tier = Tier.BASIC


@dataclasses.dataclass
class Order:
    id: int
    amount: float
    customer: Customer
    tags: list[str] = dataclasses.field(default_factory=list)
    note: str | None = None
    placed: datetime.datetime | None = None


class Point(msgspec.Struct):
    x: float
    y: float
    label: str = ""


def test_typed_values_cross_with_confluents_serializers(
    node: Node, client: SchemaRegistryClient
) -> None:
    """tidemq's AvroSerializer (schema derived from a dataclass) writes what Confluent's
    AvroDeserializer reads, and the other way round; a msgspec.Struct too."""
    registry = tidemq.SchemaRegistry(node.url)
    order = Order(
        7,
        9.5,
        Customer("ada", Tier.GOLD),
        ["a", "b"],
        placed=datetime.datetime(2026, 1, 2, 3, 4, 5, 6000, tzinfo=datetime.UTC),
    )
    to_bytes = tidemq.AvroSerializer(registry, Order)
    raw = to_bytes("typed", order)
    ctx = SerializationContext("typed", MessageField.VALUE)
    theirs = AvroDeserializer(client)(raw, ctx)
    assert theirs["customer"] == {"name": "ada", "tier": "gold"}
    assert theirs["placed"] == order.placed
    assert tidemq.AvroDeserializer(registry, Order)(raw) == order
    # Confluent's serializer, tidemq's deserializer (to the dataclass).
    confluent_bytes = AvroSerializer(client, json.dumps(to_bytes.schema))(
        {
            "id": 8,
            "amount": 1.0,
            "customer": {"name": "bo", "tier": "basic"},
            "tags": [],
            "note": "hi",
            "placed": None,
        },
        ctx,
    )
    assert tidemq.AvroDeserializer(registry, Order)(confluent_bytes) == Order(
        8, 1.0, Customer("bo"), [], "hi", None
    )
    point = tidemq.AvroSerializer(registry, Point)("points", Point(1.5, 2.5))
    assert tidemq.AvroDeserializer(registry, Point)(point) == Point(1.5, 2.5)
    assert tidemq.AvroDeserializer(registry)(point) == {"x": 1.5, "y": 2.5, "label": ""}
    with pytest.raises(TypeError, match="does not fit the Avro schema"):
        to_bytes("typed", Point(1, 2))
    with pytest.raises(tidemq.TidemqError, match="not found"):
        tidemq.AvroDeserializer(registry)(frame(999, b""))


def test_json_values_cross_with_confluents_json_serde(
    node: Node, client: SchemaRegistryClient
) -> None:
    schema = {
        "title": "Sku",
        "type": "object",
        "properties": {"sku": {"type": "string"}, "qty": {"type": "integer", "minimum": 0}},
        "required": ["sku"],
    }
    registry = tidemq.SchemaRegistry(node.url)
    to_bytes = tidemq.JsonSerializer(registry, schema)
    raw = to_bytes("skus", {"sku": "A-1", "qty": 2})
    ctx = SerializationContext("skus", MessageField.VALUE)
    assert JSONDeserializer(json.dumps(schema))(raw, ctx) == {"sku": "A-1", "qty": 2}
    theirs = JSONSerializer(json.dumps(schema), client)({"sku": "B-2"}, ctx)
    assert tidemq.JsonDeserializer(registry)(theirs) == {"sku": "B-2"}
    with pytest.raises(TypeError, match=r"at /qty: -1 is less than the minimum of 0"):
        to_bytes("skus", {"sku": "A-1", "qty": -1})
    with pytest.raises(TypeError, match="'sku' is a required property"):
        tidemq.JsonDeserializer(registry)(frame(unframe(raw).schema_id, b'{"qty": 1}'))


def test_produce_and_consume_with_a_value_format(tmp_path: Path) -> None:
    """`tidemq produce --value-format avro` (JSON lines in) and `tidemq consume
    --value-format avro` (JSON out), against `tidemq server`."""
    schema = tmp_path / "order.avsc"
    schema.write_text(json.dumps(ORDER_V1))
    with server_process(tmp_path) as server:
        url, b = f"http://{server.http_address}", server.address
        runner = CliRunner()
        assert runner.invoke(app, ["topic", "create", "typed-cli", "-n", b]).exit_code == 0
        lines = '{"id": 1, "amount": 2.5}\n{"id": 2, "amount": 3.0}\n'
        produced = runner.invoke(
            app,
            ["produce", "typed-cli", "-n", b, "--value-format", "avro", "--value-schema",
             str(schema), "--registry", url],
            input=lines,
        )  # fmt: skip
        assert produced.exit_code == 0, produced.output
        # Without --value-schema: the latest registered for typed-cli-value.
        again = runner.invoke(
            app,
            ["produce", "typed-cli", "-n", b, "--value-format", "avro", "--registry", url],
            input='{"id": 3, "amount": 1}\n',
        )
        assert again.exit_code == 0, again.output
        bad = runner.invoke(
            app,
            ["produce", "typed-cli", "-n", b, "--value-format", "avro", "--registry", url],
            input='{"id": "x", "amount": 1}\n',
        )
        assert bad.exit_code == 2
        assert "line 1" in bad.stderr
        consumed = runner.invoke(
            app,
            ["consume", "typed-cli", "-n", b, "--from-beginning", "--max-messages", "3",
             "--value-format", "avro", "--registry", url],
        )  # fmt: skip
        assert consumed.exit_code == 0, consumed.output
        assert [json.loads(line) for line in consumed.stdout.splitlines()] == [
            {"id": 1, "amount": 2.5},
            {"id": 2, "amount": 3.0},
            {"id": 3, "amount": 1.0},
        ]


def test_a_schemas_topic_that_is_not_compact_is_refused(tmp_path: Path) -> None:
    broker = ThreadedBroker(broker_config(tmp_path / "broker"))
    broker.start()
    try:
        with tidemq.Admin(broker.address) as admin:
            admin.create_topic("_schemas", 1)  # delete policy: schemas would expire
        listener = HttpListener(broker.address, port=0)
        with pytest.raises(RegistryError, match=r"cleanup\.policy=delete"):
            broker.call(listener.start())
    finally:
        broker.stop()


def test_a_producer_with_a_value_serializer_and_a_consumer_with_a_deserializer(
    node: Node,
) -> None:
    registry = tidemq.SchemaRegistry(node.url)
    to_bytes, from_bytes = (
        tidemq.AvroSerializer(registry, Point),
        tidemq.AvroDeserializer(registry, Point),
    )
    address = node.broker.address
    with tidemq.Admin(address) as admin:
        admin.create_topic("points-sync", 1)
        admin.create_topic("points-async", 1)
    with tidemq.Producer(address, value_serializer=to_bytes) as producer:
        producer.send("points-sync", Point(1, 2))
        producer.send_batch("points-sync", [Point(3, 4), None])  # None: a tombstone
        with pytest.raises(TypeError, match="does not fit the Avro schema"):
            producer.send("points-sync", {"x": "not a number"})

    async def send_async() -> None:
        async with tidemq.aio.Producer(address, value_serializer=to_bytes) as producer:
            to_bytes.prepare("points-async")
            await producer.send("points-async", Point(5, 6, "a"))
            await producer.send_batch("points-async", [Point(7, 8)])

    asyncio.run(send_async())
    for topic, expected in (
        ("points-sync", [Point(1, 2), Point(3, 4), None]),
        ("points-async", [Point(5, 6, "a"), Point(7, 8)]),
    ):
        # The consumer's value_deserializer gives the Points back (tombstones stay None).
        with tidemq.StreamConsumer(
            address, start="earliest", value_deserializer=from_bytes
        ) as consumer:
            consumer.assign([(topic, 0)])
            got: list[tidemq.Message[Point | None]] = []
            for _ in range(50):
                got += consumer.poll(timeout_ms=100)
                if len(got) >= len(expected):
                    break
        assert [m.value for m in got] == expected


def test_generate_events_writes_typed_avro_events(node: Node) -> None:
    """`tidemq pipeline generate-events --value-format avro`: the events' schema is
    registered from the Event dataclass and every value reads back as an Event."""
    from tidemq.spark.pipelines.events import Event  # noqa: PLC0415 - no pyspark needed

    address = node.broker.address
    args = ["pipeline", "generate-events", "--bootstrap", address, "--topic", "behaviour"]
    args += ["--count", "50", "--users", "5", "--value-format", "avro", "--registry", node.url]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "sent 50 event(s)" in result.output
    registry = tidemq.SchemaRegistry(node.url)
    assert registry.version("behaviour-value")["name"] == "Event"
    with tidemq.StreamConsumer(
        address, start="earliest", value_deserializer=tidemq.AvroDeserializer(registry, Event)
    ) as consumer:
        consumer.assign([("behaviour", q) for q in range(4)])
        got: list[tidemq.Message[Event | None]] = []
        for _ in range(50):
            got += consumer.poll(timeout_ms=100)
            if len(got) >= 50:
                break
    assert len(got) == 50
    assert all(isinstance(m.value, Event) and m.key == str(m.value.user_id).encode() for m in got)


def _order_class(*, price: bool = False, id_type: int = 3) -> Any:
    """A Protobuf message class `shop.Order` built at run time (what protoc would
    generate): id (int64 by default), item, and optionally price."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # noqa: PLC0415

    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="shop/order.proto", package="shop")
    proto.syntax = "proto3"
    order = proto.message_type.add(name="Order")
    order.field.add(name="id", number=1, type=id_type, label=f.LABEL_OPTIONAL)
    order.field.add(name="item", number=2, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    if price:
        order.field.add(name="price", number=3, type=f.TYPE_DOUBLE, label=f.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Order"))


def test_protobuf_values_cross_with_confluents_serializers(
    node: Node, client: SchemaRegistryClient
) -> None:
    """confluent-kafka's ProtobufSerializer registers the serialized descriptor with
    tidemq's registry; what it writes tidemq's ProtobufDeserializer reads, and the other
    way round; a compatible evolution is accepted, a field's type change refused."""
    from confluent_kafka.schema_registry.protobuf import (  # noqa: PLC0415
        ProtobufDeserializer as ConfluentPbDeserializer,
    )
    from confluent_kafka.schema_registry.protobuf import (  # noqa: PLC0415
        ProtobufSerializer as ConfluentPbSerializer,
    )

    order = _order_class()
    ctx = SerializationContext("pb-orders", MessageField.VALUE)
    # The .proto text form first, as Confluent's Java tools register it: the serializer's
    # serialized form of the same messages is the same schema (one id, one version).
    text = 'syntax = "proto3";\npackage shop;\nmessage Order { int64 id = 1; string item = 2; }\n'
    text_id = client.register_schema("pb-orders-value", Schema(text, "PROTOBUF"))
    theirs = ConfluentPbSerializer(order, client, {"use.deprecated.format": False})
    written = theirs(order(id=7, item="book"), ctx)
    assert written is not None
    ours = tidemq.ProtobufDeserializer(order)
    assert (ours(written).id, ours(written).item) == (7, "book")

    assert unframe(written).schema_id == text_id
    assert client.get_versions("pb-orders-value") == [1]
    assert client.get_schema(text_id).schema_str == text.strip()  # returned as registered
    registry = tidemq.SchemaRegistry(node.url)
    to_bytes = tidemq.ProtobufSerializer(registry, order)
    mine = to_bytes("pb-orders", order(id=8, item="pen"))
    assert unframe(mine).schema_id == unframe(written).schema_id  # the same schema, one id
    read = ConfluentPbDeserializer(order, {"use.deprecated.format": False})(mine, ctx)
    assert (read.id, read.item) == (8, "pen")
    assert client.get_latest_version("pb-orders-value").schema.schema_type == "PROTOBUF"

    # Evolution: a new field is compatible; changing id from int64 to string is not.
    v2 = tidemq.ProtobufSerializer(registry, _order_class(price=True))
    assert v2.prepare("pb-orders") != unframe(mine).schema_id
    with pytest.raises(tidemq.TidemqError, match=r"field 1 .id. of shop\.Order changed type"):
        tidemq.ProtobufSerializer(registry, _order_class(id_type=9)).prepare("pb-orders")
    with pytest.raises(TypeError, match=r"expected a shop\.Order"):
        to_bytes("pb-orders", "not a message")


def test_produce_and_consume_protobuf_json_lines(node: Node) -> None:
    """`tidemq produce --value-format protobuf`: JSON lines as the first message of the
    latest Protobuf schema of `<topic>-value`; `tidemq consume --value-format protobuf`
    prints them back (the writer's message type, built from the registered schema)."""
    b, url = node.broker.address, node.url
    order = _order_class()
    tidemq.ProtobufSerializer(tidemq.SchemaRegistry(url), order).prepare("pb-cli")
    runner = CliRunner()
    assert runner.invoke(app, ["topic", "create", "pb-cli", "-n", b]).exit_code == 0
    produced = runner.invoke(
        app,
        ["produce", "pb-cli", "-n", b, "--value-format", "protobuf", "--registry", url],
        input='{"id": 1, "item": "book"}\n{"id": "2", "item": "pen"}\n',
    )
    assert produced.exit_code == 0, produced.output
    bad = runner.invoke(
        app,
        ["produce", "pb-cli", "-n", b, "--value-format", "protobuf", "--registry", url],
        input='{"nope": 1}\n',
    )
    assert bad.exit_code == 2
    assert "line 1" in bad.stderr
    consumed = runner.invoke(
        app,
        ["consume", "pb-cli", "-n", b, "--from-beginning", "--max-messages", "2",
         "--value-format", "protobuf", "--registry", url],
    )  # fmt: skip
    assert consumed.exit_code == 0, consumed.output
    assert [json.loads(line) for line in consumed.stdout.splitlines()] == [
        {"id": "1", "item": "book"},  # proto3 JSON writes int64 as a string
        {"id": "2", "item": "pen"},
    ]
    # What the CLI wrote, a generated class reads.
    with tidemq.StreamConsumer(
        b, start="earliest", value_deserializer=tidemq.ProtobufDeserializer(order)
    ) as consumer:
        consumer.assign([("pb-cli", 0)])
        got: list[Any] = []
        for _ in range(50):
            got += consumer.poll(timeout_ms=100)
            if len(got) >= 2:
                break
    assert [(m.value.id, m.value.item) for m in got] == [(1, "book"), (2, "pen")]


def test_a_producer_with_a_key_serializer(node: Node) -> None:
    """`key_serializer(topic, key) -> bytes` turns every key (of a message, of a batch)
    into its bytes; the key's queue is the serialized key's."""
    address = node.broker.address
    with tidemq.Admin(address) as admin:
        admin.create_topic("keyed", 4)

    def user_key(topic: str, key: object) -> bytes:
        assert topic == "keyed"
        return f"user-{key}".encode()

    with tidemq.Producer(address, key_serializer=user_key) as producer:
        one = producer.send("keyed", b"a", key=7)
        batch = producer.send_batch("keyed", [b"b", b"c"], keys=[7, 7])
    with tidemq.Producer(address) as plain:
        same = plain.send("keyed", b"d", key=b"user-7")
    assert one.queue == batch[0].queue == same.queue
    with tidemq.StreamConsumer(address, start="earliest") as consumer:
        consumer.assign([("keyed", one.queue)])
        got: list[tidemq.Message] = []
        for _ in range(50):
            got += consumer.poll(timeout_ms=100)
            if len(got) >= 4:
                break
    assert {m.key for m in got} == {b"user-7"}


def _invoice_class() -> Any:
    """`shop.Invoice` in invoice.proto, importing `shop.Money` from shop/money.proto."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # noqa: PLC0415

    f = descriptor_pb2.FieldDescriptorProto
    money = descriptor_pb2.FileDescriptorProto(name="shop/money.proto", package="shop")
    money.syntax = "proto3"
    m = money.message_type.add(name="Money")
    m.field.add(name="cents", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    invoice = descriptor_pb2.FileDescriptorProto(name="shop/invoice.proto", package="shop")
    invoice.syntax = "proto3"
    invoice.dependency.append("shop/money.proto")
    i = invoice.message_type.add(name="Invoice")
    i.field.add(name="id", number=1, type=f.TYPE_INT64, label=f.LABEL_OPTIONAL)
    total = i.field.add(name="total", number=2, type=f.TYPE_MESSAGE, label=f.LABEL_OPTIONAL)
    total.type_name = ".shop.Money"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(money)
    pool.Add(invoice)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Invoice"))


def test_protobuf_imports_are_registered_as_references(
    node: Node, client: SchemaRegistryClient
) -> None:
    """tidemq's ProtobufSerializer registers an imported file under its name and names it
    as a reference, as Confluent's does: both register one schema, and Confluent's
    deserializer (which resolves the references) reads what tidemq wrote."""
    from confluent_kafka.schema_registry.protobuf import (  # noqa: PLC0415
        ProtobufDeserializer as ConfluentPbDeserializer,
    )
    from confluent_kafka.schema_registry.protobuf import (  # noqa: PLC0415
        ProtobufSerializer as ConfluentPbSerializer,
    )

    invoice = _invoice_class()
    value = invoice(id=3)
    value.total.cents = 1250
    ours = tidemq.ProtobufSerializer(tidemq.SchemaRegistry(node.url), invoice)
    written = ours("pb-invoices", value)
    latest = client.get_latest_version("pb-invoices-value")
    assert [(r.name, r.subject) for r in latest.schema.references or []] == [
        ("shop/money.proto", "shop/money.proto")
    ]
    ctx = SerializationContext("pb-invoices", MessageField.VALUE)
    theirs = ConfluentPbSerializer(invoice, client, {"use.deprecated.format": False})
    assert unframe(theirs(value, ctx)).schema_id == unframe(written).schema_id
    read = ConfluentPbDeserializer(invoice, {"use.deprecated.format": False})(written, ctx)
    assert (read.id, read.total.cents) == (3, 1250)
    assert tidemq.ProtobufDeserializer(invoice)(written).total.cents == 1250
