"""Writing DataFrames to tidemq from Spark, and reading them back."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pyspark.sql import SparkSession

from tidemq import Admin
from tidemq.cluster.route import queue_for_key

if TYPE_CHECKING:
    from tests.spark.conftest import Load, Options

pytestmark = pytest.mark.spark

SCHEMA = (
    "value string, key binary, topic string, partition int, "
    "headers array<struct<key: string, value: binary>>, tag string, extra long"
)


def test_batch_write_then_read_back(
    spark: SparkSession, admin: Admin, topic_name: str, options: Options, load: Load
) -> None:
    a, b = topic_name + "-a", topic_name + "-b"
    admin.create_topic(a, 4)
    admin.create_topic(b, 2)
    rows = []
    for i in range(300):
        key = None if i % 3 == 0 else b"k%d" % (i % 11)
        partition = 1 if i % 10 == 0 else None
        headers = [("h", b"%d" % (i % 2))] if i % 5 == 0 else None
        tag = "paid" if i % 2 else None
        rows.append((f"v{i}", key, a if i % 4 else b, partition, headers, tag, i))
    # One partition: the rows reach the writer in this order.
    df = spark.createDataFrame(rows, SCHEMA).coalesce(1)
    df.write.format("tidemq").options(**options()).mode("append").save()

    back = load(subscribe=f"{a},{b}", includeHeaders="true").orderBy("topic", "partition", "offset")
    got = back.collect()
    assert len(got) == len(rows)
    by_value = {r.value.decode(): r for r in got}
    for value, key, topic, partition, headers, tag, _ in rows:
        r = by_value[value]
        assert (r.topic, r.key, r.tag) == (topic, key, tag)
        assert [(h.key, h.value) for h in r.headers] == (headers or [])
        if partition is not None:
            assert r.partition == partition
        elif key is not None:
            assert r.partition == queue_for_key(key, 4 if topic == a else 2)
    # Within a queue, offsets follow the DataFrame's order.
    for topic in (a, b):
        for q in range(4):
            values = [int(r.value[1:]) for r in got if r.topic == topic and r.partition == q]
            assert values == sorted(values)


def test_topic_option_overrides_and_errors(
    spark: SparkSession, admin: Admin, topic_name: str, options: Options, load: Load, tmp_path: Path
) -> None:
    admin.create_topic(topic_name, 2)
    df = spark.createDataFrame([(b"x", "elsewhere"), (b"y", None)], "value binary, topic string")
    df.write.format("tidemq").options(**options(topic=topic_name)).mode("append").save()
    assert sorted(r.value for r in load(subscribe=topic_name).collect()) == [b"x", b"y"]

    with pytest.raises(Exception, match="needs a 'value' column"):
        df.select("topic").write.format("tidemq").options(**options()).mode("append").save()
    with pytest.raises(Exception, match="append-only"):
        df.write.format("tidemq").options(**options(topic=topic_name)).mode("overwrite").save()
    with pytest.raises(Exception, match="does not exist"):
        df.write.format("tidemq").options(**options(topic="no-such-topic")).mode("append").save()
    # No at-least-once streaming writer: the exactly-once sink will take this place.
    stream = spark.readStream.format("tidemq").options(**options(subscribe=topic_name)).load()
    writer = (
        stream.writeStream.format("tidemq")
        .options(**options(topic=topic_name))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
    )
    with pytest.raises(Exception, match="exactly-once sink"):
        writer.start().awaitTermination(30)


def test_missing_topic_fails_before_any_row_is_sent(
    spark: SparkSession, admin: Admin, topic_name: str, options: Options, load: Load
) -> None:
    df = spark.createDataFrame([(b"x",), (b"y",)], "value binary")
    # The `topic` option is checked when the write starts, on the driver.
    with pytest.raises(Exception, match=f"topic '{topic_name}' .*does not exist.*createTopic"):
        df.write.format("tidemq").options(**options(topic=topic_name)).mode("append").save()
    assert topic_name not in {t.name for t in admin.list_topics()}
    # Topics from the `topic` column are known row by row: the task that meets one fails.
    per_row = spark.createDataFrame([(b"x", topic_name + "-col")], "value binary, topic string")
    with pytest.raises(Exception, match="named by the DataFrame's 'topic' column does not exist"):
        per_row.write.format("tidemq").options(**options()).mode("append").save()


def test_create_topic_option(
    spark: SparkSession, admin: Admin, topic_name: str, options: Options, load: Load
) -> None:
    df = spark.createDataFrame([(b"x",), (b"y",)], "value binary")
    create = options(topic=topic_name, createTopic="true", **{"createTopic.queues": "3"})
    df.write.format("tidemq").options(**create).mode("append").save()
    assert admin.describe_topic(topic_name).queues == 3
    df.write.format("tidemq").options(**create).mode("append").save()  # exists now: fine
    assert sorted(r.value for r in load(subscribe=topic_name).collect()) == [b"x", b"x", b"y", b"y"]
    # With the `topic` column, the tasks create what their rows name (8 queues by default).
    per_row = spark.createDataFrame([(b"z", topic_name + "-col")], "value binary, topic string")
    per_row.write.format("tidemq").options(**options(createTopic="true")).mode("append").save()
    assert admin.describe_topic(topic_name + "-col").queues == 8
    with pytest.raises(Exception, match=r"'createTopic\.queues' needs the option createTopic=true"):
        df.write.format("tidemq").options(
            **options(topic=topic_name, **{"createTopic.queues": "2"})
        ).mode("append").save()
