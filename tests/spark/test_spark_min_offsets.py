"""`minOffsetsPerTrigger` with `maxTriggerDelay` in a running Spark query: no micro-batch
until the minimum is there, and the delay plans one with fewer (the decision itself is
tested as a table in tests/unit/test_spark_trigger_limits.py)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery
from tests.integration.conftest import wait_until

from tidemq import Admin, Producer
from tidemq.spark.offsets import from_json, trigger_time_ms

if TYPE_CHECKING:
    from tests.spark.conftest import Options

pytestmark = pytest.mark.spark

Batches = list[tuple[int, int]]  # (batch id, rows)
#: A query's start (a JVM-side stream, a Python planner process) took 40 s, and its first
#: micro-batch with rows (Python workers for the read) over 20 s, on a machine loaded 8x
#: its cores; unloaded, the whole test takes about 20 s.
SLOW_TIMEOUT_S = 120.0


def poll(predicate: Callable[[], bool], what: str, timeout_s: float = 20.0) -> None:
    asyncio.run(wait_until(predicate, timeout_s=timeout_s, interval_s=0.05, what=what))


def with_rows(batches: Batches) -> list[int]:
    """The sizes of the micro-batches that read something (Spark runs a first batch when
    a query starts without a checkpoint, whatever the source answers: an empty one here)."""
    return [rows for _, rows in batches if rows]


@contextmanager
def running(
    spark: SparkSession, given: dict[str, str], checkpoint: Path, batches: Batches
) -> Iterator[StreamingQuery]:
    """A query every 100 ms recording its micro-batches' sizes; progress is reported for
    idle triggers too (each shows the queue ends the reader saw: `latestOffset`)."""

    def record(df: DataFrame, batch_id: int) -> None:
        batches.append((batch_id, df.count()))

    spark.conf.set("spark.sql.streaming.noDataProgressEventInterval", "0")
    try:
        query = (
            spark.readStream.format("tidemq")
            .options(**given)
            .load()
            .writeStream.foreachBatch(record)
            .option("checkpointLocation", str(checkpoint))
            .trigger(processingTime="100 milliseconds")
            .start()
        )
    finally:
        spark.conf.unset("spark.sql.streaming.noDataProgressEventInterval")
    try:
        poll(lambda: bool(query.recentProgress), "the query's first trigger", SLOW_TIMEOUT_S)
        yield query
    finally:
        query.stop()


def seen(query: StreamingQuery) -> list[int]:
    """Per reported trigger without a micro-batch, the offsets the reader saw in all."""
    out = []
    for progress in query.recentProgress:
        source: dict[str, Any] = progress["sources"][0]
        if progress["numInputRows"] == 0 and source.get("latestOffset"):
            out.append(sum(from_json(source["latestOffset"]).values()))
    return out


def test_no_batch_until_the_minimum_then_the_delay_plans_fewer(
    spark: SparkSession,
    admin: Admin,
    producer: Producer,
    topic_name: str,
    options: Options,
    tmp_path: Path,
) -> None:
    admin.create_topic(topic_name, 2)
    batches: Batches = []
    given = options(subscribe=topic_name, startingOffsets="earliest", minOffsetsPerTrigger=50)
    with running(spark, given, tmp_path / "min", batches) as query:
        for q in range(2):
            producer.send_batch(topic_name, [b"a"] * 15, queue=q)
        # The reader sees the 30 offsets, and triggers go by without a micro-batch.
        poll(lambda: seen(query).count(30) >= 5, "five idle triggers that saw 30 offsets")
        assert with_rows(batches) == []
        producer.send_batch(topic_name, [b"b"] * 20, queue=0)
        poll(lambda: bool(with_rows(batches)), "the micro-batch of the 50 offsets", SLOW_TIMEOUT_S)
        assert with_rows(batches) == [50]

    # A minimum that is never reached: the 2 s delay plans the 10 offsets there are.
    other = topic_name + "-delay"
    admin.create_topic(other, 1)
    batches.clear()
    given = options(
        subscribe=other, startingOffsets="earliest", minOffsetsPerTrigger=1000, maxTriggerDelay="2s"
    )
    before_ms = time.time_ns() // 1_000_000
    with running(spark, given, tmp_path / "delay", batches):
        producer.send_batch(other, [b"c"] * 10, queue=0)
        poll(lambda: bool(with_rows(batches)), "the micro-batch the delay plans", SLOW_TIMEOUT_S)
        assert with_rows(batches) == [10]
        batch_id = next(b for b, rows in batches if rows)
    logged = (tmp_path / "delay" / "offsets" / str(batch_id)).read_text().splitlines()[2]
    planned_ms = trigger_time_ms(json.loads(logged))
    assert planned_ms is not None
    # The reader was created after `before_ms`; its first batch waited the 2 s delay.
    assert planned_ms - before_ms >= 2_000


def test_available_now_reads_everything_whatever_the_minimum(
    spark: SparkSession,
    admin: Admin,
    producer: Producer,
    topic_name: str,
    options: Options,
    tmp_path: Path,
) -> None:
    """Spark ends an AvailableNow query when the source has nothing more to plan: with
    the minimum applied, these 30 offsets would never be read."""
    admin.create_topic(topic_name, 2)
    for q in range(2):
        producer.send_batch(topic_name, [b"a"] * 15, queue=q)
    batches: Batches = []

    def record(df: DataFrame, batch_id: int) -> None:
        batches.append((batch_id, df.count()))

    given = options(subscribe=topic_name, startingOffsets="earliest", minOffsetsPerTrigger=1000)
    query = (
        spark.readStream.format("tidemq")
        .options(**given)
        .load()
        .writeStream.foreachBatch(record)
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(int(SLOW_TIMEOUT_S)), "the AvailableNow query did not end"
    finally:
        query.stop()
    assert with_rows(batches) == [30]
