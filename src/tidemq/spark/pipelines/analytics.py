"""The `analytics` pipeline: user-behaviour events -> event-time aggregations, written to
a results topic and to Parquet, exactly once and resumable.

Input: the JSON events of `tidemq.spark.pipelines.events` (`user_id`, `item_id`,
`behavior`, `ts` in epoch milliseconds). Event time is `ts`; the watermark trails the
largest event time seen by `watermark_s`, and an event older than the watermark is
dropped by Spark (the generator never makes one).

Four streaming queries, each reading the topics on its own, with its checkpoint in
``<checkpoint>/<kind>``:

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

Outputs of micro-batch N of query `kind`:

* Parquet: ``<output>/<kind>/dt=YYYY-MM-DD/part-<N>.parquet`` (zstd; `dt` is the UTC day
  of the window or session start). `rejected` uses the archive layout under
  ``<output>/rejected/`` (`archive.write_table`).
* The results topic (not for `rejected`): one JSON message per row with tag `kind` (so a
  consumer subscribes to `tumbling || sliding` with a tag filter), in one transaction
  committed with the marker (sink id ``<name>-<kind>-<token>``, N; the token is the
  checkpoint's, `sink_ids.py`, so that runs with other checkpoints never share markers).

Why each output is exactly once: Spark replays micro-batch N after a crash with the same
offset ranges and the same state version, so it computes the same rows. The Parquet
files of batch N have names that depend only on N and the rows, and are published with an
atomic rename, so a replay replaces them with identical files. For the topic, the batch
is skipped when the sink's marker already says N was committed; else it is sent in a
transaction that commits together with the marker.

Results are collected to the driver (`toArrow()`): aggregates are small next to their
input, so this suits local mode and small clusters; `rejected` rows are bounded with
`max_offsets_per_trigger`.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, Literal

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tidemq.client.sync import Admin, TransactionProducer
from tidemq.core.errors import TopicNotFound
from tidemq.spark.options import ClientOptions
from tidemq.spark.pipelines.archive import write_table
from tidemq.spark.pipelines.events import BEHAVIORS
from tidemq.spark.pipelines.sink_ids import sink_id, sink_token
from tidemq.spark.pipelines.streams import (
    DEFAULT_MAX_OFFSETS_PER_TRIGGER,
    Trigger,
    check_trigger,
    read_topics,
)

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession
    from pyspark.sql.streaming.query import StreamingQuery
    from pyspark.sql.streaming.readwriter import DataStreamWriter

    from tidemq.spark.pipelines.progress import ProgressTotals

__all__ = [
    "KINDS",
    "AnalyticsConfig",
    "AnalyticsRun",
    "parsed_events",
    "result_messages",
    "run_analytics",
    "write_results",
]

Kind = Literal["tumbling", "sliding", "session", "rejected"]
KINDS: Final[tuple[Kind, ...]] = ("tumbling", "sliding", "session", "rejected")
EVENT_SCHEMA: Final = "user_id BIGINT, item_id BIGINT, behavior STRING, ts BIGINT"
#: Messages per transactional batch sent to the results topic.
RESULT_BATCH: Final = 500
#: The longest window, session gap or watermark delay accepted (a week): state lives
#: until the watermark passes, so longer ones mean unbounded state in practice.
MAX_DURATION_S: Final = 7 * 24 * 3600
#: How long a continuous run waits for one query to initialize before starting the next.
START_WAIT_S: Final = 60.0
#: Queues of the results topic when the pipeline creates it.
RESULT_QUEUES: Final = 4


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


def _valid(e: Column) -> Column:
    from pyspark.sql import functions as sf  # noqa: PLC0415 - pyspark on demand

    # coalesce: `isin` on a null behavior is null, and a null predicate would put the row
    # in neither output
    return sf.coalesce(
        e.isNotNull()
        & e["user_id"].isNotNull()
        & e["item_id"].isNotNull()
        & e["ts"].isNotNull()
        & e["behavior"].isin(*BEHAVIORS),
        sf.lit(False),
    )


def parsed_events(raw: DataFrame, value_format: str = "json") -> tuple[DataFrame, DataFrame]:
    """(events, rejected) of a source DataFrame: events have `user_id`, `item_id`,
    `behavior`, `ts` and `event_time` (timestamp); rejected rows keep the source columns.
    The rules are `events.parse_event`'s (a JSON object, integer ids and ts, a known
    behavior), as Spark's `from_json` applies them. With `value_format="avro"` the source
    decoded the values already (a struct column; a value that is not Avro of the subject
    fails the query in the source: the schema governs the stream), and only the rules on
    the fields apply."""
    from pyspark.sql import functions as sf  # noqa: PLC0415 - pyspark on demand

    if value_format == "avro":
        fields = [sf.col("value")[f].alias(f) for f in ("user_id", "item_id", "behavior", "ts")]
        with_e = raw.withColumn("_e", sf.when(sf.col("value").isNotNull(), sf.struct(*fields)))
    else:
        with_e = raw.withColumn("_e", sf.from_json(sf.col("value").cast("string"), EVENT_SCHEMA))
    ok = _valid(sf.col("_e"))
    events = (
        with_e.where(ok).select("_e.*").withColumn("event_time", sf.timestamp_millis(sf.col("ts")))
    )
    rejected = with_e.where(~ok).drop("_e")
    return events, rejected


def _aggregate(events: DataFrame, kind: Kind, config: AnalyticsConfig) -> DataFrame:
    from pyspark.sql import functions as sf  # noqa: PLC0415 - pyspark on demand

    watermarked = events.withWatermark("event_time", f"{config.watermark_s} seconds")
    if kind == "session":
        behavior = sf.col("behavior")
        counts = [sf.sum((behavior == b).cast("long")).alias(b) for b in BEHAVIORS]
        return (
            watermarked.groupBy(
                sf.session_window("event_time", f"{config.session_gap_s} seconds").alias("s"),
                "user_id",
            )
            .agg(sf.count(sf.lit(1)).alias("events"), *counts)
            .select(
                "user_id",
                sf.col("s.start").alias("session_start"),
                sf.col("s.end").alias("session_end"),
                "events",
                *BEHAVIORS,
            )
        )
    if kind == "tumbling":
        window = sf.window("event_time", f"{config.tumbling_s} seconds")
    else:
        window = sf.window("event_time", f"{config.sliding_s} seconds", f"{config.slide_s} seconds")
    return (
        watermarked.groupBy(window.alias("w"), "behavior", "item_id")
        .agg(sf.count(sf.lit(1)).alias("count"))
        .select(
            sf.col("w.start").alias("window_start"),
            sf.col("w.end").alias("window_end"),
            "behavior",
            "item_id",
            "count",
        )
    )


# ----------------------------------------------------------------- outputs of one batch


def _start_column(kind: Kind) -> str:
    return "session_start" if kind == "session" else "window_start"


def write_results(table: pa.Table, root: Path, kind: Kind, batch_id: int) -> list[Path]:
    """Write one micro-batch of results to ``root/<kind>/dt=.../part-<batch_id>.parquet``
    (one file per UTC day of the window or session start); returns the files. Rows are
    sorted, so a replayed batch writes byte-identical files. Pure pyarrow."""
    if table.num_rows == 0:
        return []
    if batch_id < 0:
        raise ValueError(f"batch_id must be >= 0, got {batch_id}")
    start = table.column(_start_column(kind))
    if start.type.tz != "UTC":
        start = start.cast(pa.timestamp(start.type.unit, tz="UTC"))
    days = pc.strftime(start, format="%Y-%m-%d")
    order = [(name, "ascending") for name in table.column_names]
    out = []
    for day in sorted(pc.unique(days).to_pylist()):
        part = table.filter(pc.equal(days, day)).sort_by(order)
        target = root / kind / f"dt={day}" / f"part-{batch_id:08d}.parquet"
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex}")
        try:
            pq.write_table(part, tmp, compression="zstd")
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        out.append(target)
    return out


def _ms(value: datetime) -> int:
    utc = value.replace(tzinfo=UTC) if value.tzinfo is None else value
    return int(utc.timestamp() * 1000)


def result_messages(table: pa.Table, kind: Kind) -> list[tuple[bytes, bytes]]:
    """(key, JSON value) of each result row, in the order `write_results` sorts them.
    Times become epoch milliseconds; the value carries `kind` too."""
    if kind == "rejected":
        raise ValueError("rejected rows are not sent to the results topic")
    order = [(name, "ascending") for name in table.column_names]
    rows = table.sort_by(order).to_pylist()
    key_field = "user_id" if kind == "session" else "item_id"
    out = []
    for row in rows:
        doc: dict[str, Any] = {"kind": kind}
        for name, value in row.items():
            doc[name] = _ms(value) if isinstance(value, datetime) else value
        out.append((str(row[key_field]).encode(), json.dumps(doc, separators=(",", ":")).encode()))
    return out


@dataclass(slots=True)
class _TopicSink:
    """Sends a query's results to the topic, exactly once per batch id (see the module
    docstring). One per query: foreachBatch calls of one query never overlap."""

    bootstrap: str
    topic: str
    group: str
    sink_id: str
    kind: Kind
    client: ClientOptions
    _producer: TransactionProducer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def publish(self, table: pa.Table, batch_id: int) -> int:
        """Send the rows of `batch_id` unless its marker says it was; the count sent."""
        if table.num_rows == 0:
            return 0
        with self._lock:
            if self._producer is None:
                self._producer = TransactionProducer(
                    self.bootstrap, self.group, client_config=self.client.client_config()
                )
            producer = self._producer
        if producer.sink_marker(self.sink_id) >= batch_id:
            return 0  # a replay of a batch already published
        messages = result_messages(table, self.kind)
        with producer.transaction() as tx:
            for i in range(0, len(messages), RESULT_BATCH):
                chunk = messages[i : i + RESULT_BATCH]
                tx.send_batch(
                    self.topic,
                    [v for _, v in chunk],
                    keys=[k for k, _ in chunk],
                    tags=[self.kind] * len(chunk),
                )
            tx.commit(sink_id=self.sink_id, batch_id=batch_id)
        return len(messages)

    def close(self) -> None:
        with self._lock:
            if self._producer is not None:
                self._producer.close()
                self._producer = None


def _to_arrow(df: DataFrame) -> pa.Table:
    table: pa.Table = df.toArrow()
    return table


@dataclass(slots=True)
class AnalyticsRun:
    """The running (or, with AvailableNow, finished) queries of one pipeline run."""

    queries: dict[Kind, StreamingQuery]
    _sinks: list[_TopicSink]
    _progress: ProgressTotals

    def await_termination(self) -> None:
        """Wait for every query; when one fails, stop the others and raise its error.
        Closes the pipeline's producers."""
        try:
            for query in self.queries.values():
                query.awaitTermination()
        except BaseException:
            self.stop()
            raise
        self.close()

    def stop(self) -> None:
        """Stop every query (each ends after its current micro-batch)."""
        try:
            for query in self.queries.values():
                query.stop()
        finally:
            self.close()

    def rows(self) -> dict[Kind, int]:
        """Input rows each query has processed (every micro-batch counted: see
        `progress.py`)."""
        return {kind: self._progress.totals(q).rows for kind, q in self.queries.items()}

    def close(self) -> None:
        """Close the producers of the results topic (a later batch opens one again)."""
        for sink in self._sinks:
            sink.close()
        if not any(q.isActive for q in self.queries.values()):
            self._progress.close(self.queries.values())


def _input_queues(bootstrap: str, topics: Sequence[str], client: ClientOptions) -> int:
    with Admin(bootstrap, client_config=client.client_config()) as admin:
        return max(1, sum(admin.describe_topic(t).queues for t in topics))


@contextlib.contextmanager
def _shuffle_partitions(spark: SparkSession, partitions: int) -> Iterator[None]:
    """Spark's `spark.sql.shuffle.partitions` for the queries started inside. A streaming
    query keeps the value of its first run in its checkpoint for good, and the default
    (200) made analytics 2.5 times slower here than one per input queue (issue 21). Each
    query runs on a copy of the session's conf taken when it starts, so the caller's
    value is restored afterwards without touching the queries."""
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
    when missing; None: Parquet only), with sink ids ``<name>-<kind>-<token>`` (the token
    is made at the checkpoint's first run and kept in it: see `sink_ids`).

    `trigger="available_now"` processes what the topics hold now (micro-batches of at
    most `max_offsets_per_trigger` messages per query) and returns when every query is
    done; `"continuous"` returns the running queries. Run again with the same
    `checkpoint` to resume.

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
    token = sink_token(checkpoints)
    client = client or ClientOptions()
    partitions = _input_queues(bootstrap, topics, client)
    if results_topic is not None:
        _ensure_topic(bootstrap, results_topic, client)

    def source() -> DataFrame:
        return read_topics(
            spark,
            bootstrap=bootstrap,
            topics=topics,
            max_offsets_per_trigger=max_offsets_per_trigger,
            options=source_options,
            client=client,
        )

    from tidemq.spark.pipelines.progress import ProgressTotals  # noqa: PLC0415 - pyspark

    run = AnalyticsRun({}, [], ProgressTotals(spark))
    try:
        with _shuffle_partitions(spark, partitions):
            for kind in KINDS:
                sink = None
                if results_topic is not None and kind != "rejected":
                    sink = _TopicSink(
                        bootstrap,
                        results_topic,
                        sink_id(name, "analytics", token),
                        sink_id(name, kind, token),
                        kind,
                        client,
                    )
                    run._sinks.append(sink)
                writer = _writer(
                    source(), kind, config, root, sink, value_format=value_format
                ).queryName(f"tidemq-{name}-{kind}-{uuid.uuid4().hex[:6]}")
                writer = writer.option("checkpointLocation", str(checkpoints / kind))
                if trigger == "available_now":
                    # One query after the other: each starts a Python process for its
                    # source, and four starting at once on a small machine can miss
                    # Spark's connect-back timeout.
                    run.queries[kind] = query = writer.trigger(availableNow=True).start()
                    query.awaitTermination()
                else:
                    run.queries[kind] = query = writer.start()
                    _wait_started(query)
    except BaseException:
        run.stop()
        raise
    if trigger == "available_now":
        run.close()  # every query is done
    return run


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


def _writer(
    source: DataFrame,
    kind: Kind,
    config: AnalyticsConfig,
    root: Path,
    sink: _TopicSink | None,
    *,
    value_format: str = "json",
) -> DataStreamWriter:
    """The query of `kind` over `source`: its frame and where each micro-batch goes."""
    events, rejected = parsed_events(source, value_format)
    if kind == "rejected":
        handle: Callable[[DataFrame, int], None] = _reject_writer(root / "rejected")
        frame = rejected
    else:
        handle = _result_writer(root, kind, sink)
        frame = _aggregate(events, kind, config)
    return frame.writeStream.outputMode("append").foreachBatch(handle)


def _wait_started(query: StreamingQuery) -> None:
    """Wait (at most `START_WAIT_S`) until `query` has initialized its source, so that the
    next query's start does not compete with it (see `run_analytics`)."""
    deadline = time.monotonic() + START_WAIT_S
    while time.monotonic() < deadline and query.isActive:
        if query.status.get("message") != "Initializing sources":
            return
        time.sleep(0.1)


def _reject_writer(root: Path) -> Callable[[DataFrame, int], None]:
    def write(df: DataFrame, batch_id: int) -> None:
        write_table(_to_arrow(df), root)

    return write


def _result_writer(root: Path, kind: Kind, sink: _TopicSink | None) -> Callable[[Any, int], None]:
    def write(df: DataFrame, batch_id: int) -> None:
        table = _to_arrow(df)
        write_results(table, root, kind, batch_id)
        if sink is not None:
            sink.publish(table, batch_id)

    return write
