"""Reading tidemq from Spark: batch reads equal StreamConsumer, ranges, data loss, and
streams with AvailableNow, read limits, restarts and replays."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pyspark.sql import DataFrame, SparkSession

from tidemq import Admin, Message, Producer
from tidemq.spark.offsets import from_json

if TYPE_CHECKING:
    from tests.spark.conftest import Consume, Load, Options, SourceMessages, ThreadedBroker

pytestmark = pytest.mark.spark


def bounds(admin: Admin, topic: str) -> dict[tuple[str, int], tuple[int, int]]:
    info = admin.describe_topic(topic)
    return {(topic, q.queue): (q.min_offset, q.max_offset) for q in info.queue_info}


def fill(producer: Producer, topic: str, queues: int) -> None:
    """Batches and single messages with every column: keys, null keys and tombstones,
    tags, business keys, headers, non-ASCII text."""
    for q in range(queues):
        for b in range(3):
            n = 40 + 7 * q + b
            producer.send_batch(
                topic,
                [f"v{q}-{b}-{i}".encode() if i % 9 else None for i in range(n)],
                keys=[b"k%d" % i if i % 4 else None for i in range(n)],
                tags=["paid" if i % 2 else None for i in range(n)],
                headers={"src": b"web", "\u00e9": b"\x00"} if b == 1 else None,
                queue=q,
            )
        for i in range(5):
            producer.send(
                topic, b"single-%d" % i, key=b"s", tag="\u00e9t\u00e9", keys=["a", "b"][: i % 3],
                headers={"i": b"%d" % i}, queue=q,
            )  # fmt: skip


def test_batch_read_equals_stream_consumer(
    admin: Admin,
    producer: Producer,
    topic_name: str,
    load: Load,
    consume: Consume,
    source_messages: SourceMessages,
) -> None:
    admin.create_topic(topic_name, 3)
    fill(producer, topic_name, 3)
    expected = consume(bounds(admin, topic_name))
    assert len(expected) == sum(3 * (40 + 7 * q) + 3 + 5 for q in range(3))

    df = load(subscribe=topic_name, includeHeaders="true")
    assert df.columns == [
        "key", "value", "topic", "partition", "offset", "timestamp", "timestampType",
        "headers", "tag", "keys",
    ]  # fmt: skip
    assert source_messages(df) == expected

    # Split into more partitions than queues: the same rows.
    split = load(subscribePattern=re.escape(topic_name), minPartitions="7")
    assert split.rdd.getNumPartitions() == 7
    without_headers = [
        Message(m.topic, m.queue, m.offset, m.value, m.key, m.tag, m.keys, {}, m.timestamp_ms)
        for m in expected
    ]
    assert source_messages(split) == without_headers


def test_starting_and_ending_offsets(
    admin: Admin,
    producer: Producer,
    topic_name: str,
    load: Load,
    consume: Consume,
    source_messages: SourceMessages,
) -> None:
    admin.create_topic(topic_name, 3)
    for q in range(3):
        producer.send_batch(topic_name, [b"%d" % i for i in range(20)], queue=q)
    time.sleep(0.05)
    between_ms = int(time.time() * 1000)
    time.sleep(0.05)
    for q in range(3):
        producer.send_batch(topic_name, [b"%d" % i for i in range(20, 30)], queue=q)
    t = topic_name
    df = load(
        assign=f'{{"{t}": [0, 1]}}',
        startingOffsets=f'{{"{t}": {{"0": 5, "1": -2}}}}',
        endingOffsets=f'{{"{t}": {{"0": 25, "1": -1}}}}',
    )
    expected = consume({(t, 0): (5, 25), (t, 1): (0, 30)})
    assert source_messages(df) == expected
    assert {(m.queue, m.offset) for m in expected} == {(0, o) for o in range(5, 25)} | {
        (1, o) for o in range(30)
    }

    # startingTimestamp: each queue from its first batch stored at or after it.
    since = load(subscribe=t, startingTimestamp=between_ms).select("partition", "offset")
    assert sorted(since.collect()) == [(q, o) for q in range(3) for o in range(20, 30)]

    with pytest.raises(Exception, match=r"'endingOffsets': offset 99 of .*/0 is past the"):
        load(subscribe=t, endingOffsets=f'{{"{t}": {{"0": 99}}}}').count()
    with pytest.raises(Exception, match="option 'startingOffsets' is not valid JSON"):
        load(subscribe=t, startingOffsets="soonest").count()


def test_fail_on_data_loss_after_retention(
    broker: ThreadedBroker, admin: Admin, producer: Producer, topic_name: str, load: Load
) -> None:
    admin.create_topic(topic_name, 1, config={"retention.bytes": "3000"})
    for b in range(20):
        producer.send_batch(topic_name, [b"x" * 100] * 5, queue=0, keys=[b"%d" % b] * 5)
    broker.enforce_retention()
    ((lo, hi),) = bounds(admin, topic_name).values()
    assert 0 < lo < hi == 100

    from_zero = f'{{"{topic_name}": {{"0": 0}}}}'
    lost = load(subscribe=topic_name, startingOffsets=from_zero)
    message = (
        f"data loss: offsets 0..{lo - 1} of topic '{topic_name}' queue 0 were removed "
        f"(retention) before they were read; the queue now starts at offset {lo}"
    )
    with pytest.raises(Exception, match=re.escape(message)):
        lost.collect()

    skipping = load(subscribe=topic_name, startingOffsets=from_zero, failOnDataLoss="false")
    assert sorted(r.offset for r in skipping.select("offset").collect()) == list(range(lo, hi))


def stream(spark: SparkSession, options: dict[str, str], out: Path) -> list[int]:
    """Run an AvailableNow query to a parquet sink; the rows of each micro-batch."""
    df = spark.readStream.format("tidemq").options(**options).load()
    query = (
        df.writeStream.format("parquet")
        .option("path", str(out / "data"))
        .option("checkpointLocation", str(out / "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()
    return [int(p["numInputRows"]) for p in query.recentProgress]


def test_stream_available_now_with_limit_and_restart(
    spark: SparkSession,
    admin: Admin,
    producer: Producer,
    topic_name: str,
    options: Options,
    tmp_path: Path,
) -> None:
    admin.create_topic(topic_name, 3)
    for q in range(3):
        for _ in range(3):
            producer.send_batch(topic_name, [b"a"] * 100, queue=q)
    given = options(
        subscribePattern=re.escape(topic_name) + ".*",
        startingOffsets="earliest",
        maxOffsetsPerTrigger=250,
    )
    # 900 rows, at most 250 per micro-batch, shared fairly over the three queues.
    assert stream(spark, given, tmp_path) == [250, 250, 250, 150]

    # Restart from the checkpoint: only what came since, and a new topic's queues (they
    # enter the offsets in one batch, and are read from the next).
    for q in range(3):
        producer.send_batch(topic_name, [b"b"] * 10, queue=q)
    admin.create_topic(topic_name + "-new", 2)
    producer.send_batch(topic_name + "-new", [b"c"] * 5, queue=1)
    assert stream(spark, given, tmp_path) == [30, 5]
    # Nothing new: no micro-batch at all (Spark may still report one idle trigger).
    batches_logged = len(list((tmp_path / "checkpoint" / "offsets").iterdir()))
    assert sum(stream(spark, given, tmp_path)) == 0
    assert len(list((tmp_path / "checkpoint" / "offsets").iterdir())) == batches_logged

    out = spark.read.parquet(str(tmp_path / "data"))
    got = sorted((r.topic, r.partition, r.offset) for r in out.collect())
    expected = sorted(
        [(topic_name, q, o) for q in range(3) for o in range(310)]
        + [(topic_name + "-new", 1, o) for o in range(5)]
    )
    assert got == expected  # every message exactly once


def test_replay_after_restart_reads_the_same_ranges(
    spark: SparkSession,
    admin: Admin,
    producer: Producer,
    topic_name: str,
    options: Options,
    tmp_path: Path,
) -> None:
    admin.create_topic(topic_name, 2)
    for q in range(2):
        producer.send_batch(topic_name, [b"%d" % i for i in range(100)], queue=q)
    batches: list[tuple[int, list[tuple[int, int]]]] = []

    def record(df: DataFrame, batch_id: int) -> None:
        rows = sorted((r.partition, r.offset) for r in df.select("partition", "offset").collect())
        batches.append((batch_id, rows))

    def run() -> None:
        given = options(subscribe=topic_name, startingOffsets="earliest", maxOffsetsPerTrigger=60)
        query = (
            spark.readStream.format("tidemq")
            .options(**given)
            .load()
            .writeStream.foreachBatch(record)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        query.awaitTermination()

    run()
    assert [(b, len(rows)) for b, rows in batches] == [(0, 60), (1, 60), (2, 60), (3, 20)]
    last = from_json(_offset_log_entry(tmp_path / "checkpoint" / "offsets" / "3"))
    assert last == {(topic_name, 0): 100, (topic_name, 1): 100}

    # A crash after batch 3 ran but before it was committed: its commit is lost. More
    # data arrives; the restarted query replays batch 3 with exactly its logged range.
    for name in ("3", ".3.crc"):
        (tmp_path / "checkpoint" / "commits" / name).unlink(missing_ok=True)
    for q in range(2):
        producer.send_batch(topic_name, [b"new"] * 25, queue=q)
    run()
    replayed = [rows for b, rows in batches if b == 3]
    assert len(replayed) == 2
    assert replayed[0] == replayed[1]
    assert [(b, len(rows)) for b, rows in batches[4:]] == [(3, 20), (4, 50)]
    by_batch = dict(batches)  # each batch id once (the replay is the same rows)
    every = sorted(pair for rows in by_batch.values() for pair in rows)
    assert every == [(q, o) for q in range(2) for o in range(125)]


def _offset_log_entry(path: Path) -> str:
    """The source offset in one entry of Spark's offset log (version line, metadata line,
    then one line per source)."""
    return path.read_text().splitlines()[2]


def test_timestamp_type_follows_the_topics_config(
    admin: Admin, producer: Producer, load: Load, topic_name: str
) -> None:
    """Kafka's timestampType: 0 (CreateTime, the producer's timestamp) by default, 1 with
    `message.timestamp.type=LogAppendTime` (the broker's append time)."""
    appended, created = topic_name + "-append", topic_name + "-create"
    admin.create_topic(appended, 1, config={"message.timestamp.type": "LogAppendTime"})
    admin.create_topic(created, 1)
    long_ago_s = 1_000_000_000.0
    for topic in (appended, created):
        producer.send_batch(topic, [b"a", b"b"], timestamp=long_ago_s)
    rows = {
        topic: load(subscribe=topic).select("timestamp", "timestampType").collect()
        for topic in (appended, created)
    }
    assert [r.timestampType for r in rows[created]] == [0, 0]
    assert {r.timestamp.timestamp() for r in rows[created]} == {long_ago_s}
    assert [r.timestampType for r in rows[appended]] == [1, 1]
    assert all(r.timestamp.timestamp() > long_ago_s + 10**8 for r in rows[appended])


def test_starting_and_ending_by_timestamp(
    admin: Admin, producer: Producer, load: Load, topic_name: str
) -> None:
    """`startingTimestamp`, `startingOffsetsByTimestamp`, `endingTimestamp` and
    `endingOffsetsByTimestamp` pick messages by their own timestamps, inside a batch too."""
    admin.create_topic(topic_name, 2)
    base_s = 1_600_000_000.0
    for queue in (0, 1):
        for i in range(6):  # timestamps 1 s apart
            producer.send(topic_name, b"%d-%d" % (queue, i), queue=queue, timestamp=base_s + i)

    def offsets(**given: str) -> list[tuple[int, int]]:
        rows = load(subscribe=topic_name, **given).select("partition", "offset").collect()
        return sorted((r.partition, r.offset) for r in rows)

    ms = int(base_s * 1000)
    every = [(q, o) for q in (0, 1) for o in range(6)]
    assert offsets(startingTimestamp=str(ms + 2000)) == [(q, o) for q, o in every if o >= 2]
    assert offsets(endingTimestamp=str(ms + 3000)) == [(q, o) for q, o in every if o < 3]
    by_queue = f'{{"{topic_name}": {{"1": {ms + 4000}}}}}'
    assert offsets(startingOffsetsByTimestamp=by_queue) == [
        (q, o) for q, o in every if q == 0 or o >= 4
    ]
    assert offsets(endingOffsetsByTimestamp=by_queue) == [
        (q, o) for q, o in every if q == 0 or o < 4
    ]


def test_batch_read_of_a_compacted_topic_steps_over_the_holes(
    admin: Admin,
    producer: Producer,
    topic_name: str,
    load: Load,
    consume: Consume,
    source_messages: SourceMessages,
) -> None:
    """After compaction a queue's offsets have holes: every split of the read (one task
    per queue, or several per queue) gives the kept messages at their own offsets."""
    admin.create_topic(topic_name, 2, config={"cleanup.policy": "compact"})
    for round_ in range(4):
        producer.send_batch(
            topic_name,
            [b"r%d-%d" % (round_, i) for i in range(30)],
            keys=[b"k%d" % i for i in range(30)],
        )
    producer.flush()
    admin.compact(topic_name)
    expected = consume(bounds(admin, topic_name))
    assert len(expected) == 30  # one message per key
    assert {m.value for m in expected} == {b"r3-%d" % i for i in range(30)}
    assert source_messages(load(subscribe=topic_name)) == expected
    assert source_messages(load(subscribe=topic_name, minPartitions="9")) == expected
