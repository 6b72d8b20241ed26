"""Spark and tiered storage: the source reads offloaded offsets (from the tier's files, or
through the broker) as it reads local ones, and the offloaded Parquet files are read by
Spark straight from the tier's directory, without the broker."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pyspark.sql import SparkSession
from tests.spark.test_spark_read import stream

from tidemq import Admin, Producer

if TYPE_CHECKING:
    from tests.spark.conftest import Consume, Load, Options, SourceMessages

pytestmark = pytest.mark.spark

OFFLOADED = {"remote.storage.enable": "true", "local.retention.ms": "0"}


def _fill(producer: Producer, topic: str) -> None:
    for q in range(2):
        for b in range(4):
            n = 30 + b
            producer.send_batch(
                topic,
                [f"v{q}-{b}-{i}".encode() if i % 7 else None for i in range(n)],
                keys=[b"k%d" % i if i % 3 else None for i in range(n)],
                tags=["paid" if i % 2 else None for i in range(n)],
                headers={"src": b"web"} if b == 2 else None,
                queue=q,
            )


def test_spark_reads_offloaded_topics_both_ways(
    spark: SparkSession,
    admin: Admin,
    producer: Producer,
    topic_name: str,
    load: Load,
    consume: Consume,
    source_messages: SourceMessages,
) -> None:
    admin.create_topic(topic_name, 2, config=OFFLOADED)
    _fill(producer, topic_name)
    info = admin.describe_topic(topic_name)
    ranges = {(topic_name, q.queue): (q.min_offset, q.max_offset) for q in info.queue_info}
    expected = consume(ranges)
    (status,) = admin.tier_offload(topic_name)
    assert all(q.local_min == q.next_offset == q.remote_end for q in status.queues)

    # The source: its executors read the offloaded ranges from the files (the broker
    # only lists them), and through the broker with readFromTier=never: every row as
    # before the offload, both ways.
    def remote_reads() -> int:
        return sum(s.remote_reads for s in admin.tier_status())

    before = remote_reads()
    df = load(subscribe=topic_name, includeHeaders="true")
    assert source_messages(df) == expected
    assert remote_reads() == before
    df = load(subscribe=topic_name, includeHeaders="true", readFromTier="never")
    assert source_messages(df) == expected
    assert remote_reads() > before

    # Straight from the tier's files: the same messages, Hive partitions as columns.
    files = admin.tier_files(topic_name)
    root = files[0].url.removeprefix("file://").split(f"/topic={topic_name}/")[0]
    direct = spark.read.parquet(f"{root}/topic={topic_name}")
    rows = direct.select("partition", "offset", "value", "queue", "broker").collect()
    assert sorted((r.partition, r.offset, r.value) for r in rows) == [
        (m.queue, m.offset, m.value) for m in expected
    ]
    assert {(r.queue, r.broker) for r in rows} == {(0, status.broker), (1, status.broker)}


def test_a_stream_reads_history_from_the_tier_then_the_tail_exactly_once(
    spark: SparkSession,
    admin: Admin,
    producer: Producer,
    topic_name: str,
    options: Options,
    consume: Consume,
    tmp_path: Path,
) -> None:
    admin.create_topic(topic_name, 2, config=OFFLOADED)
    _fill(producer, topic_name)
    admin.tier_offload(topic_name)
    _fill(producer, topic_name)  # a local tail after the offloaded history
    info = admin.describe_topic(topic_name)
    ranges = {(topic_name, q.queue): (q.min_offset, q.max_offset) for q in info.queue_info}
    expected = consume(ranges)
    given = options(subscribe=topic_name, startingOffsets="earliest", maxOffsetsPerTrigger=70)
    # Micro-batches of 70 rows cut across files and across the offloaded/local boundary.
    assert sum(stream(spark, given, tmp_path)) == len(expected)
    out = spark.read.parquet(str(tmp_path / "data")).collect()
    assert sorted((r.partition, r.offset, r.value) for r in out) == [
        (m.queue, m.offset, m.value) for m in expected
    ]
