"""The exactly-once streaming sink: `df.writeStream.format("tidemq").option("sinkId", ...)`.

tidemq offers no non-transactional streaming writer on purpose: a micro-batch replayed
after a failure would be written twice. This one is built on transactions:

* The writer is built on the driver when the query starts: a ``topic`` option naming a
  topic that does not exist fails the query then, before anything is written, unless
  ``createTopic=true`` (`tidemq.spark.write.check_target_topic`).
* ``sinkId`` (required) names the sink: its marker, the last batch id it published, is
  stored by the brokers atomically with the commit that publishes the batch. The
  transaction group is ``spark-sink-<sinkId>``.
* `write()` (executors) sends the task's rows inside a transaction, grouped per (topic,
  queue) exactly as batch writes are (`tidemq.spark.write.group_rows`), and returns a
  `SinkCommitMessage` holding the transaction refs, the batch id and the row count. It
  never commits; a task that fails rolls back what it began (best effort) and re-raises.
* `commit(messages, batchId)` (driver): if the marker is already >= batchId, the batch
  was published before (Spark replays the last batch after a driver crash between the
  sink's commit and its own commit log): the new transactions are rolled back. Otherwise
  every transaction of the batch is committed with `commit_many` (one unit per broker),
  with the marker (sinkId, batchId) on the first broker. An empty batch commits the marker
  alone.
* `abort(messages, batchId)` (driver, after a failed task or a failed commit) rolls the
  batch's transactions back, unless the marker shows the batch published.

Transactions that nobody ends (a task attempt whose process died, a result Spark
discarded) stay invisible and are rolled back by their broker after its check-backs (no
checker answers for the group).

The decisions (`plan_commit`, `plan_abort`) and the driver's steps (`publish`, `discard`)
are pure Python over a `TxnClient`, so that they are tested without Spark.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import logging
import os
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, Protocol

from pyspark import TaskContext
from pyspark.sql.datasource import DataSourceStreamArrowWriter, WriterCommitMessage
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from tidemq.client.transaction import AsyncTransaction, AsyncTransactionProducer, TxnRef
from tidemq.core.errors import TidemqError, TopicNotFound, TransactionStateError
from tidemq.spark._runtime import runtime
from tidemq.spark.options import ClientOptions, OptionError, WriteOptions, parse_write_options
from tidemq.spark.sink_owner import check_owner
from tidemq.spark.value_encode import encode_value_column
from tidemq.spark.write import (
    WRITE_COLUMNS,
    Routes,
    SendGroup,
    check_target_topic,
    group_rows,
    routes_for_batch,
    with_value_format,
)

__all__ = [
    "SINK_ID_PATTERN",
    "SinkCommitMessage",
    "SinkOptions",
    "TidemqStreamWriter",
    "TxnClient",
    "discard",
    "exactly_once_stream_writer",
    "parse_sink_options",
    "plan_abort",
    "plan_commit",
    "publish",
    "sink_refs",
]

log = logging.getLogger(__name__)

#: What a sinkId may hold: it names a transaction group (``spark-sink-<sinkId>``) and the
#: marker, and appears in logs.
SINK_ID_PATTERN: Final = r"^[A-Za-z0-9_.-]{1,200}$"
_SINK_ID: Final = re.compile(SINK_ID_PATTERN)
#: The sink's options beyond the writer's. Spark passes the query's `checkpointLocation`
#: on with the sink's options.
SINK_OPTIONS: Final = (
    "sinkId",
    "checkpointLocation",
    "maxBatchesPerTransaction",
    "testing.failAfterRows",
    "testing.failOnceFile",
)
#: Batches (sends) a task puts in one transaction before it begins another (the broker
#: refuses more than broker.max_batches_per_transaction, 10,000 by default, in one; a
#: task over it used to fail again on every replay). The driver commits all of a batch's
#: transactions per broker as one unit, so the split is invisible to readers.
DEFAULT_BATCHES_PER_TRANSACTION: Final = 1000
#: Attempts of the driver's commit (it is idempotent: a retry of a committed transaction
#: returns the same receipts), with this pause between them.
COMMIT_ATTEMPTS: Final = 3
COMMIT_RETRY_PAUSE_S: Final = 1.0
#: How long a failed task waits for its best-effort rollback.
_ROLLBACK_TIMEOUT_S: Final = 30.0


@dataclass(frozen=True, slots=True)
class SinkOptions:
    write: WriteOptions
    sink_id: str
    #: Tests only (``testing.failAfterRows`` with ``testing.failOnceFile``): a task raises
    #: once it has sent at least this many rows, if the file does not exist yet (it creates
    #: it first, so the failure happens once across processes and runs).
    fail_after_rows: int | None = None
    fail_once_file: str | None = None
    #: The query's checkpointLocation (Spark passes it on): where the sink id's owner is
    #: recorded (`sink_owner.py`).
    checkpoint: str | None = None
    #: `maxBatchesPerTransaction`: sends per transaction of a task, at most.
    batches_per_transaction: int = DEFAULT_BATCHES_PER_TRANSACTION

    @property
    def group(self) -> str:
        return f"spark-sink-{self.sink_id}"


def parse_sink_options(options: Mapping[str, str]) -> SinkOptions:
    """The streaming sink's options: the batch writer's (`bootstrap`, `topic`) plus the
    required `sinkId`."""
    write = parse_write_options(options, also=SINK_OPTIONS, what="the tidemq streaming sink")
    opts = {str(k).lower(): str(v) for k, v in options.items() if v is not None}
    sink_id = opts.get("sinkid")
    if sink_id is None or not sink_id.strip():
        raise OptionError(
            "option 'sinkId' is required for streaming writes to tidemq (the exactly-once "
            "sink): a name for this sink, unique per query and kept across its restarts (it "
            "identifies the batches already published)"
        )
    sink_id = sink_id.strip()
    if not _SINK_ID.match(sink_id):
        raise OptionError(
            "option 'sinkId' must be 1-200 characters among letters, digits, '_', '.', '-'; "
            f"got {sink_id!r}"
        )
    fail_text = opts.get("testing.failafterrows")
    fail_after: int | None = None
    if fail_text is not None:
        try:
            fail_after = int(fail_text)
        except ValueError:
            raise OptionError(
                f"option 'testing.failAfterRows' must be an integer, got {fail_text!r}"
            ) from None
        if "testing.failoncefile" not in opts:
            raise OptionError("option 'testing.failAfterRows' needs 'testing.failOnceFile'")
    per_txn_text = opts.get("maxbatchespertransaction", str(DEFAULT_BATCHES_PER_TRANSACTION))
    try:
        per_txn = int(per_txn_text)
    except ValueError:
        per_txn = 0
    if per_txn < 1:
        raise OptionError(
            f"option 'maxBatchesPerTransaction' must be a positive integer, got {per_txn_text!r}"
        )
    return SinkOptions(
        write,
        sink_id,
        fail_after,
        opts.get("testing.failoncefile"),
        opts.get("checkpointlocation"),
        per_txn,
    )


@dataclass
class SinkCommitMessage(WriterCommitMessage):
    """What a task hands to the driver: its open transactions (picklable refs)."""

    refs: list[TxnRef] = field(default_factory=list)
    batch_id: int = -1
    rows: int = 0
    partition: int = 0


# ------------------------------------------------------------------ driver decisions


def sink_refs(messages: Iterable[WriterCommitMessage | None]) -> list[TxnRef]:
    """Every transaction ref of a batch's messages (None for failed tasks is skipped)."""
    refs: list[TxnRef] = []
    for m in messages:
        if isinstance(m, SinkCommitMessage):
            refs.extend((str(a), str(t)) for a, t in m.refs)
    return sorted(set(refs))


def plan_commit(marker: int, batch_id: int) -> Literal["commit", "skip"]:
    """At the driver's commit: "skip" when the marker shows the batch published already
    (a replay: its new transactions are to be rolled back), else "commit"."""
    return "skip" if marker >= batch_id else "commit"


def plan_abort(marker: int, batch_id: int) -> Literal["rollback", "keep"]:
    """At abort: "keep" when the marker shows the batch published (abort after a commit
    that succeeded on the broker but raised here must not undo it), else "rollback"."""
    return "keep" if marker >= batch_id else "rollback"


class TxnClient(Protocol):
    """What the driver needs of a transaction producer (blocking calls)."""

    def sink_marker(self, sink_id: str) -> int: ...

    def commit_many(self, refs: Sequence[TxnRef], *, sink_id: str, batch_id: int) -> object: ...

    def rollback_many(self, refs: Sequence[TxnRef]) -> None: ...


def publish(
    client: TxnClient,
    sink_id: str,
    messages: Sequence[WriterCommitMessage | None],
    batch_id: int,
    *,
    attempts: int = COMMIT_ATTEMPTS,
    pause_s: float = COMMIT_RETRY_PAUSE_S,
) -> Literal["committed", "skipped"]:
    """The driver's commit of batch `batch_id`."""
    refs = sink_refs(messages)
    for m in messages:
        if isinstance(m, SinkCommitMessage) and m.batch_id not in (-1, batch_id):
            raise TidemqError(
                f"sink {sink_id!r}: a task of batch {m.batch_id} reported to batch {batch_id}"
            )
    marker = client.sink_marker(sink_id)
    if plan_commit(marker, batch_id) == "skip":
        log.info(
            "sink %r: batch %d was published already (marker %d): rolling back its replay "
            "(%d transactions)",
            sink_id,
            batch_id,
            marker,
            len(refs),
        )
        _rollback_quietly(client, refs, sink_id, batch_id)
        return "skipped"
    for attempt in range(1, attempts + 1):
        try:
            client.commit_many(refs, sink_id=sink_id, batch_id=batch_id)
            return "committed"
        except TransactionStateError:
            raise  # a transaction was rolled back: the batch cannot be published
        except TidemqError as exc:
            if attempt == attempts:
                raise
            log.warning("sink %r: commit of batch %d failed (%s); retrying", sink_id, batch_id, exc)
            time.sleep(pause_s)
    raise AssertionError("unreachable")  # pragma: no cover


def discard(
    client: TxnClient,
    sink_id: str,
    messages: Sequence[WriterCommitMessage | None],
    batch_id: int,
) -> Literal["rolled back", "kept", "nothing"]:
    """The driver's abort of batch `batch_id`."""
    refs = sink_refs(messages)
    if not refs:
        return "nothing"
    marker = client.sink_marker(sink_id)
    if plan_abort(marker, batch_id) == "keep":
        log.info(
            "sink %r: abort of batch %d after its marker was committed (%d): nothing undone",
            sink_id,
            batch_id,
            marker,
        )
        return "kept"
    _rollback_quietly(client, refs, sink_id, batch_id)
    return "rolled back"


def _rollback_quietly(client: TxnClient, refs: Sequence[TxnRef], sink_id: str, bid: int) -> None:
    if not refs:
        return
    try:
        client.rollback_many(refs)
    except TidemqError as exc:
        # Left open, they stay invisible; their brokers roll them back after the checks.
        log.warning("sink %r: rolling back batch %d failed: %s", sink_id, bid, exc)


# ------------------------------------------------------------------ transaction clients


_producers_lock = threading.Lock()
_producers: dict[tuple[int, str, str, ClientOptions], AsyncTransactionProducer] = {}


async def _new_producer(
    bootstrap: str, group: str, client: ClientOptions
) -> AsyncTransactionProducer:
    return AsyncTransactionProducer(bootstrap, group, client_config=client.client_config())


def _producer(bootstrap: str, group: str, client: ClientOptions) -> AsyncTransactionProducer:
    """This process's transaction producer for (bootstrap, group, connection options), on
    its runtime's loop."""
    rt = runtime()
    key = (os.getpid(), bootstrap, group, client)
    with _producers_lock:
        producer = _producers.get(key)
        if producer is None:
            producer = _producers[key] = rt.run(_new_producer(bootstrap, group, client))
        return producer


class _BlockingClient:
    """`TxnClient` over the process's async transaction producer."""

    def __init__(self, bootstrap: str, group: str, client: ClientOptions) -> None:
        self._producer = _producer(bootstrap, group, client)

    def sink_marker(self, sink_id: str) -> int:
        return runtime().run(self._producer.sink_marker(sink_id))

    def commit_many(self, refs: Sequence[TxnRef], *, sink_id: str, batch_id: int) -> object:
        return runtime().run(self._producer.commit_many(refs, sink_id=sink_id, batch_id=batch_id))

    def rollback_many(self, refs: Sequence[TxnRef]) -> None:
        runtime().run(self._producer.rollback_many(refs))


# ------------------------------------------------------------------ executors


async def _send_groups(tx: AsyncTransaction, groups: Sequence[SendGroup]) -> int:
    """Send `groups` in `tx`: one chain per (topic, queue), in order within it, the chains
    concurrently. Returns the rows sent."""
    chains: dict[tuple[str, int], list[SendGroup]] = {}
    for g in groups:
        chains.setdefault((g.topic, g.queue), []).append(g)

    async def chain(gs: list[SendGroup]) -> int:
        sent = 0
        for g in gs:
            receipts = await tx.send_batch(
                g.topic, g.values, keys=g.keys, tags=g.tags, headers=g.headers, queue=g.queue
            )
            sent += len(receipts)
        return sent

    return sum(await asyncio.gather(*(chain(gs) for gs in chains.values())))


def _maybe_fail(options: SinkOptions, rows: int) -> None:
    if options.fail_after_rows is None or rows < options.fail_after_rows:
        return
    assert options.fail_once_file is not None
    path = Path(options.fail_once_file)
    try:
        with path.open("x"):
            pass
    except FileExistsError:
        return
    raise RuntimeError(f"injected sink failure after {rows} rows (testing.failAfterRows)")


def write_transaction(
    options: SinkOptions, batches: Iterable[Any], *, counter: int = 0
) -> tuple[list[TxnRef], int]:
    """Send every row of `batches` inside transactions left open (a new one every
    `batches_per_transaction` sends); returns their refs and the rows sent. On error,
    rolls back what was begun (best effort) and re-raises."""
    rt = runtime()
    producer = _producer(options.write.bootstrap, options.group, options.write.client)
    tx = rt.run(producer.begin())
    earlier: list[TxnRef] = []  # refs of the task's transactions before `tx`
    in_tx = 0
    rows = 0
    pending: concurrent.futures.Future[int] | None = None
    try:
        routes: Routes = rt.run(producer.cluster.refresh_routes())
        fmt = options.write.value_format
        for raw in batches:
            batch = raw if fmt is None else encode_value_column(raw, fmt)
            try:
                groups = group_rows(
                    batch, topic=options.write.topic, routes=routes, counter=counter
                )
            except TopicNotFound:
                routes, groups = routes_for_batch(
                    producer.cluster, options.write, batch, counter=counter
                )
            counter += 1
            while groups:
                if pending is not None:  # one send in flight: order within queues holds
                    rows += pending.result()
                    pending = None
                    _maybe_fail(options, rows)
                if in_tx >= options.batches_per_transaction:
                    earlier.extend(tx.refs)
                    tx, in_tx = rt.run(producer.begin()), 0
                part = groups[: options.batches_per_transaction - in_tx]
                groups = groups[len(part) :]
                pending = rt.submit(_send_groups(tx, part))
                in_tx += len(part)
        if pending is not None:
            rows += pending.result()
            pending = None
            _maybe_fail(options, rows)
    except BaseException:
        if pending is not None:
            concurrent.futures.wait([pending])
        _roll_back(producer, tx, earlier)
        raise
    return [*earlier, *tx.refs], rows


def _roll_back(
    producer: AsyncTransactionProducer, tx: AsyncTransaction, earlier: list[TxnRef]
) -> None:
    """Best effort: a failed task's transactions (the brokers roll back the rest later)."""
    rt = runtime()
    try:
        rt.run(tx.rollback(), _ROLLBACK_TIMEOUT_S)
        if earlier:
            rt.run(producer.rollback_many(earlier), _ROLLBACK_TIMEOUT_S)
    except Exception as exc:  # best effort: the broker rolls it back later
        log.warning("rolling back a failed sink task's transactions failed: %s", exc)


# ------------------------------------------------------------------ the Spark writer


class TidemqStreamWriter(DataSourceStreamArrowWriter):
    """Exactly-once streaming writes (see the module's docstring)."""

    def __init__(self, options: Mapping[str, str], schema: StructType, overwrite: bool) -> None:
        if overwrite:
            raise OptionError(
                "tidemq topics are append-only: write streams with outputMode('append')"
            )
        self._options = parse_sink_options(options)
        self._owner_checked = False
        used = StructType([f for f in schema.fields if f.name in WRITE_COLUMNS])
        types = {f.name: f.type for f in to_arrow_schema(used, timezone="UTC")}
        self._options = dataclasses.replace(
            self._options, write=with_value_format(self._options.write, options, types)
        )
        if self._options.write.topic is None and "topic" not in schema.names:
            raise OptionError(
                "no topic to write to: set the option 'topic' or give the DataFrame a 'topic' "
                "column"
            )
        check_target_topic(self._options.write)

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        context = TaskContext.get()
        partition = context.partitionId() if context is not None else 0
        text = context.getLocalProperty("streaming.sql.batchId") if context is not None else None
        batch_id = int(text) if text else -1
        refs, rows = write_transaction(self._options, iterator, counter=partition)
        return SinkCommitMessage(refs, batch_id, rows, partition)

    def _client(self) -> _BlockingClient:
        return _BlockingClient(
            self._options.write.bootstrap, self._options.group, self._options.write.client
        )

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803 - Spark's name
        client = self._client()
        if not self._owner_checked:
            # Before the first publish of this query run (see sink_owner.py).
            check_owner(
                self._options.checkpoint,
                self._options.sink_id,
                lambda: client.sink_marker(self._options.sink_id),
            )
            self._owner_checked = True
        publish(client, self._options.sink_id, messages, batchId)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803 - Spark's name
        discard(self._client(), self._options.sink_id, messages, batchId)


def exactly_once_stream_writer(
    options: Mapping[str, str], schema: StructType, *, overwrite: bool
) -> TidemqStreamWriter:
    """The streaming writer of the data source `tidemq`."""
    return TidemqStreamWriter(options, schema, overwrite)
