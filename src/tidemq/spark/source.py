"""The PySpark data source `tidemq`: batch and streaming reads, batch writes, and the
exactly-once streaming writes of `sink`.

Thin: options are parsed by `tidemq.spark.options`, offsets and plans computed by
`offsets` and `planning` (pure Python), I/O done by `fetch` and `write`. What lives here
is the shape Spark's Python Data Source API wants (conventions §5):

* readers hold only their parsed options (picklable); clients and loops are created
  lazily per process (`_runtime`);
* `read()` yields `pyarrow.RecordBatch`es whose schema equals
  `to_arrow_schema(schema, timezone="UTC")`;
* stream offsets are `{"v": 1, "topics": {...}}` with sorted keys (`offsets.to_json`);
* the stream reader supports admission control (`latestOffset(start, limit)`,
  `getDefaultReadLimit`) and `Trigger.AvailableNow` (targets frozen in
  `prepareForTriggerAvailableNow`).

Read limits: pyspark's `ReadMinRows` carries no delay and its Python API has no
composite limit, and Spark hands the default limit back as it got it (or
`ReadAllAvailable` for `Trigger.Once`). So the default limit says which rule the options
set (`ReadMinRows` with `minOffsetsPerTrigger`, else `ReadMaxRows` with
`maxOffsetsPerTrigger`, else everything), and the reader completes it from its options
(the delay, and the maximum beside a minimum). Under `Trigger.AvailableNow` the minimum
is off: Spark ends such a query when `latestOffset` answers its start, so waiting would
leave the tail unread.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema, to_arrow_type
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    ReadMinRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from tidemq.core.clock import Clock, SystemClock
from tidemq.spark._runtime import runtime
from tidemq.spark.fetch import batch_ranges, initial_positions, read_range, stream_bounds
from tidemq.spark.offsets import Positions, from_json, next_offset, to_json
from tidemq.spark.options import (
    OptionError,
    ReadOptions,
    include_headers,
    parse_read_options,
    parse_write_options,
)
from tidemq.spark.planning import OffsetRange, plan_partitions, ranges_between
from tidemq.spark.trigger_limits import TriggerLimits
from tidemq.spark.value_format import ValueFormat, decode_values, resolve_value_format

__all__ = [
    "QueueRangePartition",
    "TidemqBatchReader",
    "TidemqBatchWriter",
    "TidemqCommitMessage",
    "TidemqDataSource",
    "TidemqStreamReader",
    "spark_schema",
]

_HEADER = StructType([StructField("key", StringType()), StructField("value", BinaryType())])


def spark_schema(with_headers: bool = False, value_type: StructType | None = None) -> StructType:
    """The source's columns: Kafka's, then tidemq's `tag` and `keys` (`value` a struct
    with `valueFormat=avro`)."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", value_type or BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if with_headers:
        fields.append(StructField("headers", ArrayType(_HEADER)))
    fields += [StructField("tag", StringType()), StructField("keys", ArrayType(StringType()))]
    return StructType(fields)


def _check_schema(
    schema: StructType | None, options: ReadOptions, value_format: ValueFormat | None
) -> None:
    expected = spark_schema(options.include_headers, _value_type(value_format))
    if schema is not None and schema != expected:
        raise OptionError(
            "the tidemq source has a fixed schema; do not pass .schema(...). Expected "
            f"{expected.simpleString()}, got {schema.simpleString()}"
        )


class QueueRangePartition(InputPartition):
    """One Spark task: offsets [start, end) of one queue."""

    def __init__(self, offset_range: OffsetRange) -> None:
        super().__init__(offset_range)
        self.range = offset_range

    def __repr__(self) -> str:
        r = self.range
        return f"QueueRangePartition({r.topic}/{r.queue} [{r.start}, {r.end}))"


def _read(
    options: ReadOptions, value_format: ValueFormat | None, partition: InputPartition
) -> Iterator[Any]:
    if not isinstance(partition, QueueRangePartition):
        return iter(())  # Spark's placeholder when there is nothing to read
    batches = read_range(options, partition.range)
    if value_format is None:
        return batches
    r = partition.range
    arrow_type = to_arrow_type(StructType.fromJson(value_format.spark_json()), timezone="UTC")
    return (decode_values(b, value_format, arrow_type, r.topic, r.queue) for b in batches)


def _value_type(value_format: ValueFormat | None) -> StructType | None:
    if value_format is None:
        return None
    return StructType.fromJson(value_format.spark_json())


def _value_format(options: Mapping[str, str]) -> ValueFormat | None:
    try:
        return resolve_value_format(options)
    except ValueError as exc:
        raise OptionError(str(exc)) from None


class TidemqBatchReader(DataSourceReader):
    def __init__(self, options: Mapping[str, str], schema: StructType) -> None:
        self._options = parse_read_options(options, streaming=False)
        self._value_format = _value_format(options)
        _check_schema(schema, self._options, self._value_format)

    def partitions(self) -> Sequence[InputPartition]:
        ranges = runtime().run(batch_ranges(self._options))
        planned = plan_partitions(ranges, self._options.min_partitions)
        return [QueueRangePartition(r) for r in planned]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self._options, self._value_format, partition)


class TidemqStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(
        self, options: Mapping[str, str], schema: StructType | None, clock: Clock | None = None
    ) -> None:
        """`schema` None: a reader whose rows are not the source's (the `archive`
        pipeline's). `clock`: the wall clock `maxTriggerDelay` is measured with (a test's
        fake)."""
        self._options = parse_read_options(options, streaming=True)
        self._value_format = _value_format(options)
        _check_schema(schema, self._options, self._value_format)
        # Driver-side state (the offset calls run in one long-lived process): the initial
        # offset, computed once (Spark asks twice), and the AvailableNow targets.
        self._initial: dict[str, Any] | None = None
        self._targets: Positions | None = None
        self._latest: Positions | None = None  # queue ends seen by the last latestOffset
        self._clock: Clock = SystemClock() if clock is None else clock
        # The delay of a start offset that records no plan time counts from here.
        self._started_ms = self._clock.now_ms()

    def initialOffset(self) -> dict[str, Any]:
        if self._initial is None:
            self._initial = to_json(runtime().run(initial_positions(self._options)))
        return self._initial

    def getDefaultReadLimit(self) -> ReadLimit:
        """Which rule the options set (the module's doc says why not all of it)."""
        if self._options.min_offsets_per_trigger is not None:
            return ReadMinRows(self._options.min_offsets_per_trigger)
        limit = self._options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def _limits(self, limit: ReadLimit) -> TriggerLimits:
        """The limits of one `latestOffset` call: Spark's `limit` completed from the
        options; no minimum under AvailableNow (the targets are set)."""
        configured = self._options.trigger_limits()
        if isinstance(limit, ReadMinRows):
            if self._targets is not None:
                return TriggerLimits(max_offsets=configured.max_offsets)
            return TriggerLimits(
                limit.min_rows, configured.max_offsets, configured.max_trigger_delay_ms
            )
        if isinstance(limit, ReadMaxRows):
            return TriggerLimits(max_offsets=limit.max_rows)
        return TriggerLimits()

    def prepareForTriggerAvailableNow(self) -> None:
        bounds = runtime().run(stream_bounds(self._options))
        self._targets = {tq: b.max_offset for tq, b in bounds.items()}

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        bounds = runtime().run(stream_bounds(self._options))
        self._latest = {tq: b.max_offset for tq, b in bounds.items()}
        return next_offset(
            start,
            bounds,
            limits=self._limits(limit),
            now_ms=self._clock.now_ms(),
            started_ms=self._started_ms,
            targets=self._targets,
            fail_on_data_loss=self._options.fail_on_data_loss,
        )

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The queues' ends as last seen (for the query's progress; no extra requests)."""
        return None if self._latest is None else to_json(self._latest)

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        ranges = ranges_between(from_json(start), from_json(end))
        planned = plan_partitions(ranges, self._options.min_partitions)
        return [QueueRangePartition(r) for r in planned]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self._options, self._value_format, partition)

    def commit(self, end: dict[str, Any]) -> None:
        """Nothing to do: the position lives in Spark's checkpoint, not in a group."""

    def stop(self) -> None:
        """Nothing to release: the process's client is shared (and Spark may not call
        this)."""


@dataclass
class TidemqCommitMessage(WriterCommitMessage):
    rows: int = 0
    batches: int = 0
    per_queue: dict[tuple[str, int], int] = field(default_factory=dict)


# `_writers`: the writers import the sink's and the client producer's modules where they
# are used, not with this module: a process that only plans or reads (the streaming
# source's planner is a new process per query) would import them for nothing (ADR 21).


class TidemqBatchWriter(DataSourceArrowWriter):
    """Non-transactional batch writes: rows grouped per (topic, queue) into end-to-end
    batches. A retried task sends its rows again (at least once)."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise OptionError(
                "tidemq topics are append-only: write with mode('append'), not overwrite"
            )
        from tidemq.spark.write import (  # noqa: PLC0415 - see `_writers`
            WRITE_COLUMNS,
            check_target_topic,
            with_value_format,
        )

        # Only the columns the sink uses (others are ignored, whatever their type).
        used = StructType([f for f in schema.fields if f.name in WRITE_COLUMNS])
        types = {f.name: f.type for f in to_arrow_schema(used, timezone="UTC")}
        self._options = with_value_format(parse_write_options(options), options, types)
        if self._options.topic is None and "topic" not in schema.names:
            raise OptionError(
                "no topic to write to: set the option 'topic' or give the DataFrame a 'topic' "
                "column"
            )
        check_target_topic(self._options)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        context = TaskContext.get()
        counter = context.partitionId() if context is not None else 0
        from tidemq.spark.write import write_batches  # noqa: PLC0415 - see `_writers`

        result = write_batches(self._options, iterator, counter=counter)
        return TidemqCommitMessage(result.rows, result.batches, result.per_queue)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing to publish: every row was acknowledged by its broker in `write`."""

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        """Nothing can be undone: rows acknowledged before the failure stay in tidemq."""


class TidemqDataSource(DataSource):
    """`spark.read.format("tidemq")`, `spark.readStream.format("tidemq")`,
    `df.write.format("tidemq")`; options in `tidemq.spark.options`."""

    @classmethod
    def name(cls) -> str:
        return "tidemq"

    def schema(self) -> StructType:
        return spark_schema(include_headers(self.options), _value_type(_value_format(self.options)))

    def reader(self, schema: StructType) -> DataSourceReader:
        return TidemqBatchReader(self.options, schema)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return TidemqStreamReader(self.options, schema)

    def writer(self, schema: StructType, overwrite: bool) -> TidemqBatchWriter:
        return TidemqBatchWriter(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        # The exactly-once sink (tidemq.spark.sink); tidemq has no at-least-once
        # streaming writer on purpose.
        from tidemq.spark.sink import exactly_once_stream_writer  # noqa: PLC0415

        return exactly_once_stream_writer(self.options, schema, overwrite=overwrite)
