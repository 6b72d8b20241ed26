"""`valueFormat=protobuf` with a schema that imports another registered schema (a
reference), written by confluent-kafka's ProtobufSerializer from a class with an import:
the source reads it as a struct and the sink writes that struct back, the message types
built from the registry alone (no generated class on the driver or the executors)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer, ProtobufSerializer
from confluent_kafka.serialization import MessageField, SerializationContext
from pyspark.sql import SparkSession
from tests.support.protobuf_invoice import invoice_class

from tidemq import Admin, Producer

if TYPE_CHECKING:
    from tests.spark.conftest import Load, ThreadedBroker

pytestmark = pytest.mark.spark


@pytest.fixture
def client(registry_url: str) -> Iterator[SchemaRegistryClient]:
    registry = SchemaRegistryClient({"url": registry_url})
    try:
        yield registry
    finally:
        registry.close()


def test_protobuf_values_with_an_import_are_read_and_written(
    spark: SparkSession,
    admin: Admin,
    producer: Producer,
    broker: ThreadedBroker,
    topic_name: str,
    load: Load,
    registry_url: str,
    client: SchemaRegistryClient,
) -> None:
    admin.create_topic(topic_name, 2)
    cls = invoice_class()
    serialize = ProtobufSerializer(cls, client, {"use.deprecated.format": False})
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    for i in range(4):
        value = cls(id=i)
        value.total.cents = 100 * i
        value.lines.add(sku=f"sku-{i}").price.cents = 100 * i
        written = serialize(value, ctx)
        assert written is not None
        producer.send(topic_name, written, queue=i % 2)
    producer.flush()
    refs = client.get_latest_version(f"{topic_name}-value").schema.references or []
    assert [r.name for r in refs] == ["shop/money.proto"]

    df = load(subscribe=topic_name, valueFormat="protobuf", schemaRegistry=registry_url)
    assert df.schema["value"].dataType.simpleString() == (
        "struct<id:bigint,total:struct<cents:bigint,currency:string>,"
        "lines:array<struct<sku:string,price:struct<cents:bigint,currency:string>>>>"
    )
    rows = sorted(
        (r.id, r.total.cents, [(x.sku, x.price.cents) for x in r.lines])
        for r in df.select("value.*").collect()
    )
    assert rows == [(i, 100 * i, [(f"sku-{i}", 100 * i)]) for i in range(4)]

    # The sink encodes a struct as the same message (the subject's schema, with its
    # import), and confluent-kafka's deserializer reads it.
    target = topic_name + "-copy"
    admin.create_topic(target, 1)
    df.selectExpr(
        "named_struct('id', value.id + 10, 'total', value.total, 'lines', value.lines) as value"
    ).write.mode("append").format("tidemq").options(
        bootstrap=broker.address,
        topic=target,
        valueFormat="protobuf",
        schemaRegistry=registry_url,
        subject=f"{topic_name}-value",
    ).save()
    read = ProtobufDeserializer(cls, {"use.deprecated.format": False})
    copied = sorted(
        (m.id, m.total.cents, m.lines[0].price.cents)
        for m in (read(r.value, ctx) for r in load(subscribe=target).collect())
    )
    assert copied == [(i + 10, 100 * i, 100 * i) for i in range(4)]
