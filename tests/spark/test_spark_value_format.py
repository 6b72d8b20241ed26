"""`valueFormat=avro` and `json`: the source decodes Confluent-framed values into a struct
column (Avro written with an older compatible schema included); bad options and values
fail clearly."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

import tidemq
from tidemq import Admin, Producer
from tidemq.client.avro_types import avro_schema_of

if TYPE_CHECKING:
    from tests.spark.conftest import Load, ThreadedBroker

pytestmark = pytest.mark.spark


@dataclasses.dataclass
class View:
    user_id: int
    item: str


@dataclasses.dataclass
class ViewV2:
    user_id: int
    item: str
    price: float = 0.0


def test_avro_values_read_as_a_struct(
    admin: Admin, producer: Producer, topic_name: str, load: Load, registry_url: str
) -> None:
    admin.create_topic(topic_name, 2)
    registry = tidemq.SchemaRegistry(registry_url)
    v1 = tidemq.AvroSerializer(registry, View)
    v2 = tidemq.AvroSerializer(registry, {**avro_schema_of(ViewV2), "name": "View"})
    for i in range(5):
        producer.send(topic_name, v1(topic_name, View(i, f"item-{i}")), queue=i % 2)
    for i in range(5, 8):
        producer.send(
            topic_name, v2(topic_name, {"user_id": i, "item": "x", "price": 2.5}), queue=0
        )
    producer.send(topic_name, None, queue=1)  # a tombstone: a null struct
    producer.flush()
    df = load(subscribe=topic_name, valueFormat="avro", schemaRegistry=registry_url)
    assert (
        df.schema["value"].dataType.simpleString()
        == "struct<user_id:bigint,item:string,price:double>"
    )
    rows = sorted(
        (r["value"]["user_id"], r["value"]["item"], r["value"]["price"])
        for r in df.select("value").collect()
        if r["value"] is not None
    )
    assert rows == [(i, f"item-{i}", 0.0) for i in range(5)] + [(i, "x", 2.5) for i in range(5, 8)]
    assert df.filter("value is null").count() == 1
    # Spark SQL over the struct's fields.
    assert df.selectExpr("sum(value.price)").collect()[0][0] == 7.5


def test_value_format_errors_are_clear(
    spark: SparkSession,
    admin: Admin,
    producer: Producer,
    topic_name: str,
    load: Load,
    registry_url: str,
) -> None:
    admin.create_topic(topic_name, 1)
    with pytest.raises(PySparkException, match="needs schemaRegistry"):
        load(subscribe=topic_name, valueFormat="avro").collect()
    with pytest.raises(PySparkException, match="valueFormat must be raw, avro, json or protobuf"):
        load(subscribe=topic_name, valueFormat="xml", schemaRegistry=registry_url).collect()
    with pytest.raises(PySparkException, match="not found"):
        load(subscribe=topic_name, valueFormat="avro", schemaRegistry=registry_url).collect()
    registry = tidemq.SchemaRegistry(registry_url)
    producer.send(topic_name, tidemq.AvroSerializer(registry, View)(topic_name, View(1, "a")))
    producer.send(topic_name, b"plain bytes")
    producer.flush()
    with pytest.raises(Exception, match=r"offset 1: the value is not Avro"):
        load(subscribe=topic_name, valueFormat="avro", schemaRegistry=registry_url).collect()


ORDER_SCHEMA = {
    "title": "Order",
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "item": {"type": "string"},
        "price": {"type": ["number", "null"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "buyer": {"type": "object", "properties": {"name": {"type": "string"}}},
    },
    "required": ["id", "item"],
}


def test_json_values_read_as_a_struct(
    admin: Admin, producer: Producer, topic_name: str, load: Load, registry_url: str
) -> None:
    admin.create_topic(topic_name, 1)
    serialize = tidemq.JsonSerializer(tidemq.SchemaRegistry(registry_url), ORDER_SCHEMA)
    for i in range(4):
        order = {"id": i, "item": f"item-{i}", "tags": ["a"] * i, "buyer": {"name": "ann"}}
        if i % 2:
            order["price"] = 1.5 * i
        producer.send(topic_name, serialize(topic_name, order))
    producer.flush()
    df = load(subscribe=topic_name, valueFormat="json", schemaRegistry=registry_url)
    assert df.schema["value"].dataType.simpleString() == (
        "struct<id:bigint,item:string,price:double,tags:array<string>,buyer:struct<name:string>>"
    )
    rows = sorted(
        (r.id, r.item, r.price, list(r.tags), r.buyer.name) for r in df.select("value.*").collect()
    )
    assert rows == [
        (i, f"item-{i}", 1.5 * i if i % 2 else None, ["a"] * i, "ann") for i in range(4)
    ]
    producer.send(topic_name, b"\x00\x00\x00\x00\x01" + b'{"id": "not a number"}')
    producer.flush()
    with pytest.raises(Exception, match=r"offset 4: the JSON value does not fit"):
        load(subscribe=topic_name, valueFormat="json", schemaRegistry=registry_url).collect()


def test_a_struct_value_is_written_as_avro_and_read_back(
    spark: SparkSession,
    admin: Admin,
    broker: ThreadedBroker,
    topic_name: str,
    load: Load,
    registry_url: str,
) -> None:
    """The writer encodes a struct `value` column: with no schema under the subject yet,
    one derived from the struct is registered; the values read back as the same struct,
    and tidemq's (and so Confluent's) deserializer reads them too."""
    admin.create_topic(topic_name, 2)
    rows = [(i, f"item-{i}", None if i % 3 == 0 else 1.5 * i, ["a"] * (i % 3)) for i in range(9)]
    df = spark.createDataFrame(
        rows, "user_id long, item string, price double, tags array<string>"
    ).selectExpr("struct(*) as value", "cast(user_id as string) as key")
    writer = (
        df.write.mode("append")
        .format("tidemq")
        .option("bootstrap", broker.address)
        .option("topic", topic_name)
    )
    writer.option("valueFormat", "avro").option("schemaRegistry", registry_url).save()
    registry = tidemq.SchemaRegistry(registry_url)
    schema = registry.version(f"{topic_name}-value")
    assert schema["name"] == "topLevelRecord"
    assert [f["name"] for f in schema["fields"]] == ["user_id", "item", "price", "tags"]

    back = load(subscribe=topic_name, valueFormat="avro", schemaRegistry=registry_url)
    got = sorted(
        (r.user_id, r.item, r.price, list(r.tags or [])) for r in back.select("value.*").collect()
    )
    assert got == sorted((i, item, price, tags) for i, item, price, tags in rows)
    raw = load(subscribe=topic_name).select("value").collect()
    decode = tidemq.AvroDeserializer(registry)
    assert sorted(decode(r.value)["user_id"] for r in raw) == list(range(9))

    # A second write with the subject registered now uses its schema; a struct that does
    # not fit it fails naming the row.
    df.write.mode("append").format("tidemq").option("bootstrap", broker.address).option(
        "topic", topic_name
    ).option("valueFormat", "avro").option("schemaRegistry", registry_url).save()
    assert load(subscribe=topic_name).count() == 18
    bad = spark.createDataFrame([("x",)], "user_id string").selectExpr("struct(*) as value")
    with pytest.raises(Exception, match="does not fit the subject's Avro schema"):
        bad.write.mode("append").format("tidemq").option("bootstrap", broker.address).option(
            "topic", topic_name
        ).option("valueFormat", "avro").option("schemaRegistry", registry_url).save()
    with pytest.raises(PySparkException, match="writes a struct 'value' column"):
        spark.createDataFrame([(b"x",)], "value binary").write.mode("append").format(
            "tidemq"
        ).option("bootstrap", broker.address).option("topic", topic_name).option(
            "valueFormat", "avro"
        ).option("schemaRegistry", registry_url).save()


def test_a_stream_of_avro_structs_is_written_exactly_once_as_avro(
    spark: SparkSession,
    admin: Admin,
    producer: Producer,
    broker: ThreadedBroker,
    topic_name: str,
    load: Load,
    registry_url: str,
    tmp_path: Path,
) -> None:
    """Read Avro as a struct, change it with Spark SQL, write it with the exactly-once
    sink as Avro under the target's subject."""
    source, target = topic_name + "-in", topic_name + "-out"
    admin.create_topic(source, 2)
    admin.create_topic(target, 2)
    registry = tidemq.SchemaRegistry(registry_url)
    serialize = tidemq.AvroSerializer(registry, View)
    for i in range(10):
        producer.send(source, serialize(source, View(i, f"item-{i}")), queue=i % 2)
    producer.flush()
    stream = (
        spark.readStream.format("tidemq")
        .option("bootstrap", broker.address)
        .option("subscribe", source)
        .option("startingOffsets", "earliest")
        .option("valueFormat", "avro")
        .option("schemaRegistry", registry_url)
        .load()
        .selectExpr("named_struct('user_id', value.user_id * 10, 'item', value.item) as value")
    )
    query = (
        stream.writeStream.format("tidemq")
        .option("bootstrap", broker.address)
        .option("topic", target)
        .option("sinkId", target + "-sink")
        .option("valueFormat", "avro")
        .option("schemaRegistry", registry_url)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    back = load(subscribe=target, valueFormat="avro", schemaRegistry=registry_url)
    assert sorted((r.user_id, r.item) for r in back.select("value.*").collect()) == [
        (i * 10, f"item-{i}") for i in range(10)
    ]


def _shipment_class() -> Any:
    """`shop.Shipment` (built at run time): id, a nested Address, repeated tags, an enum,
    a map of counts."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory  # noqa: PLC0415

    f = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="shop/shipment.proto", package="shop")
    proto.syntax = "proto3"
    speed = proto.enum_type.add(name="Speed")
    speed.value.add(name="STANDARD", number=0)
    speed.value.add(name="EXPRESS", number=1)
    address = proto.message_type.add(name="Address")
    address.field.add(name="city", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    shipment = proto.message_type.add(name="Shipment")
    entry = shipment.nested_type.add(name="CountsEntry")
    entry.options.map_entry = True
    entry.field.add(name="key", number=1, type=f.TYPE_STRING, label=f.LABEL_OPTIONAL)
    entry.field.add(name="value", number=2, type=f.TYPE_INT32, label=f.LABEL_OPTIONAL)
    for name, number, ftype, label, type_name in (
        ("id", 1, f.TYPE_INT64, f.LABEL_OPTIONAL, ""),
        ("to", 2, f.TYPE_MESSAGE, f.LABEL_OPTIONAL, ".shop.Address"),
        ("tags", 3, f.TYPE_STRING, f.LABEL_REPEATED, ""),
        ("speed", 4, f.TYPE_ENUM, f.LABEL_OPTIONAL, ".shop.Speed"),
        ("counts", 5, f.TYPE_MESSAGE, f.LABEL_REPEATED, ".shop.Shipment.CountsEntry"),
    ):
        field = shipment.field.add(name=name, number=number, type=ftype, label=label)
        if type_name:
            field.type_name = type_name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("shop.Shipment"))


def test_protobuf_values_read_as_a_struct(
    admin: Admin, producer: Producer, topic_name: str, load: Load, registry_url: str
) -> None:
    admin.create_topic(topic_name, 1)
    shipment = _shipment_class()
    serialize = tidemq.ProtobufSerializer(tidemq.SchemaRegistry(registry_url), shipment)
    for i in range(3):
        value = shipment(id=i, tags=["a"] * i, speed=i % 2, counts={"x": i})
        if i:
            value.to.city = f"city-{i}"
        producer.send(topic_name, serialize(topic_name, value))
    producer.flush()
    df = load(
        subscribe=topic_name,
        valueFormat="protobuf",
        schemaRegistry=registry_url,
        protobufMessage="shop.Shipment",
    )
    assert df.schema["value"].dataType.simpleString() == (
        "struct<id:bigint,to:struct<city:string>,tags:array<string>,speed:string,"
        "counts:map<string,int>>"
    )
    rows = sorted(
        (r.id, r.to.city if r.to else None, list(r.tags), r.speed, dict(r.counts))
        for r in df.select("value.*").collect()
    )
    assert rows == [
        (0, None, [], "STANDARD", {"x": 0}),
        (1, "city-1", ["a"], "EXPRESS", {"x": 1}),
        (2, "city-2", ["a", "a"], "STANDARD", {"x": 2}),
    ]


def test_a_struct_value_is_written_as_protobuf_and_read_back(
    spark: SparkSession,
    admin: Admin,
    broker: ThreadedBroker,
    topic_name: str,
    load: Load,
    registry_url: str,
) -> None:
    """Writes with valueFormat=protobuf encode the struct as the subject's message (here
    not the file's first: protobufMessage names it); what Spark wrote reads back as the
    same struct, and as messages of the class."""
    admin.create_topic(topic_name, 1)
    shipment = _shipment_class()
    tidemq.ProtobufSerializer(tidemq.SchemaRegistry(registry_url), shipment).prepare(topic_name)
    df = spark.createDataFrame(
        [(1, "paris", ["a"], "EXPRESS", {"x": 2}), (2, None, [], "STANDARD", {})],
        "id long, city string, tags array<string>, speed string, counts map<string,int>",
    ).selectExpr(
        "named_struct('id', id, 'to', if(city is null, null, named_struct('city', city)),"
        " 'tags', tags, 'speed', speed, 'counts', counts) as value"
    )
    options = {"bootstrap": broker.address, "topic": topic_name, "valueFormat": "protobuf",
               "schemaRegistry": registry_url, "protobufMessage": "shop.Shipment"}  # fmt: skip
    df.write.mode("append").format("tidemq").options(**options).save()
    back = load(
        subscribe=topic_name,
        valueFormat="protobuf",
        schemaRegistry=registry_url,
        protobufMessage="shop.Shipment",
    )
    rows = sorted(
        (r.id, r.to.city if r.to else None, list(r.tags), r.speed, dict(r.counts))
        for r in back.select("value.*").collect()
    )
    assert rows == [(1, "paris", ["a"], "EXPRESS", {"x": 2}), (2, None, [], "STANDARD", {})]
    read = tidemq.ProtobufDeserializer(shipment)
    values = [read(r.value) for r in load(subscribe=topic_name).collect()]
    assert sorted(v.id for v in values) == [1, 2]
