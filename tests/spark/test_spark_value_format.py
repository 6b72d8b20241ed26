"""`valueFormat=avro` and `json`: the source decodes Confluent-framed values into a struct
column (Avro written with an older compatible schema included); bad options and values
fail clearly."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from pyspark.errors import PySparkException
from pyspark.sql import SparkSession

import tidemq
from tidemq import Admin, Producer
from tidemq.client.avro_types import avro_schema_of
from tidemq.http.listener import HttpListener

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


@pytest.fixture
def registry_url(broker: ThreadedBroker) -> Iterator[str]:
    listener = HttpListener(broker.address, port=0)
    url = "http://" + broker.call(listener.start())
    try:
        yield url
    finally:
        broker.call(listener.stop())


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
    with pytest.raises(PySparkException, match="valueFormat must be raw, avro or json"):
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
