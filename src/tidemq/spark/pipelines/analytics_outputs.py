"""The outputs of the `analytics` pipeline's micro-batches, as a Spark task writes its share
and the driver publishes it: Parquet files per kind and day, staged under hidden names and
renamed into place, and the messages of the results topic. Pure pyarrow: no pyspark, no
client (see `analytics` for the guarantees, `analytics_tasks` for who calls what).

A file of results holds the rows of one kind, one UTC day (of the window or session
start), one micro-batch and one task::

    <root>/<kind>/dt=YYYY-MM-DD/part-<batch:08d>-<task:05d>.parquet

`task` is the Spark partition of the micro-batch's frame that wrote it. A replay of the
batch computes the same rows in the same partitions (the state's shuffle partitions are
kept in the checkpoint), hence the same names and, rows sorted, the same bytes; a replay
split otherwise is still exactly once: the publish removes the batch's files of an
earlier attempt that it does not replace. Files of the earlier layout,
``part-<batch:08d>.parquet`` (one per kind, day and batch, written on the driver), count as
files of their batch.
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from tidemq.spark.pipelines.analytics_frames import KINDS, Kind
from tidemq.spark.pipelines.archive import skip_temporary, stage_file

__all__ = [
    "RESULT_KINDS",
    "StagedResult",
    "message_batch",
    "publish_results",
    "result_messages",
    "result_path",
    "split_kinds",
    "stage_results",
    "write_results",
]

#: The kinds that are aggregates: Parquet under `<kind>/` and the results topic.
RESULT_KINDS: Final[tuple[Kind, ...]] = ("tumbling", "sliding", "session")
#: A published file of results: batch id, and the task (absent in the earlier layout).
_PART: Final = re.compile(r"part-(\d+)(?:-(\d+))?\.parquet")


def _start_column(kind: Kind) -> str:
    return "session_start" if kind == "session" else "window_start"


def _sorted(table: pa.Table) -> pa.Table:
    """Rows in the order of all their columns: a replay writes the same bytes."""
    return table.sort_by([(name, "ascending") for name in table.column_names])


def split_kinds(table: pa.Table) -> dict[Kind, pa.Table]:
    """The rows of each kind of a micro-batch's frame (`analytics_frame`'s columns: `kind`
    and one struct column per kind)."""
    out: dict[Kind, pa.Table] = {}
    for kind in KINDS:
        rows = table.filter(pc.equal(table.column("kind"), kind)).column(kind)
        out[kind] = pa.Table.from_struct_array(rows.combine_chunks())
    return out


def result_path(root: Path, kind: Kind, day: str, batch_id: int, task: int) -> Path:
    """Where task `task`'s rows of `kind`, day `day` (YYYY-MM-DD) and batch `batch_id` go."""
    if kind not in RESULT_KINDS:
        raise ValueError(f"no result files for kind {kind!r}")
    if batch_id < 0 or task < 0:
        raise ValueError(f"batch_id and task must be >= 0, got {batch_id}, {task}")
    return root / kind / f"dt={day}" / f"part-{batch_id:08d}-{task:05d}.parquet"


@dataclass(frozen=True, slots=True)
class StagedResult:
    """A file of results written under the temporary name `tmp`, to be published as
    `path`."""

    tmp: Path
    path: Path
    rows: int


def stage_results(
    table: pa.Table, root: Path, kind: Kind, batch_id: int, task: int
) -> list[StagedResult]:
    """Write a task's rows of `kind` under temporary names: one file per UTC day of the
    window or session start, rows sorted (the same rows give the same bytes)."""
    if table.num_rows == 0:
        return []
    table = _sorted(table)
    start = table.column(_start_column(kind))
    if start.type.tz != "UTC":
        start = start.cast(pa.timestamp(start.type.unit, tz="UTC"))
    days = pc.strftime(start, format="%Y-%m-%d")
    out: list[StagedResult] = []
    try:
        for day in sorted(pc.unique(days).to_pylist()):
            part = table.filter(pc.equal(days, day))
            target = result_path(root, kind, day, batch_id, task)
            out.append(StagedResult(stage_file(part, target), target, part.num_rows))
    except BaseException:
        for s in out:
            s.tmp.unlink(missing_ok=True)
        raise
    return out


def publish_results(staged: Sequence[StagedResult], batch_id: int) -> None:
    """Rename staged files of batch `batch_id` into place (atomic on one file system; a
    replay's file replaces an identical one), after removing, in each directory they go
    to, published files of the same batch that none of them replaces (an earlier attempt
    split otherwise, or the earlier layout) and temporaries a crash left (once stale).
    On failure, removes the temporaries not published yet and raises."""
    by_dir: dict[Path, list[StagedResult]] = {}
    for s in staged:
        by_dir.setdefault(s.path.parent, []).append(s)
    try:
        for directory, files in by_dir.items():
            _remove_replaced(directory, {s.path.name for s in files}, batch_id)
            for s in files:
                os.replace(s.tmp, s.path)
    except BaseException:
        for s in staged:
            s.tmp.unlink(missing_ok=True)
        raise


def _remove_replaced(directory: Path, new: set[str], batch_id: int) -> None:
    now = time.time()
    for existing in directory.iterdir():
        if skip_temporary(existing, now) or existing.name in new:
            continue
        match = _PART.fullmatch(existing.name)
        if match is not None and int(match.group(1)) == batch_id:
            existing.unlink(missing_ok=True)


def write_results(
    table: pa.Table, root: Path, kind: Kind, batch_id: int, task: int = 0
) -> list[Path]:
    """Stage and publish rows of one batch in one process (`stage_results`,
    `publish_results`); returns the files."""
    staged = stage_results(table, root, kind, batch_id, task)
    publish_results(staged, batch_id)
    return [s.path for s in staged]


# ------------------------------------------------------------------ the results topic


def _ms(value: datetime) -> int:
    utc = value.replace(tzinfo=UTC) if value.tzinfo is None else value
    return int(utc.timestamp() * 1000)


def _key_field(kind: Kind) -> str:
    if kind == "rejected":
        raise ValueError("rejected rows are not sent to the results topic")
    return "user_id" if kind == "session" else "item_id"


def result_messages(table: pa.Table, kind: Kind) -> list[tuple[bytes, bytes]]:
    """(key, JSON value) of each result row, in the order `stage_results` sorts them.
    Times become epoch milliseconds; the value carries `kind` too. One row at a time: the
    reference for `message_batch`."""
    key_field = _key_field(kind)
    out = []
    for row in _sorted(table).to_pylist():
        doc: dict[str, Any] = {"kind": kind}
        for name, value in row.items():
            doc[name] = _ms(value) if isinstance(value, datetime) else value
        out.append((str(row[key_field]).encode(), json.dumps(doc, separators=(",", ":")).encode()))
    return out


def _json_column(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A column's values as JSON text, as `json.dumps` writes them (null: `null`, which
    the join below puts in)."""
    t = column.type
    if pa.types.is_timestamp(t):
        micros = column.cast(pa.timestamp("us", tz=t.tz)).cast(pa.int64())
        return pc.divide(micros, 1000).cast(pa.string())  # truncates, as int() does
    if pa.types.is_integer(t):
        return column.cast(pa.string())
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        encoded = column.combine_chunks().dictionary_encode()
        texts = pa.array([json.dumps(v) for v in encoded.dictionary.to_pylist()], pa.string())
        return pa.chunked_array([texts.take(encoded.indices)], pa.string())
    raise TypeError(f"no JSON encoding for a column of type {t}")


def message_batch(table: pa.Table, kind: Kind) -> pa.RecordBatch:
    """The messages of `result_messages` as one Arrow batch for the topic sink (`key`,
    `value` binary, `tag` = kind), built column by column: the same bytes, without a
    Python object per row."""
    key_field = _key_field(kind)
    table = _sorted(table)
    pieces: list[Any] = []
    for i, name in enumerate(table.column_names):
        head = "{" + json.dumps("kind") + ":" + json.dumps(kind) if i == 0 else ""
        pieces += [f"{head},{json.dumps(name)}:", _json_column(table.column(name))]
    pieces.append("}")
    value = pc.binary_join_element_wise(
        *pieces, "", null_handling="replace", null_replacement="null"
    )
    key = pc.fill_null(table.column(key_field).cast(pa.string()), "None")  # str(None)
    n = table.num_rows
    return pa.RecordBatch.from_arrays(
        [
            key.combine_chunks().cast(pa.binary()),
            value.combine_chunks().cast(pa.binary()),
            pa.array([kind] * n, pa.string()),
        ],
        names=["key", "value", "tag"],
    )
