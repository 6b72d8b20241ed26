"""What every pipeline does the same way: read its topics as a stream with the `tidemq`
source, and start its query with AvailableNow or as a continuous query."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Final, Literal

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    from tidemq.spark.options import ClientOptions

__all__ = [
    "ARCHIVE_MAX_OFFSETS_PER_TRIGGER",
    "DEFAULT_MAX_OFFSETS_PER_TRIGGER",
    "TRIGGERS",
    "Trigger",
    "check_trigger",
    "read_topics",
    "start",
]

#: Messages per micro-batch of every pipeline unless told otherwise (issue 21: without a
#: limit, `archive` read a whole 1.5 GB backlog as batch 0 and ran the driver out of
#: memory, and once recorded in the checkpoint, that batch is replayed whole on every
#: restart). None (an explicit choice) reads everything available in one batch.
DEFAULT_MAX_OFFSETS_PER_TRIGGER: Final = 100_000
#: `archive`'s: its tasks write as they read (a row group per file in memory) and the
#: driver holds no message, so the batch's size bounds no memory, only what a replay
#: redoes; each micro-batch costs about 0.5 s besides its rows (query progress: the
#: checkpoint's writes, the planning, a job), which 100,000 messages of 1 KiB doubled.
ARCHIVE_MAX_OFFSETS_PER_TRIGGER: Final = 1_000_000

Trigger = Literal["available_now", "continuous"]
TRIGGERS: tuple[Trigger, ...] = ("available_now", "continuous")


def check_trigger(trigger: str) -> None:
    if trigger not in TRIGGERS:
        raise ValueError(f"trigger must be 'available_now' or 'continuous', got {trigger!r}")


def read_topics(
    spark: SparkSession,
    *,
    bootstrap: str,
    topics: Sequence[str],
    max_offsets_per_trigger: int | None,
    include_headers: bool = True,
    options: dict[str, str] | None = None,
    client: ClientOptions | None = None,
    source: str = "tidemq",
) -> DataFrame:
    """`topics` as a stream from their earliest offsets (the source registered first);
    `options`: more source options (`valueFormat`, ...); `client`: the login and TLS of
    the executors' connections; `source`: the format, `tidemq` or one built on it and
    registered by the caller (`archive`'s)."""
    import tidemq.spark  # noqa: PLC0415 - pyspark on demand

    tidemq.spark.register(spark)
    reader = (
        spark.readStream.format(source)
        .option("bootstrap", bootstrap)
        .option("subscribe", ",".join(topics))
        .option("startingOffsets", "earliest")
    )
    if include_headers:
        reader = reader.option("includeHeaders", "true")
    if max_offsets_per_trigger is not None:
        reader = reader.option("maxOffsetsPerTrigger", str(max_offsets_per_trigger))
    for key, value in {**(client.source_options() if client else {}), **(options or {})}.items():
        reader = reader.option(key, value)
    return reader.load()


def start(writer: DataStreamWriter, trigger: Trigger) -> StreamingQuery:
    """Start the query: with AvailableNow, return it finished (a failure raises
    StreamingQueryException); continuous, return it running."""
    if trigger == "available_now":
        query = writer.trigger(availableNow=True).start()
        query.awaitTermination()
        return query
    return writer.start()
