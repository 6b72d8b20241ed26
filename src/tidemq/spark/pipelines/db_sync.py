"""The `db-sync` pipeline: change events (`changes.py`) -> a sharded database, idempotent.

The events are keyed by `order_id`, so each order's events sit in one queue in the order
they happened. The pipeline reads the topics as a stream (the `tidemq` source, from the
earliest offsets) and, per micro-batch, sends each (topic, queue) to one Spark task, sorted
by offset; the task applies the events to the shard databases of their rows
(`row[shard_column] % shards`; by default the seller, while the source is sharded by
buyer). Targets are SQLAlchemy URLs, one per shard, from a template such as
`sqlite:////data/shard_{shard}.db` (`{shard}` is replaced by 0..shards-1; a template
without it is refused when shards > 1).

Tables in every shard, created when missing (fixed column types, from
`changes.TABLES`: integers as BIGINT, texts as VARCHAR(MAX_TEXT_CHARS)):

* `orders` (primary key `order_id`) and `order_items` (primary key `order_id`,
  `line_no`), with the events' columns;
* `tidemq_applied(topic VARCHAR(127), queue INTEGER, next_offset BIGINT NOT NULL,
  PRIMARY KEY (topic, queue))`: the first offset of each source queue this shard has not
  considered yet. Every event of the queue below it is applied to this shard if it
  belongs there, and skipped here if it belongs to another shard.

Why a replay changes nothing: a task applies its events to each shard in ONE database
transaction that also reads and advances that shard's `next_offset` of each (topic,
queue) in the task. It applies only the events at or after the stored `next_offset`, in
offset order (insert and update write the row, delete removes it if present; within one
transaction only the last event of a row decides, so that is what is written), and sets
`next_offset` to the task's last offset + 1. The rows and the position commit together or
not at all, so when the same events come again (a retried task, a micro-batch Spark
replays after a crash, a brand-new checkpoint reading everything from offset 0) they are
below `next_offset` and skipped. Each shard is its own transaction: a crash between two
shards' commits leaves one shard ahead, and the replay completes the other.

A value that is not a valid event, or an event the database refuses, fails the query
with an `ApplyError` naming the topic, queue and offset and the reason; nothing is
skipped. So does a gap: a batch starting after a shard's `next_offset` (the offsets in
between were never applied there, e.g. removed by retention before they were read).
"""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import sqlalchemy as sa
from sqlalchemy.engine import Connection, Engine

from tidemq.core.limits import MAX_TOPIC_NAME_BYTES
from tidemq.spark.pipelines.changes import (
    DEFAULT_SHARD_COLUMN,
    MAX_SHARDS,
    MAX_TEXT_CHARS,
    TABLES,
    ChangeEvent,
    Scalar,
    check_shard_column,
    parse_change,
    shard_of,
)
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

    from tidemq.spark.options import ClientOptions

__all__ = [
    "APPLIED",
    "METADATA",
    "SHARD_PLACEHOLDER",
    "ApplyError",
    "ApplyResult",
    "Located",
    "SourceRecord",
    "TargetError",
    "apply_records",
    "close_engines",
    "describe_target",
    "net_changes",
    "prepare_targets",
    "run_db_sync",
    "shard_urls",
]

SHARD_PLACEHOLDER: Final = "{shard}"
#: How long a SQLite writer waits for another one's transaction (tasks of one micro-batch
#: share shards) before failing with "database is locked".
SQLITE_BUSY_TIMEOUT_S: Final = 60.0


METADATA: Final = sa.MetaData()


def _column(name: str, kind: type, *, key: bool) -> sa.Column[Any]:
    sql_type: sa.types.TypeEngine[Any] = (
        sa.BigInteger() if kind is int else sa.String(MAX_TEXT_CHARS)
    )
    # autoincrement=False: keys come from the events (PostgreSQL would add a sequence).
    return sa.Column(name, sql_type, primary_key=key, autoincrement=False, nullable=False)


TARGET_TABLES: Final = {
    spec.name: sa.Table(
        spec.name,
        METADATA,
        *(_column(c, kind, key=c in spec.pk) for c, kind in spec.columns.items()),
    )
    for spec in TABLES.values()
}
APPLIED: Final = sa.Table(
    "tidemq_applied",
    METADATA,
    sa.Column("topic", sa.String(MAX_TOPIC_NAME_BYTES), primary_key=True),
    sa.Column("queue", sa.Integer(), primary_key=True, autoincrement=False),
    sa.Column("next_offset", sa.BigInteger(), nullable=False),
)


class ApplyError(RuntimeError):
    """An event that cannot be applied, or a shard that cannot take a batch."""


class TargetError(RuntimeError):
    """A shard database that cannot be reached or set up."""


@dataclass(frozen=True, slots=True)
class SourceRecord:
    """A message as the source gives it (`partition` is the queue)."""

    topic: str
    queue: int
    offset: int
    value: bytes | None


@dataclass(frozen=True, slots=True)
class Located:
    """A parsed event and where it was read."""

    topic: str
    queue: int
    offset: int
    event: ChangeEvent

    def where(self) -> str:
        return f"topic {self.topic!r} queue {self.queue} offset {self.offset}"


@dataclass(slots=True)
class ApplyResult:
    """What `apply_records` did: events written to a shard, events skipped because that
    shard had them already (a replay)."""

    applied: int = 0
    skipped: int = 0


# ------------------------------------------------------------------ targets


def shard_urls(target: str, shards: int) -> list[str]:
    """The database URL of each shard: `target` with `{shard}` replaced by its number."""
    if not 1 <= shards <= MAX_SHARDS:
        raise ValueError(f"shards must be 1..{MAX_SHARDS}, got {shards}")
    if shards > 1 and SHARD_PLACEHOLDER not in target:
        raise ValueError(
            f"the target {describe_target(target)} has no {SHARD_PLACEHOLDER} placeholder, "
            f"so its {shards} shards would be one database"
        )
    urls = [target.replace(SHARD_PLACEHOLDER, str(s)) for s in range(shards)]
    for url in urls:
        try:
            sa.engine.make_url(url)
        except sa.exc.ArgumentError as exc:
            raise ValueError(f"bad target URL {describe_target(target)}: {exc}") from None
    return urls


def describe_target(target: str) -> str:
    """The target for messages: without its password."""
    try:
        shown = sa.engine.make_url(target).render_as_string(hide_password=True)
    except sa.exc.ArgumentError:
        return "(unparsable URL)"
    return shown.replace("%7Bshard%7D", SHARD_PLACEHOLDER)


def _sqlite_immediate(engine: Engine) -> None:
    """SQLite: take the write lock when a transaction begins. Its default (deferred) takes
    it at the first write, and a reader that then wants to write while another connection
    writes fails at once with "database is locked" instead of waiting."""

    @sa.event.listens_for(engine, "connect")
    def _connect(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.isolation_level = None  # the driver's own BEGIN off: ours below

    @sa.event.listens_for(engine, "begin")
    def _begin(conn: Connection) -> None:
        conn.exec_driver_sql("BEGIN IMMEDIATE")


_engines: dict[tuple[int, str], Engine] = {}
_engines_lock = threading.Lock()


def _engine(url: str) -> Engine:
    """This process's engine for `url`, with the tables created (once per process).
    Created on first use and keyed by pid: Spark ships the apply step to its Python workers
    pickled, and pools and sockets cannot travel (nor survive the daemon's fork)."""
    key = (os.getpid(), url)
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            parsed = sa.engine.make_url(url)
            if parsed.get_backend_name() == "sqlite":
                if parsed.database and parsed.database != ":memory:":
                    Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
                engine = sa.create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_S})
                _sqlite_immediate(engine)
            else:
                engine = sa.create_engine(url, pool_pre_ping=True)
            METADATA.create_all(engine)
            _engines[key] = engine
        return engine


def close_engines() -> None:
    """Close this process's engines (their pooled connections); later calls make new ones."""
    with _engines_lock:
        for key in [k for k in _engines if k[0] == os.getpid()]:
            _engines.pop(key).dispose()


def prepare_targets(target: str, shards: int) -> list[str]:
    """Check `target`, create the tables in every shard (on the driver, before any task
    does), and return the shard URLs. Raises ValueError for a bad template, TargetError for
    a database that cannot be reached or set up."""
    urls = shard_urls(target, shards)
    for shard, url in enumerate(urls):
        try:
            _engine(url)
        except sa.exc.SQLAlchemyError as exc:
            raise TargetError(f"shard {shard} ({describe_target(url)}): {exc}") from None
    return urls


# ------------------------------------------------------------------ applying


def net_changes(changes: Iterable[Located]) -> dict[tuple[str, tuple[Scalar, ...]], Located]:
    """The last change of each row (table, primary key), applying `changes` in order: what
    one transaction must write for the same result as applying them one by one."""
    out: dict[tuple[str, tuple[Scalar, ...]], Located] = {}
    for change in changes:
        key = (change.event.table, change.event.pk_values)
        out.pop(key, None)  # re-inserted: the dict stays in order of last change
        out[key] = change
    return out


def _ranges(records: Sequence[SourceRecord]) -> dict[tuple[str, int], tuple[int, int]]:
    """(topic, queue) -> (first, last) offset; each queue's offsets must increase."""
    ranges: dict[tuple[str, int], tuple[int, int]] = {}
    for r in records:
        tq = (r.topic, r.queue)
        seen = ranges.get(tq)
        if seen is not None and r.offset <= seen[1]:
            raise ValueError(
                f"records of topic {r.topic!r} queue {r.queue} are out of offset order: "
                f"{r.offset} after {seen[1]}"
            )
        ranges[tq] = (r.offset if seen is None else seen[0], r.offset)
    return ranges


def _parse(records: Iterable[SourceRecord], shards: int, shard_column: str) -> list[list[Located]]:
    """The records' events, per target shard, in the records' order."""
    out: list[list[Located]] = [[] for _ in range(shards)]
    for r in records:
        try:
            event = parse_change(r.value)
            shard = shard_of(event.row, shards, shard_column)
        except ValueError as exc:
            raise ApplyError(
                f"topic {r.topic!r} queue {r.queue} offset {r.offset}: not a change event "
                f"db-sync can apply: {exc}"
            ) from None
        out[shard].append(Located(r.topic, r.queue, r.offset, event))
    return out


def _write(conn: Connection, change: Located, shard: int) -> None:
    event = change.event
    table = TARGET_TABLES[event.table]
    match = sa.and_(*(table.c[c] == v for c, v in event.pk.items()))
    try:
        # Delete, then insert the new image: an upsert that works on every database.
        conn.execute(table.delete().where(match))
        if event.op != "delete":
            conn.execute(table.insert().values(**event.row))
    except sa.exc.SQLAlchemyError as exc:
        raise ApplyError(
            f"{change.where()}: the {event.op} of {event.table} {event.pk} failed on "
            f"shard {shard}: {exc}"
        ) from exc


def _apply_shard(
    conn: Connection,
    shard: int,
    changes: Sequence[Located],
    ranges: Mapping[tuple[str, int], tuple[int, int]],
) -> ApplyResult:
    """One shard's part of a task, inside the caller's transaction."""
    mine = sa.or_(*(sa.and_(APPLIED.c.topic == t, APPLIED.c.queue == q) for t, q in ranges))
    rows = conn.execute(
        sa.select(APPLIED.c.topic, APPLIED.c.queue, APPLIED.c.next_offset)
        .where(mine)
        .with_for_update()  # PostgreSQL & co.: a concurrent attempt of this task waits
    )
    stored: dict[tuple[str, int], int] = {(t, q): n for t, q, n in rows}
    for (topic, queue), (first, _) in sorted(ranges.items()):
        at = stored.get((topic, queue))
        if at is not None and first > at:
            raise ApplyError(
                f"topic {topic!r} queue {queue}: shard {shard} has applied up to offset "
                f"{at}, but this batch starts at {first}: offsets {at}..{first - 1} were "
                "never applied (removed by retention before they were read?)"
            )
    todo = [c for c in changes if c.offset >= stored.get((c.topic, c.queue), 0)]
    for change in net_changes(todo).values():
        _write(conn, change, shard)
    for (topic, queue), (_, last) in sorted(ranges.items()):
        at = stored.get((topic, queue))
        if at is None:
            conn.execute(APPLIED.insert().values(topic=topic, queue=queue, next_offset=last + 1))
        elif last + 1 > at:
            conn.execute(
                APPLIED.update()
                .where(APPLIED.c.topic == topic, APPLIED.c.queue == queue)
                .values(next_offset=last + 1)
            )
    return ApplyResult(applied=len(todo), skipped=len(changes) - len(todo))


def apply_records(
    records: Sequence[SourceRecord],
    *,
    target: str,
    shards: int,
    shard_column: str = DEFAULT_SHARD_COLUMN,
) -> ApplyResult:
    """Apply one task's records (each queue's in offset order) to the shards of `target`:
    per shard, one transaction that skips what the shard has applied already, writes the
    rest and advances the shard's `next_offset` of every (topic, queue) in `records`.
    Every record is parsed before any database is touched. Works without Spark."""
    if not records:
        return ApplyResult()
    check_shard_column(shard_column)
    urls = shard_urls(target, shards)
    ranges = _ranges(records)
    per_shard = _parse(records, shards, shard_column)
    result = ApplyResult()
    for shard, url in enumerate(urls):
        try:
            with _engine(url).begin() as conn:
                done = _apply_shard(conn, shard, per_shard[shard], ranges)
        except sa.exc.SQLAlchemyError as exc:
            spans = ", ".join(f"{t}/{q} {a}..{b}" for (t, q), (a, b) in sorted(ranges.items()))
            raise ApplyError(f"shard {shard} failed to apply offsets {spans}: {exc}") from exc
        result.applied += done.applied
        result.skipped += done.skipped
    return result


# ------------------------------------------------------------------ Spark


@dataclass(frozen=True, slots=True)
class _ApplyPartition:
    """The `foreachPartition` function: pickled to the executors with plain settings."""

    target: str
    shards: int
    shard_column: str

    def __call__(self, rows: Iterable[Any]) -> None:
        records = [
            SourceRecord(
                r["topic"],
                r["partition"],
                r["offset"],
                None if r["value"] is None else bytes(r["value"]),
            )
            for r in rows
        ]
        apply_records(
            records, target=self.target, shards=self.shards, shard_column=self.shard_column
        )


def run_db_sync(
    spark: SparkSession,
    *,
    bootstrap: str,
    topics: Sequence[str],
    target: str,
    shards: int,
    checkpoint: str | Path,
    trigger: Trigger = "available_now",
    max_offsets_per_trigger: int | None = DEFAULT_MAX_OFFSETS_PER_TRIGGER,
    shard_column: str = DEFAULT_SHARD_COLUMN,
    client: ClientOptions | None = None,
) -> StreamingQuery:
    """Replay the change events of `topics` into the `shards` databases of `target` (see
    the module docstring), with Spark's checkpoint in `checkpoint`.

    `trigger="available_now"` applies what the topics hold now (in micro-batches of at most
    `max_offsets_per_trigger` messages) and returns the finished query (a failure raises
    `StreamingQueryException`); `"continuous"` returns the running query (stop it with
    `query.stop()`). The tables are created in every shard before the query starts."""
    if not topics:
        raise ValueError("give at least one topic")
    check_trigger(trigger)
    check_shard_column(shard_column)
    prepare_targets(target, shards)
    stream = read_topics(
        spark,
        bootstrap=bootstrap,
        topics=topics,
        max_offsets_per_trigger=max_offsets_per_trigger,
        include_headers=False,
        # One partition per queue range: a queue's events in one task, in order.
        options={"minPartitions": "1"},
        client=client,
    )
    apply_partition = _ApplyPartition(target, shards, shard_column)

    def sync_batch(df: DataFrame, batch_id: int) -> None:
        # Each (topic, queue) in one task, its events in offset order: the source reads
        # each queue's range of the batch as one partition (minPartitions=1 above; the
        # default would cut a range far above the others), so the tasks are the queues.
        # A repartition by hash put 8 queues into 6 tasks, two of them empty (issue 21).
        (
            df.select("topic", "partition", "offset", "value")
            .sortWithinPartitions("topic", "partition", "offset")
            .foreachPartition(apply_partition)
        )

    writer = (
        stream.writeStream.queryName(f"tidemq-db-sync-{uuid.uuid4().hex[:8]}")
        .foreachBatch(sync_batch)
        .option("checkpointLocation", str(checkpoint))
    )
    return start(writer, trigger)
