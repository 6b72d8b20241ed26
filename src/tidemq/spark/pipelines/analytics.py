"""The `analytics` pipeline: user-behaviour events -> event-time aggregations, written to
a results topic and to Parquet, exactly once and resumable.

Input: the JSON events of `tidemq.spark.pipelines.events` (`user_id`, `item_id`,
`behavior`, `ts` in epoch milliseconds). Event time is `ts`; the watermark trails the
largest event time seen by `watermark_s`, and an event older than the watermark is
dropped by Spark (the generator never makes one).

One streaming query, checkpoint in ``<checkpoint>/query``, whose micro-batch reads the
topics once and computes every output (`analytics_frames`, ADR 16):

=========== =================================================== ====================
kind        rows (one per finished window or session)            message key
=========== =================================================== ====================
tumbling    window_start, window_end, behavior, item_id, count   item_id
sliding     the same, windows of `sliding_s` every `slide_s`      item_id
session     user_id, session_start, session_end, events, pv,      user_id
            fav, cart, buy (session windows of gap `session_gap_s`)
rejected    the source's columns, for a value that is not a valid event
=========== =================================================== ====================

The aggregations run in append mode: a window (or session) is written once, when the
watermark passes its end, with its final counts. Window bounds are epoch milliseconds in
the topic and timestamps in Parquet.

Outputs of micro-batch N, written by Spark's tasks where they run (`analytics_tasks`);
the driver only publishes them (`analytics_publish`) and never holds a row (issue 21):

* Parquet: ``<output>/<kind>/dt=YYYY-MM-DD/part-<N>-<task>.parquet`` (zstd; `dt` is the UTC
  day of the window or session start; `task` the partition of the batch that wrote it).
  `rejected` uses the archive layout under ``<output>/rejected/`` (`archive.py`).
* The results topic (not for `rejected`): one JSON message per row with tag `kind` (so a
  consumer subscribes to `tumbling || sliding` with a tag filter). Each task sends its
  rows in transactions of the group ``spark-sink-<sink id>``, left open; the driver
  commits all of batch N's as one unit per broker with the marker (sink id
  ``<name>-results-<token>``, N; the token is the checkpoint's, `sink_ids.py`, so that
  runs with other checkpoints never share markers).

Why each output is exactly once: Spark replays micro-batch N after a crash with the same
offset ranges and the same state version, so it computes the same rows. Tasks stage
files under hidden temporary names, rows sorted; the driver renames them into place with
names that depend only on N, the kind, the day and the task (a replay computes the same
rows in the same tasks), after removing any file of batch N that an earlier attempt
published and this one does not replace: a replay replaces files instead of adding any.
For the topic, the driver commits batch N's transactions with the marker, unless the
marker says N was committed already: then they are rolled back. A failed batch's
transactions are rolled back (those of tasks whose results Spark discarded are never
committed, and their brokers roll them back after the check-backs).

`output` must be a directory that the executors and the driver see alike: a local one in
local mode (the default), a shared mount on a cluster. A task holds its share of a
micro-batch's results (or rejected rows) in memory while it writes them: bound it with
`max_offsets_per_trigger`.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from tidemq.client.sync import Admin
from tidemq.core.errors import TopicNotFound
from tidemq.spark.options import ClientOptions, WriteOptions
from tidemq.spark.pipelines.analytics_frames import (
    EVENT_SCHEMA,
    INPUT_METRICS,
    KINDS,
    Kind,
    analytics_frame,
    parsed_events,
)
from tidemq.spark.pipelines.analytics_outputs import result_messages, write_results
from tidemq.spark.pipelines.analytics_publish import BatchOutputs
from tidemq.spark.pipelines.analytics_tasks import AnswersParam
from tidemq.spark.pipelines.sink_ids import sink_id, sink_token
from tidemq.spark.pipelines.streams import (
    DEFAULT_MAX_OFFSETS_PER_TRIGGER,
    Trigger,
    check_trigger,
    read_topics,
    start,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

    from tidemq.spark.pipelines.progress import ProgressTotals
    from tidemq.spark.sink import SinkOptions

__all__ = [
    "EVENT_SCHEMA",
    "INPUT_METRICS",
    "KINDS",
    "QUERY_DIR",
    "AnalyticsConfig",
    "AnalyticsRun",
    "Kind",
    "parsed_events",
    "result_messages",
    "run_analytics",
    "write_results",
]

#: The longest window, session gap or watermark delay accepted (a week): state lives
#: until the watermark passes, so longer ones mean unbounded state in practice.
MAX_DURATION_S: Final = 7 * 24 * 3600
#: Queues of the results topic when the pipeline creates it.
RESULT_QUEUES: Final = 4
#: The query's checkpoint, under the pipeline's.
QUERY_DIR: Final = "query"


@dataclass(frozen=True, slots=True)
class AnalyticsConfig:
    """Window sizes and the watermark delay, in seconds."""

    tumbling_s: int = 60
    sliding_s: int = 600
    slide_s: int = 60
    session_gap_s: int = 300
    watermark_s: int = 120

    def __post_init__(self) -> None:
        for name in ("tumbling_s", "sliding_s", "slide_s", "session_gap_s", "watermark_s"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer number of seconds, got {value!r}")
            if not 1 <= value <= MAX_DURATION_S:
                raise ValueError(f"{name} must be between 1 and {MAX_DURATION_S} s, got {value}")
        if self.sliding_s % self.slide_s:
            raise ValueError(
                f"sliding_s ({self.sliding_s}) must be a multiple of slide_s ({self.slide_s})"
            )


@dataclass(slots=True)
class AnalyticsRun:
    """The running (or, with AvailableNow, finished) query of one pipeline run."""

    query: StreamingQuery
    _outputs: BatchOutputs
    _progress: ProgressTotals

    def await_termination(self) -> None:
        """Wait for the query; when it fails, raise its error. Closes the producer."""
        try:
            self.query.awaitTermination()
        finally:
            self.close()

    def stop(self) -> None:
        """Stop the query (it ends after its current micro-batch)."""
        try:
            self.query.stop()
        finally:
            self.close()

    def rows(self) -> int:
        """Input rows the query has read (every micro-batch counted: see `progress.py`)."""
        return self._progress.totals(self.query).rows

    def rejected_rows(self) -> int:
        """Input rows of this run that were not valid events."""
        return sum(self._outputs.rejected.values())

    def close(self) -> None:
        """Close the producer of the results topic (a later batch opens one again)."""
        self._outputs.close()
        if not self.query.isActive:
            self._progress.close([self.query])


def _input_queues(bootstrap: str, topics: Sequence[str], client: ClientOptions) -> int:
    with Admin(bootstrap, client_config=client.client_config()) as admin:
        return max(1, sum(admin.describe_topic(t).queues for t in topics))


@contextlib.contextmanager
def _shuffle_partitions(spark: SparkSession, partitions: int) -> Iterator[None]:
    """Spark's `spark.sql.shuffle.partitions` for the query started inside. A streaming
    query keeps the value of its first run in its checkpoint for good, and the default
    (200) made analytics 2.5 times slower here than one per input queue (issue 21). The
    query runs on a copy of the session's conf taken when it starts, so the caller's
    value is restored afterwards without touching the query."""
    key = "spark.sql.shuffle.partitions"
    previous = spark.conf.get(key, None)
    spark.conf.set(key, str(partitions))
    try:
        yield
    finally:
        if previous is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, previous)


def _ensure_topic(bootstrap: str, topic: str, client: ClientOptions) -> None:
    with Admin(bootstrap, client_config=client.client_config()) as admin:
        try:
            admin.describe_topic(topic)
        except TopicNotFound:
            admin.create_topic(topic, RESULT_QUEUES)


def _check_layout(checkpoints: Path) -> None:
    """Refuse a checkpoint of the four-query analytics (before ADR 16): its state and
    offsets are per query, and the single query cannot take them over."""
    old = [kind for kind in KINDS if (checkpoints / kind).is_dir()]
    if old:
        raise ValueError(
            f"{checkpoints} is the checkpoint of an older analytics (one query per kind: "
            f"{', '.join(old)}), which this version cannot resume; finish it with that "
            "version, or start over with a new checkpoint and output"
        )


def run_analytics(
    spark: SparkSession,
    *,
    bootstrap: str,
    topics: Sequence[str],
    output: str | Path,
    checkpoint: str | Path,
    results_topic: str | None = "analytics-results",
    name: str = "analytics",
    config: AnalyticsConfig | None = None,
    trigger: Trigger = "available_now",
    max_offsets_per_trigger: int | None = DEFAULT_MAX_OFFSETS_PER_TRIGGER,
    value_format: str = "json",
    schema_registry: str | None = None,
    client: ClientOptions | None = None,
) -> AnalyticsRun:
    """Run the pipeline over `topics` (see the module docstring). Parquet goes under
    `output`; results also go to `results_topic` (created with `RESULT_QUEUES` queues
    when missing; None: Parquet only), with sink id ``<name>-results-<token>`` (the token
    is made at the checkpoint's first run and kept in it: see `sink_ids`).

    `trigger="available_now"` processes what the topics hold now (micro-batches of at
    most `max_offsets_per_trigger` messages) and returns when the query is done;
    `"continuous"` returns the running query. Run again with the same `checkpoint` to
    resume.

    `value_format="avro"`: the events are Avro (`events.py`), read with the first topic's
    subject (`<topic>-value`) from the registry at `schema_registry`. `client`: login and
    TLS for the brokers (None: plaintext, no login)."""
    if not topics:
        raise ValueError("give at least one topic")
    source_options = _source_options(topics, value_format, schema_registry)
    check_trigger(trigger)
    if max_offsets_per_trigger is not None and max_offsets_per_trigger < 1:
        raise ValueError(f"max_offsets_per_trigger must be >= 1, got {max_offsets_per_trigger}")
    config = config or AnalyticsConfig()
    root, checkpoints = Path(output), Path(checkpoint)
    _check_layout(checkpoints)
    token = sink_token(checkpoints)
    client = client or ClientOptions()
    partitions = _input_queues(bootstrap, topics, client)
    # What the tasks staged and began, also when their job fails (analytics_publish).
    # (AnswersParam is Spark's AccumulatorParam by its methods: no pyspark import here.)
    answers: Any = spark.sparkContext.accumulator([], AnswersParam())  # type: ignore[arg-type]
    sink = _results_sink(bootstrap, results_topic, name, token, client)
    outputs = BatchOutputs(root, sink, answers)
    source = read_topics(
        spark,
        bootstrap=bootstrap,
        topics=topics,
        max_offsets_per_trigger=max_offsets_per_trigger,
        options=source_options,
        client=client,
    )
    frame = analytics_frame(
        source,
        partitions=partitions,
        value_format=value_format,
        watermark_s=config.watermark_s,
        tumbling_s=config.tumbling_s,
        sliding_s=config.sliding_s,
        slide_s=config.slide_s,
        session_gap_s=config.session_gap_s,
    )

    from tidemq.spark.pipelines.progress import ProgressTotals  # noqa: PLC0415 - pyspark

    progress = ProgressTotals(spark)
    writer = (
        frame.writeStream.outputMode("append")
        .foreachBatch(outputs.write)
        .queryName(f"tidemq-{name}-{uuid.uuid4().hex[:6]}")
        .option("checkpointLocation", str(checkpoints / QUERY_DIR))
    )
    try:
        with _shuffle_partitions(spark, partitions):
            query = start(writer, trigger)
    except BaseException:
        outputs.close()
        progress.close()
        raise
    run = AnalyticsRun(query, outputs, progress)
    if trigger == "available_now":
        run.close()  # the query is done
    return run


def _results_sink(
    bootstrap: str, topic: str | None, name: str, token: str, client: ClientOptions
) -> SinkOptions | None:
    """The tasks' sink to the results topic (created when missing), None without one."""
    if topic is None:
        return None
    from tidemq.spark.sink import SinkOptions  # noqa: PLC0415 - pyspark on demand

    _ensure_topic(bootstrap, topic, client)
    write = WriteOptions(bootstrap, topic, client=client)
    return SinkOptions(write, sink_id(name, "results", token))


def _source_options(
    topics: Sequence[str], value_format: str, schema_registry: str | None
) -> dict[str, str]:
    if value_format == "json":
        if schema_registry is not None:
            raise ValueError("a schema registry is only read with value_format='avro'")
        return {}
    if value_format != "avro":
        raise ValueError(f"value_format must be 'json' or 'avro', got {value_format!r}")
    if not schema_registry:
        raise ValueError("value_format='avro' needs the schema registry's URL")
    return {
        "valueFormat": "avro",
        "schemaRegistry": schema_registry,
        "subject": f"{topics[0]}-value",
    }
