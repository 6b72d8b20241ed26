"""The driver's side of an `analytics` micro-batch: run the tasks that write the outputs
(`analytics_tasks`), then publish what they staged and commit what they sent, exactly once.

`BatchOutputs.write(df, batch_id)` is the query's foreachBatch. It runs one Spark job over
the micro-batch's frame, whose tasks answer with descriptors only (what they staged, the
refs of the transactions they left open, counts), and then, in this order:

1. publishes the Parquet files of results (`analytics_outputs.publish_results`: renames,
   after removing files of the same batch that an earlier attempt published otherwise);
2. publishes the rejected rows' files (`archive.publish`, the archive's protocol);
3. commits every transaction of the batch as one unit per broker with the marker
   (`<sink id>`, batch id), unless the marker shows the batch published already (a replay
   after a crash between this step and Spark's commit log): then its new transactions
   are rolled back (`tidemq.spark.sink.publish`).

When the job fails, or a step does, the batch's temporaries are removed and its
transactions rolled back, unless the marker shows it published (`sink.discard`). A failed
job answers nothing: what its tasks that succeeded staged and began comes from the run's
accumulator. Spark then fails the query, and the next run replays the batch over the
same input: every step is idempotent.

Imports pyspark when a batch runs (the sink's machinery), not when imported.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tidemq.client.sync import TransactionProducer
from tidemq.spark.pipelines.analytics_outputs import StagedResult, publish_results
from tidemq.spark.pipelines.analytics_tasks import DESCRIPTOR_SCHEMA, TaskJob, write_partition
from tidemq.spark.pipelines.archive import ArchiveFile, Staged
from tidemq.spark.pipelines.archive import publish as publish_rejected

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from tidemq.client.transaction import TxnRef
    from tidemq.spark.sink import SinkOptions

__all__ = ["BatchDescriptors", "BatchOutputs", "ResultCommitter"]

log = logging.getLogger(__name__)


@dataclass(slots=True)
class BatchDescriptors:
    """What the tasks of one micro-batch answered."""

    results: list[StagedResult] = field(default_factory=list)
    rejected: list[Staged] = field(default_factory=list)
    refs: list[TxnRef] = field(default_factory=list)
    #: Input rows of each kind (results, rejected rows).
    rows: Counter[str] = field(default_factory=Counter)
    #: Messages the tasks sent to the results topic.
    sent: int = 0

    @classmethod
    def of(cls, rows: Iterable[Mapping[str, Any]]) -> BatchDescriptors:
        out = cls()
        for row in rows:
            what = row["what"]
            if what == "result":
                out.results.append(StagedResult(Path(row["tmp"]), Path(row["target"]), row["rows"]))
            elif what == "rejected":
                out.rejected.append(_rejected(row))
            elif what == "txn":
                out.refs.append((str(row["address"]), str(row["txn"])))
            elif what == "count":
                out.rows[str(row["kind"])] += int(row["rows"])
            elif what == "sent":
                out.sent += int(row["rows"])
            else:
                raise ValueError(f"unknown descriptor {what!r}")
        return out

    def remove_temporaries(self) -> None:
        """Remove the staged files not published (after a failure; best effort)."""
        for path in [r.tmp for r in self.results] + [s.tmp for s in self.rejected]:
            path.unlink(missing_ok=True)


def _rejected(row: Mapping[str, Any]) -> Staged:
    target = Path(row["target"])
    hour = target.parent.name.removeprefix("hour=")
    dt = target.parent.parent.name.removeprefix("dt=")
    file = ArchiveFile(
        str(row["topic"]),
        int(row["queue"]),
        dt,
        int(hour),
        int(row["start_offset"]),
        int(row["end_offset"]),
        int(row["rows"]),
        target,
    )
    return Staged(Path(row["tmp"]), file)


@dataclass(slots=True)
class ResultCommitter:
    """The driver's end of the results topic: commits the transactions of a batch with
    the marker, or rolls them back. foreachBatch calls never overlap; the lock guards the
    producer against `close` only."""

    sink: SinkOptions
    _producer: TransactionProducer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def _client(self) -> TransactionProducer:
        with self._lock:
            if self._producer is None:
                self._producer = TransactionProducer(
                    self.sink.write.bootstrap,
                    self.sink.group,
                    client_config=self.sink.write.client.client_config(),
                )
            return self._producer

    def commit(self, refs: list[TxnRef], batch_id: int) -> str:
        """ "committed", "skipped" (a replay of a published batch: rolled back) or
        "nothing" (no transaction: no marker needed)."""
        from tidemq.spark.sink import SinkCommitMessage, publish  # noqa: PLC0415 - pyspark

        if not refs:
            return "nothing"
        message = SinkCommitMessage(refs, batch_id, 0, 0)
        return publish(self._client(), self.sink.sink_id, [message], batch_id)

    def discard(self, refs: list[TxnRef], batch_id: int) -> str:
        """Roll back a failed batch's transactions unless its marker shows it published."""
        from tidemq.spark.sink import SinkCommitMessage, discard  # noqa: PLC0415 - pyspark

        return discard(
            self._client(), self.sink.sink_id, [SinkCommitMessage(refs, batch_id)], batch_id
        )

    def close(self) -> None:
        with self._lock:
            if self._producer is not None:
                self._producer.close()
                self._producer = None


@dataclass(slots=True)
class BatchOutputs:
    """Writes every output of each micro-batch from the executors (see the module
    docstring). `answers`: the run's accumulator (`analytics_tasks.AnswersParam`) or None.
    Counts the rejected rows per batch id (a replay in the same run counts once)."""

    root: Path
    sink: SinkOptions | None = None
    answers: Any = None
    rejected: dict[int, int] = field(default_factory=dict)
    _committer: ResultCommitter | None = None

    def __post_init__(self) -> None:
        if self.sink is not None:
            self._committer = ResultCommitter(self.sink)

    def write(self, df: DataFrame, batch_id: int) -> None:
        job = TaskJob(str(self.root), batch_id, self.sink, self.answers)
        task = functools.partial(write_partition, job)
        try:
            rows = df.mapInArrow(task, DESCRIPTOR_SCHEMA).collect()
        except BaseException:
            self._discard(self._accumulated(batch_id), batch_id)  # the tasks that succeeded
            raise
        finally:
            self._reset_answers()
        done = BatchDescriptors.of(row.asDict() for row in rows)
        try:
            publish_results(done.results, batch_id)
            publish_rejected(done.rejected)
            if self._committer is not None:
                self._committer.commit(done.refs, batch_id)
        except BaseException:
            self._discard(done, batch_id)
            raise
        self.rejected[batch_id] = done.rows["rejected"]

    def _accumulated(self, batch_id: int) -> BatchDescriptors:
        answers = [] if self.answers is None else self.answers.value
        return BatchDescriptors.of(row for b, row in answers if b == batch_id)

    def _discard(self, done: BatchDescriptors, batch_id: int) -> None:
        """Best effort: the batch's own error is the one to raise."""
        done.remove_temporaries()
        if self._committer is None or not done.refs:
            return
        try:
            self._committer.discard(done.refs, batch_id)
        except Exception as exc:
            # Left open, they stay invisible; their brokers roll them back after the checks.
            log.warning("analytics: rolling back batch %d failed: %s", batch_id, exc)

    def _reset_answers(self) -> None:
        if self.answers is not None:
            self.answers.value = []

    def close(self) -> None:
        if self._committer is not None:
            self._committer.close()
