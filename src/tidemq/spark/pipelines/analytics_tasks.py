"""A Spark task of an `analytics` micro-batch: it writes its share of every output where it
runs and answers the driver with small descriptors, never with rows (issue 21).

foreachBatch runs one action on the micro-batch's frame, ``df.mapInArrow(write_partition,
DESCRIPTOR_SCHEMA).collect()``; each task (a partition of the frame: the rows of one
aggregation's shuffle partition, or of the rejected rows) then:

1. splits its rows by kind (`analytics_outputs.split_kinds`);
2. stages its results as Parquet under hidden temporary names, one file per kind and UTC
   day (`stage_results`), and its rejected rows in the archive layout (`stage_table`);
3. sends its results to the results topic inside transactions of the sink's group, left
   open (`tidemq.spark.sink.write_transaction`);
4. answers one Arrow batch of descriptors: a row per staged file (`what` = "result" or
   "rejected"), per transaction ("txn": broker address and transaction id), and per count
   ("count": rows of each kind; "sent": messages sent). It adds the same rows to the
   run's accumulator: when the job fails, the driver gets no answer, but Spark still
   merges the accumulator updates of the tasks that succeeded, so the driver can remove
   their files and roll back their transactions.

A task that fails removes what it staged and rolls back what it began (best effort: a
task killed with its process leaves hidden temporaries, which the next publish of their
directory removes once stale, and open transactions, which no one commits and their
broker rolls back after its check-backs). The driver's side is `analytics_publish`.

Imports pyspark when a task runs (the sink's machinery), not when imported.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import pyarrow as pa

from tidemq.spark.pipelines.analytics_frames import KINDS, Kind
from tidemq.spark.pipelines.analytics_outputs import (
    RESULT_KINDS,
    StagedResult,
    message_batch,
    split_kinds,
    stage_results,
)
from tidemq.spark.pipelines.archive import Staged, stage_table

if TYPE_CHECKING:
    from tidemq.client.transaction import TxnRef
    from tidemq.spark.sink import SinkOptions

__all__ = [
    "DESCRIPTOR_ARROW",
    "DESCRIPTOR_SCHEMA",
    "Answer",
    "AnswersParam",
    "TaskJob",
    "descriptor_rows",
    "write_partition",
]

#: What a task answers, one row per staged file, transaction or count (Spark's DDL and
#: the same as Arrow). Unused fields are null.
DESCRIPTOR_SCHEMA: Final = (
    "what string, kind string, tmp string, target string, topic string, queue bigint, "
    "start_offset bigint, end_offset bigint, address string, txn string, rows bigint"
)
DESCRIPTOR_ARROW: Final = pa.schema(
    [
        ("what", pa.string()),
        ("kind", pa.string()),
        ("tmp", pa.string()),
        ("target", pa.string()),
        ("topic", pa.string()),
        ("queue", pa.int64()),
        ("start_offset", pa.int64()),
        ("end_offset", pa.int64()),
        ("address", pa.string()),
        ("txn", pa.string()),
        ("rows", pa.int64()),
    ]
)


@dataclass(frozen=True, slots=True)
class TaskJob:
    """What every task of micro-batch `batch_id` needs; pickled to the executors."""

    #: The pipeline's output directory, as the executors see it.
    root: str
    batch_id: int
    #: The results topic's sink (None: Parquet only).
    sink: SinkOptions | None = None
    #: The run's accumulator of the tasks' answers (`AnswersParam`), or None.
    answers: Any = None


#: What a task adds to the run's accumulator: (batch id, descriptor row), per row.
Answer = tuple[int, dict[str, Any]]


class AnswersParam:
    """Spark's accumulator parameter (by its methods) for lists of `Answer`."""

    def zero(self, value: list[Answer]) -> list[Answer]:
        return []

    def addInPlace(self, acc: list[Answer], more: list[Answer]) -> list[Answer]:  # noqa: N802 - Spark's name
        acc.extend(more)
        return acc


def descriptor_rows(
    results: list[StagedResult],
    rejected: list[Staged],
    refs: list[TxnRef],
    counts: Mapping[str, int],
    sent: int,
) -> list[dict[str, Any]]:
    """A task's answer, as rows of `DESCRIPTOR_ARROW` (the driver reads them back with
    `analytics_publish.BatchDescriptors.of`)."""
    rows: list[dict[str, Any]] = []
    for r in results:
        kind = r.path.parent.parent.name
        rows.append(
            {
                "what": "result",
                "kind": kind,
                "tmp": str(r.tmp),
                "target": str(r.path),
                "rows": r.rows,
            }
        )
    for s in rejected:
        f = s.file
        rows.append(
            {
                "what": "rejected",
                "kind": "rejected",
                "tmp": str(s.tmp),
                "target": str(f.path),
                "topic": f.topic,
                "queue": f.queue,
                "start_offset": f.start_offset,
                "end_offset": f.end_offset,
                "rows": f.rows,
            }
        )
    rows += [{"what": "txn", "address": a, "txn": t} for a, t in refs]
    rows += [{"what": "count", "kind": k, "rows": n} for k, n in counts.items()]
    rows.append({"what": "sent", "rows": sent})
    return rows


def _send(job: TaskJob, tables: Mapping[Kind, pa.Table]) -> tuple[list[TxnRef], int]:
    """Send the task's results in transactions left open."""
    from tidemq.spark.sink import write_transaction  # noqa: PLC0415 - pyspark on demand

    assert job.sink is not None
    batches = [message_batch(tables[k], k) for k in RESULT_KINDS if tables[k].num_rows]
    if not batches:
        return [], 0
    return write_transaction(job.sink, batches)


def _partition() -> int:
    from pyspark import TaskContext  # noqa: PLC0415 - inside a task

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


def write_partition(job: TaskJob, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The task (`mapInArrow`): write the partition's outputs, answer with descriptors."""
    chunks = list(batches)
    if not any(b.num_rows for b in chunks):
        yield pa.RecordBatch.from_pylist(descriptor_rows([], [], [], {}, 0), DESCRIPTOR_ARROW)
        return
    tables = split_kinds(pa.Table.from_batches(chunks))
    del chunks
    root, task = Path(job.root), _partition()
    results: list[StagedResult] = []
    rejected: list[Staged] = []
    try:
        for kind in RESULT_KINDS:
            results += stage_results(tables[kind], root, kind, job.batch_id, task)
        rejected = stage_table(tables["rejected"], root / "rejected")
        refs, sent = _send(job, tables) if job.sink is not None else ([], 0)
    except BaseException:
        for path in [r.tmp for r in results] + [s.tmp for s in rejected]:
            path.unlink(missing_ok=True)
        raise
    counts: dict[str, int] = {k: tables[k].num_rows for k in KINDS if tables[k].num_rows}
    rows = descriptor_rows(results, rejected, refs, counts, sent)
    if job.answers is not None:
        job.answers.add([(job.batch_id, row) for row in rows])
    yield pa.RecordBatch.from_pylist(rows, DESCRIPTOR_ARROW)
