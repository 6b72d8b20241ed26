"""The Spark plan of the `analytics` pipeline: one streaming query whose micro-batch reads
the topics once and yields the rows of every output, tagged by kind.

Shape (ADR 16)::

    source -> parse (from_json, valid?) -> Exchange(hash of topic, queue, offset)
           -> CollectMetrics "tidemq-analytics-input"
           -> +- valid -> watermark -> tumbling windows  -+
              +- valid -> watermark -> sliding windows   -+-> union (kind, <kind> struct)
              +- valid -> watermark -> session windows   -+
              +- not valid ----------------------------- -+

Spark plans each branch from the source on its own, so without more the source would be
scanned once per branch (four reads, as with four queries). The exchange is what lets
Spark read it once: identical exchanges in one plan are computed once and reused
(`ReusedExchange`). They stay identical only if nothing is pushed below them, and Spark
pushes a branch's filter and its column pruning down through a repartition, which gave
two different exchanges (two reads: the valid and the rejected branches). The observed
metrics above the exchange stop both: Spark pushes no filter through `CollectMetrics`,
and it prunes no column that the metrics reference, and the input fingerprint
references them all. The progress's `numInputRows` counts the rows of each scan, so a
single scan shows as the batch's row count (four scans showed four times as many).

The three aggregations share one watermark: one event-time column, one delay, the same
rows in each branch, so each branch's `EventTimeWatermark` sees the same largest event
time and Spark's global watermark (the minimum of them) is each one's. Spark runs several
stateful operators in one query in append mode (since 3.4), each with its own state.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Final, Literal

from tidemq.spark.pipelines.events import BEHAVIORS

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame

__all__ = [
    "EVENT_SCHEMA",
    "INPUT_METRICS",
    "KINDS",
    "Kind",
    "aggregate",
    "analytics_frame",
    "parsed_events",
]

Kind = Literal["tumbling", "sliding", "session", "rejected"]
KINDS: Final[tuple[Kind, ...]] = ("tumbling", "sliding", "session", "rejected")
EVENT_SCHEMA: Final = "user_id BIGINT, item_id BIGINT, behavior STRING, ts BIGINT"
#: Name of the observed metrics of a micro-batch's input (in the query's progress).
INPUT_METRICS: Final = "tidemq-analytics-input"
_EVENT: Final = "_e"
_VALID: Final = "_valid"


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


def _with_event(raw: DataFrame, value_format: str) -> DataFrame:
    """The source's columns plus the parsed event (`_e`) and whether it is valid."""
    from pyspark.sql import functions as sf  # noqa: PLC0415 - pyspark on demand

    if value_format == "avro":
        fields = [sf.col("value")[f].alias(f) for f in ("user_id", "item_id", "behavior", "ts")]
        event = sf.when(sf.col("value").isNotNull(), sf.struct(*fields))
    else:
        event = sf.from_json(sf.col("value").cast("string"), EVENT_SCHEMA)
    with_e = raw.withColumn(_EVENT, event)
    return with_e.withColumn(_VALID, _valid(sf.col(_EVENT)))


def _split(with_e: DataFrame, raw_columns: list[str]) -> tuple[DataFrame, DataFrame]:
    from pyspark.sql import functions as sf  # noqa: PLC0415 - pyspark on demand

    valid = sf.col(_VALID)
    events = (
        with_e.where(valid)
        .select(f"{_EVENT}.*")
        .withColumn("event_time", sf.timestamp_millis(sf.col("ts")))
    )
    return events, with_e.where(~valid).select(*raw_columns)


def parsed_events(raw: DataFrame, value_format: str = "json") -> tuple[DataFrame, DataFrame]:
    """(events, rejected) of a source DataFrame: events have `user_id`, `item_id`,
    `behavior`, `ts` and `event_time` (timestamp); rejected rows keep the source columns.
    The rules are `events.parse_event`'s (a JSON object, integer ids and ts, a known
    behavior), as Spark's `from_json` applies them. With `value_format="avro"` the source
    decoded the values already (a struct column; a value that is not Avro of the subject
    fails the query in the source: the schema governs the stream), and only the rules on
    the fields apply."""
    return _split(_with_event(raw, value_format), raw.columns)


def aggregate(events: DataFrame, kind: Kind, watermark_s: int, **sizes_s: int) -> DataFrame:
    """The append-mode aggregation of `kind` over parsed events. `sizes_s`: `tumbling_s`,
    `sliding_s`, `slide_s`, `session_gap_s` (`AnalyticsConfig`'s fields)."""
    from pyspark.sql import functions as sf  # noqa: PLC0415 - pyspark on demand

    watermarked = events.withWatermark("event_time", f"{watermark_s} seconds")
    if kind == "session":
        behavior = sf.col("behavior")
        counts = [sf.sum((behavior == b).cast("long")).alias(b) for b in BEHAVIORS]
        gap = f"{sizes_s['session_gap_s']} seconds"
        return (
            watermarked.groupBy(sf.session_window("event_time", gap).alias("s"), "user_id")
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
        window = sf.window("event_time", f"{sizes_s['tumbling_s']} seconds")
    else:
        window = sf.window(
            "event_time", f"{sizes_s['sliding_s']} seconds", f"{sizes_s['slide_s']} seconds"
        )
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


def _read_once(with_e: DataFrame, partitions: int) -> DataFrame:
    """`with_e` behind one exchange that every branch shares (see the module docstring)."""
    from pyspark.sql import functions as sf  # noqa: PLC0415 - pyspark on demand

    # Hash of (topic, queue, offset): deterministic (a retried task gets the same rows,
    # which round-robin only gives with an extra sort) and even over any number of queues.
    shuffled = with_e.repartition(partitions, "topic", "partition", "offset")
    return shuffled.observe(
        INPUT_METRICS,
        sf.count(sf.lit(1)).alias("rows"),
        sf.count(sf.when(~sf.col(_VALID), 1)).alias("rejected"),
        # An order-free fingerprint of the batch's rows (a replay reads the same one; rows
        # differ by offset, so none cancel out). It references every column, the parsed
        # event too (only the valid branches use it), which is what keeps Spark from
        # pruning columns below the metrics differently in each branch; `count(struct(*))`
        # would not: Spark simplifies it to count(1). XOR: a sum overflows (an error in
        # ANSI mode).
        sf.bit_xor(sf.xxhash64(*with_e.columns)).alias("fingerprint"),
    )


def analytics_frame(
    raw: DataFrame,
    *,
    partitions: int,
    value_format: str,
    watermark_s: int,
    **sizes_s: int,
) -> DataFrame:
    """The rows of every output of a micro-batch: `kind` and one struct column per kind
    (the row of that kind; the other kinds' columns are null). `partitions`: of the
    exchange that shares the read (the pipeline's shuffle partitions)."""
    from pyspark.sql import functions as sf  # noqa: PLC0415 - pyspark on demand

    shared = _read_once(_with_event(raw, value_format), partitions)
    events, rejected = _split(shared, raw.columns)
    tagged = []
    for kind in KINDS:
        rows = rejected if kind == "rejected" else aggregate(events, kind, watermark_s, **sizes_s)
        tagged.append(rows.select(sf.lit(kind).alias("kind"), sf.struct(*rows.columns).alias(kind)))
    frame = tagged[0]
    for other in tagged[1:]:
        frame = frame.unionByName(other, allowMissingColumns=True)
    return frame
