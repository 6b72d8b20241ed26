"""The `archive` pipeline: tidemq topics -> Parquet files, exactly once and resumable.

Layout (conventions §7), Hive-style so that Spark, DuckDB and pyarrow read it::

    <output>/topic=<t>/dt=YYYY-MM-DD/hour=HH/part-<queue>-<startOffset>-<endOffset>.parquet

zstd-compressed, with the source's columns (conventions §4, headers included). A file
holds the messages of one queue whose timestamp (UTC) falls in one hour, out of one
micro-batch; `startOffset` is the smallest offset in it and `endOffset` the largest plus
one. The same range and the topic/queue are in the Parquet key-value metadata
(`tidemq.topic`, `tidemq.queue`, `tidemq.start_offset`, `tidemq.end_offset`).

How it is exactly once, together with Spark's checkpoint:

* Spark writes the offset range of micro-batch N to the checkpoint's offset log before
  running it, and marks it done in the commit log after `foreachBatch` returns. After a
  crash in between, the restarted query runs batch N again over the *same* ranges (the
  tidemq source replays exactly the logged ranges), so it sees the same rows.
* File names depend only on those rows (topic, queue, hour, first and last offset), so
  the replay produces the same names with the same content, and publishing it again
  replaces a file by an identical one instead of adding a duplicate.
* Each file is written under a hidden temporary name (`.part-...tmp-<random>`, which
  Spark, DuckDB and pyarrow skip) and published with an atomic rename, so a reader never
  sees half a file; a crash leaves at most a hidden temporary file behind.
* Batches after the last committed one start where it ended: the pipeline resumes from
  its checkpoint and never re-reads what an earlier, committed batch archived.

Simplicity over scale: each micro-batch is collected to the driver as Arrow
(`DataFrame.toArrow()`) and written there with `pyarrow.parquet`, so `output` must be a
local (or mounted) directory of the driver and a micro-batch must fit in its memory;
bound it with `max_offsets_per_trigger`. That suits Spark local mode, the default.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tidemq.spark.pipelines.streams import (
    DEFAULT_MAX_OFFSETS_PER_TRIGGER,
    Trigger,
    check_trigger,
    read_topics,
    start,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = [
    "META_END_OFFSET",
    "META_QUEUE",
    "META_START_OFFSET",
    "META_TOPIC",
    "ArchiveFile",
    "hour_partition",
    "part_path",
    "run_archive",
    "write_table",
]

META_TOPIC = "tidemq.topic"
META_QUEUE = "tidemq.queue"
META_START_OFFSET = "tidemq.start_offset"
META_END_OFFSET = "tidemq.end_offset"


@dataclass(frozen=True, slots=True)
class ArchiveFile:
    """One published file: messages of `topic`/`queue` in [start_offset, end_offset)
    whose timestamps fall in hour `hour` (0-23) of day `dt` (YYYY-MM-DD, UTC)."""

    topic: str
    queue: int
    dt: str
    hour: int
    start_offset: int
    end_offset: int
    rows: int
    path: Path


def hour_partition(ts: datetime) -> tuple[str, int]:
    """The (`dt`, `hour`) partition of a timestamp, in UTC (naive means UTC)."""
    utc = ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)
    return utc.strftime("%Y-%m-%d"), utc.hour


def part_path(
    root: Path, *, topic: str, queue: int, dt: str, hour: int, start_offset: int, end_offset: int
) -> Path:
    """Where the file of that range goes (conventions §7)."""
    if not 0 <= hour < 24:
        raise ValueError(f"hour must be 0-23, got {hour}")
    if not 0 <= start_offset < end_offset:
        raise ValueError(f"bad offset range [{start_offset}, {end_offset})")
    if not topic or "/" in topic or topic in (".", ".."):
        raise ValueError(f"bad topic name {topic!r}")
    return (
        root
        / f"topic={topic}"
        / f"dt={dt}"
        / f"hour={hour:02d}"
        / f"part-{queue}-{start_offset}-{end_offset}.parquet"
    )


def _publish(table: pa.Table, target: Path) -> None:
    """Write `table` under a hidden temporary name next to `target`, then rename it into
    place (atomic on one file system; replaces an earlier, identical file)."""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex}")
    try:
        pq.write_table(table, tmp, compression="zstd")
        os.replace(tmp, target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_table(table: pa.Table, root: Path) -> list[ArchiveFile]:
    """Write the rows of one micro-batch (the source's columns) into `root`: one file per
    (topic, queue, dt, hour) of the message timestamp (UTC), rows in offset order.

    Deterministic: the same rows give the same files, so writing a replayed batch again
    changes nothing. Pure pyarrow (no JVM)."""
    if table.num_rows == 0:
        return []
    ts = table.column("timestamp")
    if not pa.types.is_timestamp(ts.type):
        raise ValueError(f"column 'timestamp' must be a timestamp, got {ts.type}")
    if ts.type.tz != "UTC":  # none: Spark's UTC wall-clock values
        ts = ts.cast(pa.timestamp(ts.type.unit, tz="UTC"))
    keyed = pa.table(
        {
            "topic": table.column("topic"),
            "queue": table.column("partition"),
            "dt": pc.strftime(ts, format="%Y-%m-%d"),
            "hour": pc.hour(ts),
            "offset": table.column("offset"),
        }
    )
    keys = ["topic", "queue", "dt", "hour"]
    groups = keyed.group_by(keys, use_threads=False).aggregate(
        [("offset", "min"), ("offset", "max"), ("offset", "count")]
    )
    groups = groups.sort_by([(k, "ascending") for k in keys])
    out: list[ArchiveFile] = []
    for g in groups.to_pylist():
        mask = pc.and_(
            pc.and_(
                pc.equal(keyed.column("topic"), g["topic"]),
                pc.equal(keyed.column("queue"), g["queue"]),
            ),
            pc.and_(
                pc.equal(keyed.column("dt"), g["dt"]), pc.equal(keyed.column("hour"), g["hour"])
            ),
        )
        part = table.filter(mask).sort_by([("offset", "ascending")])
        start, end = int(g["offset_min"]), int(g["offset_max"]) + 1
        topic, queue = str(g["topic"]), int(g["queue"])
        meta = dict(part.schema.metadata or {})
        meta.update(
            {
                META_TOPIC.encode(): topic.encode(),
                META_QUEUE.encode(): str(queue).encode(),
                META_START_OFFSET.encode(): str(start).encode(),
                META_END_OFFSET.encode(): str(end).encode(),
            }
        )
        part = part.replace_schema_metadata(meta)
        path = part_path(
            root,
            topic=topic,
            queue=queue,
            dt=str(g["dt"]),
            hour=int(g["hour"]),
            start_offset=start,
            end_offset=end,
        )
        _publish(part, path)
        out.append(
            ArchiveFile(topic, queue, str(g["dt"]), int(g["hour"]), start, end, part.num_rows, path)
        )
    return out


def _to_arrow(df: DataFrame) -> pa.Table:
    """A micro-batch on the driver, as Arrow (`toArrow()`, pyspark >= 4.0; else pandas)."""
    to_arrow = getattr(df, "toArrow", None)
    if to_arrow is not None:
        table: pa.Table = to_arrow()
        return table
    return pa.Table.from_pandas(df.toPandas(), preserve_index=False)  # pragma: no cover


def run_archive(
    spark: SparkSession,
    *,
    bootstrap: str,
    topics: Sequence[str],
    output: str | Path,
    checkpoint: str | Path,
    trigger: Trigger = "available_now",
    max_offsets_per_trigger: int | None = DEFAULT_MAX_OFFSETS_PER_TRIGGER,
) -> StreamingQuery:
    """Archive `topics` into Parquet under `output` (see the module docstring), with
    Spark's checkpoint in `checkpoint` (run again with the same one to resume).

    `trigger="available_now"` archives what the topics hold now (in micro-batches of at
    most `max_offsets_per_trigger` messages) and returns the finished query (a failure
    raises `StreamingQueryException`); `"continuous"` starts micro-batches one after the
    other and returns the running query (stop it with `query.stop()`).

    Each micro-batch is collected to the driver with `toArrow()` and written with
    pyarrow: fine for local mode, bounded by `max_offsets_per_trigger`."""
    if not topics:
        raise ValueError("give at least one topic")
    check_trigger(trigger)
    root = Path(output)
    stream = read_topics(
        spark, bootstrap=bootstrap, topics=topics, max_offsets_per_trigger=max_offsets_per_trigger
    )

    def archive_batch(df: DataFrame, batch_id: int) -> None:
        write_table(_to_arrow(df), root)

    writer = (
        stream.writeStream.queryName(f"tidemq-archive-{uuid.uuid4().hex[:8]}")
        .foreachBatch(archive_batch)
        .option("checkpointLocation", str(checkpoint))
    )
    return start(writer, trigger)
