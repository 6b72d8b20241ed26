"""The exactly-once streaming sink: tidemq topic -> Spark stream -> tidemq topic."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from tidemq import Admin, Producer, TransactionProducer

if TYPE_CHECKING:
    from tests.spark.conftest import Load, Options

pytestmark = pytest.mark.spark


def _fill(admin: Admin, producer: Producer, topic: str, queues: int, start: int, n: int) -> None:
    if start == 0:
        admin.create_topic(topic, queues)
    for q in range(queues):
        values = [b"v%d" % i for i in range(start, start + n) if i % queues == q]
        producer.send_batch(topic, values, queue=q)


def _query(
    spark: SparkSession,
    options: Options,
    source: str,
    target: str,
    checkpoint: Path,
    sink: dict[str, str],
    per_trigger: int = 40,
) -> None:
    """Run source -> target to the end of what the source holds now (AvailableNow)."""
    stream: DataFrame = (
        spark.readStream.format("tidemq")
        .options(
            **options(
                subscribe=source, startingOffsets="earliest", maxOffsetsPerTrigger=per_trigger
            )
        )
        .load()
    )
    query = (
        stream.select("key", "value")
        .writeStream.format("tidemq")
        .options(**options(topic=target, **sink))
        .option("checkpointLocation", str(checkpoint))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(60)
    finally:
        query.stop()


def _values(load: Load, topic: str) -> Counter[bytes]:
    return Counter(bytes(r.value) for r in load(subscribe=topic).collect())


def _marker(address: str, sink_id: str) -> int:
    with TransactionProducer(address, group=f"spark-sink-{sink_id}") as p:
        return p.sink_marker(sink_id)


def _open_txns(admin: Admin, sink_id: str) -> int:
    return sum(1 for t in admin.transaction_status().open if t.group == f"spark-sink-{sink_id}")


def test_stream_to_topic_exactly_once_and_replay(
    spark: SparkSession,
    admin: Admin,
    producer: Producer,
    topic_name: str,
    options: Options,
    load: Load,
    tmp_path: Path,
) -> None:
    source, target, sink_id = topic_name + "-in", topic_name + "-out", topic_name + "-sink"
    _fill(admin, producer, source, 2, 0, 100)
    admin.create_topic(target, 3)
    checkpoint = tmp_path / "checkpoint"
    expected = Counter(b"v%d" % i for i in range(100))

    _query(spark, options, source, target, checkpoint, {"sinkId": sink_id}, 60)
    assert _values(load, target) == expected
    marker = _marker(options()["bootstrap"], sink_id)
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    assert marker == commits[-1] == 1  # 100 rows, 60 per trigger: batches 0 and 1

    # As after a driver crash between the sink's commit and Spark's commit log: Spark
    # replays the last batch; the sink sees its marker and publishes nothing again.
    (checkpoint / "commits" / str(commits[-1])).unlink()
    (checkpoint / "commits" / f".{commits[-1]}.crc").unlink(missing_ok=True)
    _query(spark, options, source, target, checkpoint, {"sinkId": sink_id}, 60)
    assert _values(load, target) == expected
    assert _marker(options()["bootstrap"], sink_id) == marker
    assert (checkpoint / "commits" / str(commits[-1])).exists()

    # The query goes on from there.
    _fill(admin, producer, source, 2, 100, 20)
    _query(spark, options, source, target, checkpoint, {"sinkId": sink_id}, 60)
    assert _values(load, target) == expected + Counter(b"v%d" % i for i in range(100, 120))
    assert _marker(options()["bootstrap"], sink_id) == marker + 1
    assert _open_txns(admin, sink_id) == 0  # the replay's transactions were rolled back


def test_task_failure_mid_batch_leaves_no_duplicate(
    spark: SparkSession,
    admin: Admin,
    producer: Producer,
    topic_name: str,
    options: Options,
    load: Load,
    tmp_path: Path,
) -> None:
    source, target, sink_id = topic_name + "-in", topic_name + "-out", topic_name + "-sink"
    _fill(admin, producer, source, 2, 0, 60)
    admin.create_topic(target, 2)
    checkpoint = tmp_path / "checkpoint"
    fail = {"testing.failAfterRows": "5", "testing.failOnceFile": str(tmp_path / "failed")}

    # One task of the first batch fails after sending rows in its transaction (local[2]
    # does not retry tasks): the query fails, the batch's transactions are rolled back.
    with pytest.raises(StreamingQueryException, match="injected sink failure"):
        _query(spark, options, source, target, checkpoint, {"sinkId": sink_id, **fail})
    assert (tmp_path / "failed").exists()
    assert _values(load, target) == Counter()
    assert _marker(options()["bootstrap"], sink_id) == -1

    # The restarted query writes every row once.
    _query(spark, options, source, target, checkpoint, {"sinkId": sink_id, **fail})
    assert _values(load, target) == Counter(b"v%d" % i for i in range(60))
    assert _marker(options()["bootstrap"], sink_id) == 1  # 60 rows, 40 per trigger
    # The failed run's other task may have ended after Spark's abort (or been killed): its
    # transaction, if any, stays open and invisible until its broker rolls it back.


def test_sink_id_required(
    spark: SparkSession, admin: Admin, topic_name: str, options: Options, tmp_path: Path
) -> None:
    admin.create_topic(topic_name, 1)
    stream = spark.readStream.format("tidemq").options(**options(subscribe=topic_name)).load()
    writer = (
        stream.writeStream.format("tidemq")
        .options(**options(topic=topic_name))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
    )
    with pytest.raises(Exception, match="'sinkId' is required"):
        writer.start().awaitTermination(30)


def test_stream_to_a_missing_topic_fails_when_the_query_starts(
    spark: SparkSession, admin: Admin, topic_name: str, options: Options, tmp_path: Path
) -> None:
    admin.create_topic(topic_name, 1)  # the source: empty, so no row ever reaches a task
    missing = topic_name + "-missing"
    stream = spark.readStream.format("tidemq").options(**options(subscribe=topic_name)).load()

    def start(**extra: str) -> StreamingQuery:
        return (
            stream.select("value")
            .writeStream.format("tidemq")
            .options(**options(topic=missing, sinkId=missing, **extra))
            .option("checkpointLocation", str(tmp_path / f"checkpoint-{len(extra)}"))
            .start()
        )

    def run_until_it_fails() -> None:
        query = start()
        try:
            query.awaitTermination(60)
        finally:
            query.stop()

    with pytest.raises(Exception, match=f"topic '{missing}' .*does not exist.*createTopic"):
        run_until_it_fails()
    assert missing not in {t.name for t in admin.list_topics()}

    query = start(createTopic="true", **{"createTopic.queues": "2"})
    try:
        assert query.awaitTermination(5) is False
        assert query.isActive
    finally:
        query.stop()
    assert admin.describe_topic(missing).queues == 2


def test_a_sink_id_reused_by_a_new_checkpoint_fails_the_query(
    spark: SparkSession,
    admin: Admin,
    producer: Producer,
    topic_name: str,
    options: Options,
    load: Load,
    tmp_path: Path,
) -> None:
    """Issue 21: a new query whose sinkId another checkpoint already published under took
    its batches for replays and wrote nothing. Now it fails before publishing."""
    source, target, sink_id = topic_name + "-in", topic_name + "-out", topic_name + "-sink"
    _fill(admin, producer, source, 1, 0, 10)
    admin.create_topic(target, 1)
    _query(spark, options, source, target, tmp_path / "first", {"sinkId": sink_id})
    assert sum(_values(load, target).values()) == 10
    with pytest.raises(StreamingQueryException, match="has published batches up to 0 from"):
        _query(spark, options, source, target, tmp_path / "second", {"sinkId": sink_id})
    assert sum(_values(load, target).values()) == 10  # nothing published twice, or lost


def test_a_task_over_the_batches_per_transaction_limit_uses_several(
    spark: SparkSession,
    admin: Admin,
    producer: Producer,
    options: Options,
    topic_name: str,
    load: Load,
    tmp_path: Path,
) -> None:
    """A task whose rows need more sends than `maxBatchesPerTransaction` begins another
    transaction instead of failing (it used to fail again on every replay past the
    broker's limit); the driver commits them together, exactly once."""
    source, target, sink_id = topic_name + "-in", topic_name + "-out", topic_name + "-sink"
    _fill(admin, producer, source, 3, 0, 90)
    admin.create_topic(target, 3)
    committed_before = admin.transaction_status().committed
    stream: DataFrame = (
        spark.readStream.format("tidemq")
        .options(**options(subscribe=source, startingOffsets="earliest"))
        .option("minPartitions", "1")
        .load()
        .coalesce(1)  # one task: its rows go to 3 queues, in 3 sends per Arrow batch
    )
    query = (
        stream.select("key", "value", "partition")
        .writeStream.format("tidemq")
        .options(**options(topic=target, sinkId=sink_id, maxBatchesPerTransaction="2"))
        .option("checkpointLocation", str(tmp_path / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    try:
        assert query.awaitTermination(60)
    finally:
        query.stop()
    assert _values(load, target) == Counter(b"v%d" % i for i in range(90))
    assert admin.transaction_status().committed - committed_before >= 2
    assert _open_txns(admin, sink_id) == 0
    with pytest.raises(Exception, match="maxBatchesPerTransaction' must be a positive"):
        _query(spark, options, source, target, tmp_path / "cp2", {"sinkId": sink_id + "x",
               "maxBatchesPerTransaction": "0"})  # fmt: skip
