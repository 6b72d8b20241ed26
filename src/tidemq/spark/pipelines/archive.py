"""The `archive` pipeline: tidemq topics -> Parquet files, exactly once and resumable.

The files' layout and metadata are in `archive_files`: one file per queue, hour (UTC) and
task, `<output>/topic=<t>/dt=YYYY-MM-DD/hour=HH/part-<queue>-<startOffset>-<endOffset>.parquet`.

How it is exactly once, together with Spark's checkpoint:

* Spark writes the offset range of micro-batch N to the checkpoint's offset log before
  running it, and marks it done in the commit log after `foreachBatch` returns. After a
  crash in between, the restarted query runs batch N again over the *same* ranges (the
  tidemq source replays exactly the logged ranges), so it sees the same rows.
* File names depend only on those rows (topic, queue, hour, first and last offset), so
  the replay produces the same names with the same content, and publishing it again
  replaces a file by an identical one instead of adding a duplicate.
* Executors write the files (issue 21: nothing but file names reaches the driver): each
  Spark task of the source (`archive_source`) fetches its offset range and writes its
  rows as they come, grouped per (topic, queue, hour), under hidden temporary names
  (`.part-...tmp-<random>`, which Spark, DuckDB and pyarrow skip), and answers with what
  it staged. The driver then publishes the batch: an atomic rename per file, so a reader
  never sees half a file, after removing any published file of the same topic and queue
  whose offset range overlaps a new one: that can only be an earlier attempt of this
  batch (batches' ranges are disjoint), split differently across tasks, which would
  otherwise be read twice. A crash leaves at most hidden temporary files, removed by the
  next publish of their directory once an hour old.
* Batches after the last committed one start where it ended: the pipeline resumes from
  its checkpoint and never re-reads what an earlier, committed batch archived.

`output` must be a directory that the executors and the driver see alike: a local one in
local mode (the default), a shared mount on a cluster. A task holds about a row group
(`archive_files.GROUP_BYTES`) per file it writes, whatever its range's size;
`max_offsets_per_trigger` and `min_partitions` (the source's `minPartitions`) bound how
much one task and one micro-batch write.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tidemq.spark.pipelines.archive_files import (
    META_END_OFFSET,
    META_QUEUE,
    META_START_OFFSET,
    META_TOPIC,
    STALE_TMP_S,
    ArchiveFile,
    Staged,
    hour_partition,
    part_path,
    publish,
    skip_temporary,
    stage_file,
    stage_table,
    write_table,
)
from tidemq.spark.pipelines.streams import (
    ARCHIVE_MAX_OFFSETS_PER_TRIGGER,
    Trigger,
    check_trigger,
    read_topics,
    start,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from tidemq.spark.options import ClientOptions

__all__ = [
    "META_END_OFFSET",
    "META_QUEUE",
    "META_START_OFFSET",
    "META_TOPIC",
    "STALE_TMP_S",
    "ArchiveFile",
    "Staged",
    "hour_partition",
    "part_path",
    "publish",
    "run_archive",
    "skip_temporary",
    "stage_file",
    "stage_table",
    "write_table",
]


def run_archive(
    spark: SparkSession,
    *,
    bootstrap: str,
    topics: Sequence[str],
    output: str | Path,
    checkpoint: str | Path,
    trigger: Trigger = "available_now",
    max_offsets_per_trigger: int | None = ARCHIVE_MAX_OFFSETS_PER_TRIGGER,
    min_partitions: int | None = None,
    client: ClientOptions | None = None,
) -> StreamingQuery:
    """Archive `topics` into Parquet under `output` (see the module docstring), with
    Spark's checkpoint in `checkpoint` (run again with the same one to resume).

    `min_partitions`: the source's `minPartitions` (at least that many tasks per
    micro-batch). A micro-batch that failed for its size (a task out of memory) is
    replayed over the same recorded offsets; a larger `min_partitions` reads it in more,
    smaller pieces, and the publish replaces what an earlier attempt published.
    `client`: login and TLS for the brokers (None: plaintext, no login).

    `trigger="available_now"` archives what the topics hold now (in micro-batches of at
    most `max_offsets_per_trigger` messages) and returns the finished query (a failure
    raises `StreamingQueryException`); `"continuous"` starts micro-batches one after the
    other and returns the running query (stop it with `query.stop()`).

    Spark's tasks write the files; the driver only renames them into place."""
    if not topics:
        raise ValueError("give at least one topic")
    check_trigger(trigger)
    root = Path(output)
    if min_partitions is not None and min_partitions < 1:
        raise ValueError(f"min_partitions must be >= 1, got {min_partitions}")
    import tidemq.spark  # noqa: PLC0415
    from tidemq.spark.pipelines.archive_source import (  # noqa: PLC0415 - pyspark
        ROOT_OPTION,
        SOURCE_NAME,
        ArchiveDataSource,
        staged_of,
    )

    # Before registering: registering is when Spark reads which Python the workers run.
    tidemq.spark.use_this_python(spark)
    spark.dataSource.register(ArchiveDataSource)
    options = {ROOT_OPTION: str(root)}
    if min_partitions is not None:
        options["minPartitions"] = str(min_partitions)
    stream = read_topics(
        spark,
        bootstrap=bootstrap,
        topics=topics,
        max_offsets_per_trigger=max_offsets_per_trigger,
        options=options,
        client=client,
        source=SOURCE_NAME,
    )

    def archive_batch(df: DataFrame, batch_id: int) -> None:
        rows = df.where(df.staged.isNotNull()).collect()
        publish([staged_of(row.staged) for row in rows])

    writer = (
        stream.writeStream.queryName(f"tidemq-archive-{uuid.uuid4().hex[:8]}")
        .foreachBatch(archive_batch)
        .option("checkpointLocation", str(checkpoint))
    )
    return start(writer, trigger)
