"""`tidemq pipeline archive`: topics -> Parquet, on Spark local mode by default
(`--master local[*]`) or on a cluster with `--master`."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from tidemq.cli.common import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    CliUsageError,
    check_bootstrap,
    command,
    say,
)
from tidemq.cli.pipeline_common import (
    Checkpoint,
    Master,
    MaxOffsets,
    MinPartitions,
    Once,
    app,
    load,
    pipeline_client,
    require_topics,
    run_query,
    session,
    spark_failures,
)
from tidemq.spark.pipelines.streams import ARCHIVE_MAX_OFFSETS_PER_TRIGGER

__all__ = ["archive"]


@command(app, "archive")
def archive(
    *,
    topic: Annotated[
        list[str],
        typer.Option("--topic", "-t", metavar="TOPIC", help="Topic to archive (repeat for more)."),
    ],
    output: Annotated[
        Path,
        typer.Option("--output", metavar="DIR", help="Root directory of the Parquet files."),
    ],
    checkpoint: Checkpoint,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    master: Master = "local[*]",
    once: Once = True,
    max_offsets_per_trigger: MaxOffsets = ARCHIVE_MAX_OFFSETS_PER_TRIGGER,
    min_partitions: MinPartitions = None,
) -> None:
    """Archive topics into Parquet files (topic=/dt=/hour=), exactly once, resumable."""
    address = check_bootstrap(bootstrap)
    if not topic:
        raise CliUsageError("give at least one --topic")
    pipeline = load("tidemq.spark.pipelines.archive")
    require_topics(address, topic)
    with spark_failures("the archive query"):
        spark, created = session(master, "tidemq-archive")
        progress = load("tidemq.spark.pipelines.progress").ProgressTotals(spark)
        try:
            query = pipeline.run_archive(
                spark,
                bootstrap=address,
                topics=topic,
                output=output,
                checkpoint=checkpoint,
                trigger="available_now" if once else "continuous",
                max_offsets_per_trigger=max_offsets_per_trigger,
                min_partitions=min_partitions,
                client=pipeline_client(),
            )
            rows, batches = run_query(
                query, progress, once=once, running=f"archiving {', '.join(topic)} to {output}"
            )
            say(f"archived {rows} message(s) in {batches} micro-batch(es) to {output}")
        except ValueError as exc:  # the source's OptionError, a bad argument
            raise CliUsageError(str(exc)) from None
        finally:
            progress.close()
            if created:
                spark.stop()
