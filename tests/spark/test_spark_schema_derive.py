"""Writes with `valueFormat=protobuf` or `json` to a subject that has no schema derive one
from the struct `value` column and register it (as Avro's writes do), batch and with the
exactly-once streaming sink; confluent-kafka's deserializers read what Spark wrote, and
so does the source."""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.json_schema import JSONDeserializer
from confluent_kafka.schema_registry.protobuf import ProtobufDeserializer
from confluent_kafka.serialization import MessageField, SerializationContext
from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    message_factory,
    timestamp_pb2,  # noqa: F401 - the well-known type joins the pool
)
from pyspark.errors import PySparkException
from pyspark.sql import DataFrame, SparkSession

from tidemq import Admin, Producer

if TYPE_CHECKING:
    from tests.spark.conftest import Load, ThreadedBroker

pytestmark = pytest.mark.spark

AT = dt.datetime(2024, 5, 1, 12, 30, tzinfo=dt.UTC)
#: (id, price, city, tags, counts)
ROWS = [
    (1, 9.5, "paris", ["a", "b"], {"x": 1}),
    (2, None, None, [], {}),
    (3, 0.0, "oslo", ["c"], {"y": 2, "z": 3}),
]


@pytest.fixture
def client(registry_url: str) -> Iterator[SchemaRegistryClient]:
    registry = SchemaRegistryClient({"url": registry_url})
    try:
        yield registry
    finally:
        registry.close()


def _orders(spark: SparkSession) -> DataFrame:
    return spark.createDataFrame(
        ROWS, "id long, price double, city string, tags array<string>, counts map<string,int>"
    ).selectExpr(
        "named_struct('id', id, 'price', price, 'to', if(city is null, null, "
        "named_struct('city', city)), 'tags', tags, 'counts', counts, "
        "'at', timestamp'2024-05-01 12:30:00') as value"
    )


def _write(df: DataFrame, broker: ThreadedBroker, topic: str, fmt: str, registry: str) -> None:
    df.write.mode("append").format("tidemq").options(
        bootstrap=broker.address, topic=topic, valueFormat=fmt, schemaRegistry=registry
    ).save()


def _read_back(load: Load, topic: str, fmt: str, registry: str) -> list[tuple[Any, ...]]:
    df = load(subscribe=topic, valueFormat=fmt, schemaRegistry=registry)
    return sorted(
        (r.id, r.price, r.to.city if r.to else None, list(r.tags), dict(r.counts), r.at)
        for r in df.select("value.*").collect()
    )


def _expected() -> list[tuple[Any, ...]]:
    # Spark hands timestamps back naive, in the session's time zone (UTC here).
    return [(i, p, c, t, m, AT.replace(tzinfo=None)) for i, p, c, t, m in ROWS]


def _class_of(client: SchemaRegistryClient, schema_id: int) -> Any:
    """The message class of a registered schema, built by protobuf itself (not tidemq)."""
    text = client.get_schema(schema_id, fmt="serialized").schema_str
    assert text is not None
    proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text))
    pool = descriptor_pool.DescriptorPool()
    for dep in proto.dependency:
        pool.AddSerializedFile(descriptor_pool.Default().FindFileByName(dep).serialized_pb)
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("topLevelRecord"))


def test_a_struct_is_written_as_protobuf_with_a_derived_schema(
    spark: SparkSession,
    admin: Admin,
    broker: ThreadedBroker,
    topic_name: str,
    load: Load,
    registry_url: str,
    client: SchemaRegistryClient,
) -> None:
    admin.create_topic(topic_name, 2)
    _write(_orders(spark), broker, topic_name, "protobuf", registry_url)
    latest = client.get_latest_version(f"{topic_name}-value")
    assert latest.schema.schema_type == "PROTOBUF"
    assert latest.schema_id is not None
    cls = _class_of(client, latest.schema_id)
    fields = cls.DESCRIPTOR.fields_by_name
    assert list(fields) == ["id", "price", "to", "tags", "counts", "at"]
    assert fields["to"].message_type.full_name == "topLevelRecord.To"
    assert fields["at"].message_type.full_name == "google.protobuf.Timestamp"

    # confluent-kafka's deserializer reads what Spark wrote.
    read = ProtobufDeserializer(cls, {"use.deprecated.format": False})
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    messages = sorted(
        (read(r.value, ctx) for r in load(subscribe=topic_name).collect()), key=lambda m: m.id
    )
    assert [(m.id, m.HasField("price"), m.to.city, list(m.tags)) for m in messages] == [
        (1, True, "paris", ["a", "b"]),
        (2, False, "", []),
        (3, True, "oslo", ["c"]),
    ]
    assert messages[0].at.ToDatetime(tzinfo=dt.UTC) == AT
    # So does the source: null stays null, the timestamp is a timestamp.
    assert _read_back(load, topic_name, "protobuf", registry_url) == _expected()

    # A struct that has no Protobuf type is refused before anything is written.
    other = topic_name + "-bad"
    admin.create_topic(other, 1)
    nested = spark.createDataFrame([([[1]],)], "a array<array<int>>").selectExpr(
        "struct(*) as value"
    )
    with pytest.raises(PySparkException, match=r"topLevelRecord\.a \(element\)"):
        _write(nested, broker, other, "protobuf", registry_url)


def test_a_struct_is_written_as_json_with_a_derived_schema(
    spark: SparkSession,
    admin: Admin,
    broker: ThreadedBroker,
    topic_name: str,
    load: Load,
    registry_url: str,
    client: SchemaRegistryClient,
) -> None:
    admin.create_topic(topic_name, 1)
    _write(_orders(spark), broker, topic_name, "json", registry_url)
    latest = client.get_latest_version(f"{topic_name}-value")
    assert latest.schema.schema_type == "JSON"
    schema = json.loads(latest.schema.schema_str or "")
    assert list(schema["properties"]) == ["id", "price", "to", "tags", "counts", "at"]
    assert schema["properties"]["counts"]["additionalProperties"] == {"type": ["integer", "null"]}

    # confluent-kafka's deserializer (validating against the registered schema) reads it.
    read = JSONDeserializer(None, schema_registry_client=client)
    ctx = SerializationContext(topic_name, MessageField.VALUE)
    values = sorted(
        (read(r.value, ctx) for r in load(subscribe=topic_name).collect()), key=lambda v: v["id"]
    )
    assert values[0] == {
        "id": 1,
        "price": 9.5,
        "to": {"city": "paris"},
        "tags": ["a", "b"],
        "counts": {"x": 1},  # a map is an object, not a list of pairs
        "at": "2024-05-01T12:30:00+00:00",
    }
    got = _read_back(load, topic_name, "json", registry_url)
    assert [row[:5] for row in got] == [row[:5] for row in _expected()]
    assert {row[5] for row in got} == {"2024-05-01T12:30:00+00:00"}  # JSON carries text


def test_a_stream_is_written_exactly_once_with_derived_schemas(
    spark: SparkSession,
    admin: Admin,
    producer: Producer,
    broker: ThreadedBroker,
    topic_name: str,
    load: Load,
    registry_url: str,
    client: SchemaRegistryClient,
    tmp_path: Path,
) -> None:
    """The exactly-once sink derives and registers the schema on its first batch too."""
    source = topic_name + "-in"
    admin.create_topic(source, 2)
    for i in range(6):
        producer.send(source, str(i).encode(), queue=i % 2)
    producer.flush()
    for fmt in ("protobuf", "json"):
        target = f"{topic_name}-{fmt}"
        admin.create_topic(target, 1)
        stream = (
            spark.readStream.format("tidemq")
            .options(bootstrap=broker.address, subscribe=source, startingOffsets="earliest")
            .load()
            .selectExpr(
                "named_struct('n', cast(cast(value as string) as int), "
                "'even', cast(value as string) % 2 = 0) as value"
            )
        )
        query = (
            stream.writeStream.format("tidemq")
            .options(bootstrap=broker.address, topic=target, sinkId=target + "-sink")
            .options(valueFormat=fmt, schemaRegistry=registry_url)
            .option("checkpointLocation", str(tmp_path / fmt))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()
        assert client.get_latest_version(f"{target}-value").schema.schema_type == fmt.upper()
        back = load(subscribe=target, valueFormat=fmt, schemaRegistry=registry_url)
        assert sorted((r.n, r.even) for r in back.select("value.*").collect()) == [
            (i, i % 2 == 0) for i in range(6)
        ]
