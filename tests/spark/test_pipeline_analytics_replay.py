"""The analytics pipeline's micro-batches replayed after failures: the tasks write the
outputs (Parquet staged under hidden names, results sent in open transactions) and the
driver publishes them; whatever step fails, the next run replays the batch and every
output ends up exactly once.

* A task fails (an output directory is a file): the job fails, so the driver gets
  no answer; it removes what the tasks that succeeded staged and rolls back what they
  began (from the run's accumulator), and nothing of the batch is visible.
* The driver's publish fails (a file's place is taken by a directory): it removes the
  batch's temporaries and rolls back all its transactions.
* The driver dies after publishing a batch, before Spark's commit log records it: the
  checkpoint then holds the batch's offsets and state but no commit. The test makes that
  state by removing the last batch's commit entry after a run (what a kill -9 at that
  point leaves), and the next run replays the batch: its files are replaced by identical
  ones and its transactions rolled back, since the marker shows the batch published.
"""

from __future__ import annotations

import shutil
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.dataset as ds
import pytest
from pyspark.errors import StreamingQueryException
from pyspark.sql import SparkSession
from tests.support.analytics_results import CONFIG, INVALID, check, sample_events, topic_rows

from tidemq import Admin, Producer
from tidemq.spark.pipelines.analytics import QUERY_DIR, AnalyticsRun, run_analytics
from tidemq.spark.pipelines.analytics_outputs import result_path
from tidemq.spark.pipelines.events import Event, produce_events
from tidemq.spark.pipelines.sink_ids import sink_id, sink_token

if TYPE_CHECKING:
    from tests.spark.conftest import Consume, Options

pytestmark = pytest.mark.spark

QUEUES = 3  # the query's shuffle partitions: one per input queue
#: The first micro-batch's size: batch 0 (no results yet: no watermark), then batch 1
#: with the rest. The sources split it over the queues in proportion to their backlogs,
#: so batch 0 covers about 3/4 of the events' 390 s: its watermark (120 s behind) closes
#: windows of every kind in batch 1 (half of them, 1,002, left none closed).
BATCH_0 = 1500


class Pipeline:
    """One pipeline (topic, output, checkpoint, results topic) run again and again."""

    def __init__(
        self, spark: SparkSession, bootstrap: str, topic: str, tmp_path: Path, admin: Admin
    ) -> None:
        self.spark, self.bootstrap, self.topic, self.admin = spark, bootstrap, topic, admin
        self.output, self.checkpoint = tmp_path / "out", tmp_path / "checkpoint"
        self.results = topic + "-out"

    def run(self) -> AnalyticsRun:
        return run_analytics(
            self.spark,
            bootstrap=self.bootstrap,
            topics=[self.topic],
            output=self.output,
            checkpoint=self.checkpoint,
            results_topic=self.results,
            name=self.topic,
            config=CONFIG,
            max_offsets_per_trigger=BATCH_0,
        )

    def open_transactions(self) -> list[str]:
        """The results sink's transactions that are neither committed nor rolled back."""
        group = f"spark-sink-{sink_id(self.topic, 'results', sink_token(self.checkpoint))}"
        return [t.txn_id for t in self.admin.transaction_status().open if t.group == group]

    def temporaries(self) -> list[Path]:
        return [p for p in self.output.rglob(".*") if p.is_file()]

    def result_files(self) -> list[Path]:
        files = self.output.rglob("part-*.parquet")
        return sorted(f for f in files if f.is_file() and "rejected" not in f.parts)

    def rejected(self) -> list[tuple[int, int]]:
        """(queue, offset) of the published rejected rows."""
        if not list((self.output / "rejected").rglob("part-*.parquet")):
            return []
        table = ds.dataset(self.output / "rejected", format="parquet", partitioning="hive")
        rows = table.to_table(columns=["partition", "offset"])
        return sorted(zip(rows["partition"].to_pylist(), rows["offset"].to_pylist(), strict=True))


def _produce(
    producer: Producer, bootstrap: str, topic: str
) -> tuple[list[Event], list[tuple[int, int]]]:
    events = sample_events()[:2000]
    produce_events(bootstrap, topic, events, queues=QUEUES)
    bad = [producer.send(topic, value, queue=1) for value in INVALID]
    return events, [(r.queue, r.offset) for r in bad]


def _days(events: list[Event]) -> set[str]:
    return {datetime.fromtimestamp(e.ts / 1000, UTC).strftime("%Y-%m-%d") for e in events}


def test_a_batch_that_failed_in_its_publish_or_in_a_task_is_replayed_exactly_once(
    spark: SparkSession,
    admin: Admin,
    producer: Producer,
    options: Options,
    consume: Consume,
    topic_name: str,
    tmp_path: Path,
) -> None:
    bootstrap = options()["bootstrap"]
    events, bad = _produce(producer, bootstrap, topic_name)
    p = Pipeline(spark, bootstrap, topic_name, tmp_path, admin)

    # 1. Batch 1's publish fails: a directory stands where its tumbling files go (the
    # tumbling windows are the frame's first partitions: tasks 0 to QUEUES - 1).
    blockers = [
        result_path(p.output, "tumbling", day, 1, task)
        for day in _days(events)
        for task in range(QUEUES)
    ]
    for blocker in blockers:
        blocker.mkdir(parents=True)
    with pytest.raises(StreamingQueryException, match="directory"):
        p.run()
    assert topic_rows(admin, consume, p.results) == Counter()
    assert p.open_transactions() == []  # the driver rolled them all back
    assert p.temporaries() == []  # and removed what the tasks staged
    assert p.rejected() == []  # the invalid values are at the end: in batch 1
    # Files renamed before the failure stay (of batch 1 only): the replay replaces them.
    partly = p.result_files()
    assert all(f.name.startswith("part-00000001-") for f in partly)
    for blocker in blockers:
        blocker.rmdir()

    # 2. A task of batch 1 fails: the rejected rows' directory is a file (it holds
    # only empty directories now). The job fails, and with it the batch; nothing more
    # of it becomes visible.
    rejected = p.output / "rejected"
    assert not [f for f in rejected.rglob("*") if not f.is_dir()]
    shutil.rmtree(rejected)
    rejected.write_bytes(b"")
    with pytest.raises(StreamingQueryException, match="rejected"):
        p.run()
    assert topic_rows(admin, consume, p.results) == Counter()
    assert p.result_files() == partly
    # The driver rolled back the transactions of the tasks that succeeded (known from
    # the accumulator: each left one open, and most of the nine result tasks have
    # rows). At most one more can be left to the brokers' check-backs: a task that
    # Spark cancelled when the job failed (`local[2]`: two tasks run at once).
    assert len(p.open_transactions()) <= 1
    rejected.unlink()

    # 3. The next run replays batch 1 and publishes it, once.
    done = p.run()
    assert done.rows() == 2003 - BATCH_0  # batch 1 only: batch 0 was committed in the first run
    check(done, events, p.output, admin=admin, consume=consume, topic=p.results)
    assert p.rejected() == bad


def test_a_batch_replayed_after_its_outputs_were_published_is_not_written_twice(
    spark: SparkSession,
    admin: Admin,
    producer: Producer,
    options: Options,
    consume: Consume,
    topic_name: str,
    tmp_path: Path,
) -> None:
    bootstrap = options()["bootstrap"]
    events, bad = _produce(producer, bootstrap, topic_name)
    p = Pipeline(spark, bootstrap, topic_name, tmp_path, admin)
    first = p.run()
    results = check(first, events, p.output, admin=admin, consume=consume, topic=p.results)
    published = {f: f.read_bytes() for f in p.output.rglob("*.parquet")}
    assert p.open_transactions() == []

    # What a driver killed between its publish of batch 1 and Spark's commit log leaves:
    # offsets and state of batch 1, no commit entry (the commit log is written last).
    commits = p.checkpoint / QUERY_DIR / "commits"
    last = max(int(f.name) for f in commits.iterdir() if f.name.isdigit())
    assert last == 1
    (commits / str(last)).unlink()
    (commits / f".{last}.crc").unlink(missing_ok=True)  # its checksum, if any

    again = p.run()
    assert again.rows() == 2003 - BATCH_0  # batch 1, read again
    assert check(again, events, p.output, admin=admin, consume=consume, topic=p.results) == results
    # The replay renamed identical files over the published ones and added none; its
    # transactions were rolled back (the marker showed batch 1 published).
    assert {f: f.read_bytes() for f in p.output.rglob("*.parquet")} == published
    assert p.open_transactions() == []
    assert p.temporaries() == []
    assert p.rejected() == bad
