"""Transactional producer (asyncio): half messages, commit or roll back, check-back.

    producer = TransactionProducer(bootstrap, "orders-tx", checker=check)
    async with producer.transaction() as tx:     # commits on success, rolls back on error
        await tx.send("orders", b"...")
        await tx.send("audit", b"...")

`tx.send` stores a half message that no consumer sees; `commit()` makes every message of
the transaction visible, on all its queues, as one unit, and returns their receipts with
offsets. A transaction spans one broker per queue it writes to: on one broker (the usual
case) it commits atomically; across brokers each broker's part commits atomically, in turn.

`checker(check) -> "commit" | "rollback" | "unknown"` answers the broker when a
transaction stays undecided (its producer crashed between its local work and the commit):
the broker asks a live producer of the same `group`. It may be a plain function (run on a
worker thread) or a coroutine function. Raising or answering "unknown" means "ask again
later"; after the broker's maximum number of checks it rolls the transaction back.

For exactly-once sinks, `commit(sink_id=..., batch_id=...)` stores the marker atomically
with the commit, `sink_marker(sink_id)` reads it back, and `commit_many` commits
transactions begun by other processes (Spark executors) as one unit with the marker.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from tidemq.client import checks
from tidemq.client.cluster import ClientConfig, ClusterClient
from tidemq.client.producer import AsyncProducer
from tidemq.client.queue_sender import Special
from tidemq.client.records import build_record, build_records
from tidemq.core.errors import InvalidRequest, TidemqError, TransactionStateError
from tidemq.core.message import Receipt
from tidemq.core.properties import HALF_TOPIC
from tidemq.net.client import ClientConnection
from tidemq.net.tasks import cancel_and_wait, completes_when_cancelled
from tidemq.protocol.codec import decode_request, encode_server_error, encode_server_response
from tidemq.protocol.commands import (
    BeginTxnRequest,
    BeginTxnResponse,
    CheckTxnRequest,
    CheckTxnResponse,
    Empty,
    EndTxnRequest,
    EndTxnResponse,
    RegisterCheckerRequest,
    SinkMarkerRequest,
    SinkMarkerResponse,
)
from tidemq.protocol.frame import Frame

__all__ = ["AsyncTransaction", "AsyncTransactionProducer", "TransactionCheck", "TxnRef"]

log = logging.getLogger(__name__)

_DECISIONS = ("commit", "rollback", "unknown")
#: How often a producer with a checker makes sure every broker knows it.
_CHECKER_REFRESH_S = 5.0


@dataclass(frozen=True, slots=True)
class TransactionCheck:
    """What the broker asks a checker about: an undecided transaction of its group."""

    txn_id: str
    group: str
    messages: int
    topics: tuple[str, ...]
    first_send_ms: int
    #: 1 for the first check of this transaction, then 2, 3, ...
    check: int


Checker = Callable[[TransactionCheck], str | Awaitable[str]]

#: A transaction begun on one broker: (broker address, transaction id). Picklable, so a
#: Spark executor can hand it to the driver.
TxnRef = tuple[str, str]


class AsyncTransactionProducer:
    def __init__(
        self,
        bootstrap: str = "127.0.0.1:9876",
        group: str = "",
        *,
        checker: Checker | None = None,
        client_config: ClientConfig | None = None,
        compression: str = "none",
    ) -> None:
        if not group:
            raise ValueError("a transaction producer needs a group (its check-back group)")
        self.group = group
        self._checker = checker
        self._cluster = ClusterClient(bootstrap, client_config)
        # The plain producer encodes batches and routes queues; sends go out one by one.
        self._producer = AsyncProducer(
            bootstrap, idempotent=False, compression=compression, cluster=self._cluster
        )
        self._registered: set[int] = set()
        self._keeper: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def cluster(self) -> ClusterClient:
        return self._cluster

    @property
    def producer(self) -> AsyncProducer:
        """The plain producer that stages this producer's half messages, in send order."""
        return self._producer

    async def start(self) -> None:
        """With a checker: offer it to every broker now, and again whenever a connection
        is replaced (every `_CHECKER_REFRESH_S`), so that a restarted application answers
        for the transactions its previous run left open before it begins any. Called by
        `begin` and `async with`; idempotent."""
        if self._closed:
            raise TidemqError("the transaction producer is closed")
        if self._checker is None or self._keeper is not None:
            return
        await self._register_all()
        self._keeper = asyncio.get_running_loop().create_task(self._keep_registered())

    async def _register_all(self) -> None:
        routes = await self._cluster.refresh_routes()
        addresses = set(routes.brokers.values()) or {await self._cluster.any_broker()}
        for address in sorted(addresses):
            await self._register_checker(address)

    async def _keep_registered(self) -> None:
        while True:
            await asyncio.sleep(_CHECKER_REFRESH_S)
            try:
                await self._register_all()
            except TidemqError as exc:
                log.info("could not offer the transaction checker to the brokers: %s", exc)

    async def begin(self) -> AsyncTransaction:
        await self.start()
        return AsyncTransaction(self)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[AsyncTransaction]:
        """Commits when the block ends normally, rolls back when it raises."""
        tx = await self.begin()
        try:
            yield tx
        except BaseException:
            if not tx.ended:
                try:
                    await tx.rollback()
                except TidemqError:
                    log.exception("rolling back transaction after an error failed")
            raise
        if not tx.ended:
            await tx.commit()

    async def _begin_on(self, address: str) -> str:
        await self._register_checker(address)
        resp = await self._cluster.call(
            address, BeginTxnRequest(group=self.group), BeginTxnResponse
        )
        return resp.txn_id

    async def commit_many(
        self, refs: Sequence[TxnRef], *, sink_id: str = "", batch_id: int = -1
    ) -> list[Receipt]:
        """Commit transactions begun elsewhere (by `AsyncTransaction.refs`) as one unit per
        broker, with the sink marker on the first broker (of the sorted addresses). With no
        refs, only the marker is committed (in a transaction of its own)."""
        by_broker: dict[str, list[str]] = {}
        for address, txn_id in refs:
            by_broker.setdefault(address, []).append(txn_id)
        if not by_broker and sink_id:
            address = await self._cluster.any_broker()
            by_broker[address] = [await self._begin_on(address)]
        receipts: list[Receipt] = []
        for i, address in enumerate(sorted(by_broker)):
            request = EndTxnRequest(
                txn_ids=by_broker[address],
                commit=True,
                sink_id=sink_id if i == 0 else "",
                batch_id=batch_id if i == 0 and sink_id else -1,
            )
            resp = await self._cluster.call(address, request, EndTxnResponse)
            receipts.extend(_receipts(resp))
        return receipts

    async def rollback_many(self, refs: Sequence[TxnRef]) -> None:
        by_broker: dict[str, list[str]] = {}
        for address, txn_id in refs:
            by_broker.setdefault(address, []).append(txn_id)
        for address, ids in sorted(by_broker.items()):
            await self._cluster.call(
                address, EndTxnRequest(txn_ids=ids, commit=False), EndTxnResponse
            )

    async def sink_marker(self, sink_id: str) -> int:
        """The last batch id committed with `sink_id` (-1 if none), over all brokers."""
        routes = await self._cluster.refresh_routes()
        addresses = sorted(set(routes.brokers.values())) or [await self._cluster.any_broker()]
        best = -1
        for address in addresses:
            resp = await self._cluster.call(
                address, SinkMarkerRequest(sink_id=sink_id), SinkMarkerResponse
            )
            best = max(best, resp.batch_id)
        return best

    # ------------------------------------------------------------------ check-back

    async def _register_checker(self, address: str) -> None:
        if self._checker is None:
            return
        conn = await self._cluster.connection(address)
        if id(conn) in self._registered:
            return
        conn.on_server_request = lambda frame: self._on_check(conn, frame)
        await conn.request(
            RegisterCheckerRequest(group=self.group),
            Empty,
            timeout_s=self._cluster.config.request_timeout_ms / 1000,
        )
        self._registered.add(id(conn))

    def _on_check(self, conn: ClientConnection, frame: Frame) -> None:
        task = asyncio.get_running_loop().create_task(self._answer(conn, frame))
        task.add_done_callback(lambda t: t.exception() if not t.cancelled() else None)

    async def _answer(self, conn: ClientConnection, frame: Frame) -> None:
        try:
            _, req = decode_request(frame)
            if not isinstance(req, CheckTxnRequest):
                raise InvalidRequest(f"a client answers CHECK_TXN only, not code {frame.code}")
            decision = await self._decide(req)
            out = encode_server_response(
                frame.code, frame.correlation_id, CheckTxnResponse(decision=decision)
            )
        except TidemqError as exc:
            out = encode_server_error(frame.code, frame.correlation_id, exc)
        conn.send_frame(out)

    async def _decide(self, req: CheckTxnRequest) -> str:
        assert self._checker is not None
        check = TransactionCheck(
            req.txn_id, req.group, req.messages, tuple(req.topics), req.first_send_ms, req.check
        )
        try:
            if inspect.iscoroutinefunction(self._checker):
                result: Any = await self._checker(check)
            else:
                result = await asyncio.to_thread(self._checker, check)
                if inspect.isawaitable(result):
                    result = await result
        except Exception:
            log.exception("transaction checker raised for %s; answering unknown", req.txn_id)
            return "unknown"
        decision = str(getattr(result, "value", result)).lower()
        if decision not in _DECISIONS:
            log.warning("transaction checker answered %r; treating it as unknown", result)
            return "unknown"
        return decision

    @completes_when_cancelled
    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._keeper is not None:
            await cancel_and_wait(self._keeper)
        await self._producer.close()
        await self._cluster.close()

    async def __aenter__(self) -> AsyncTransactionProducer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class AsyncTransaction:
    """One transaction: half messages on each broker it writes to, ended as one."""

    def __init__(self, producer: AsyncTransactionProducer) -> None:
        self._producer = producer
        self._txn_ids: dict[str, str] = {}
        self._lock = asyncio.Lock()
        self.ended = False
        self.outcome: str | None = None

    @property
    def refs(self) -> list[TxnRef]:
        """(broker, transaction id) pairs, for `AsyncTransactionProducer.commit_many`."""
        return sorted(self._txn_ids.items())

    async def _txn_for(self, address: str) -> str:
        async with self._lock:
            txn_id = self._txn_ids.get(address)
            if txn_id is None:
                txn_id = self._txn_ids[address] = await self._producer._begin_on(address)
            return txn_id

    def _check_open(self) -> None:
        if self.ended:
            raise TransactionStateError(f"this transaction was {self.outcome}; begin a new one")

    async def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        tag: str | None = None,
        keys: Sequence[str] = (),
        headers: Mapping[str, bytes] | None = None,
        queue: int | None = None,
        timestamp: datetime | float | None = None,
    ) -> Receipt:
        """Store one half message. Its receipt has offset -1 until the commit (whose
        receipts have the offsets) and already the id the message will keep."""
        record = build_record(value, key, tag, keys, headers, timestamp)
        return (await self._send(topic, key, queue, [record]))[0]

    async def send_batch(
        self,
        topic: str,
        values: Sequence[bytes | None],
        *,
        keys: Sequence[bytes | None] | None = None,
        tags: Sequence[str | None] | None = None,
        headers: Mapping[str, bytes] | None = None,
        queue: int | None = None,
        timestamp: datetime | float | None = None,
    ) -> list[Receipt]:
        """Store `values` as one half batch (published as one batch at commit)."""
        records = build_records(values, keys, tags, headers, timestamp)
        return await self._send(topic, keys[0] if keys else None, queue, records)

    async def _send(
        self, topic: str, key: bytes | None, queue: int | None, records: list[Any]
    ) -> list[Receipt]:
        self._check_open()
        return list(
            await self._producer.producer.send_special(
                checks.check_readable_topic(topic),
                records,
                key=key,
                queue=checks.check_queue(queue),
                special=Special(txn=self._txn_for),
            )
        )

    async def commit(self, *, sink_id: str = "", batch_id: int = -1) -> list[Receipt]:
        """Make every message visible (atomically per broker); returns their receipts.
        With `sink_id`, stores the marker (sink_id, batch_id) with the commit."""
        self._check_open()
        receipts = await self._producer.commit_many(self.refs, sink_id=sink_id, batch_id=batch_id)
        self.ended, self.outcome = True, "committed"
        return receipts

    async def rollback(self) -> None:
        """Discard every message of the transaction."""
        self._check_open()
        await self._producer.rollback_many(self.refs)
        self.ended, self.outcome = True, "rolled back"


def _receipts(resp: EndTxnResponse) -> list[Receipt]:
    return [
        Receipt(
            b.topic,
            b.queue,
            b.base_offset + i,
            (b.origin_topic or HALF_TOPIC, 0, b.origin_offset + i),
        )
        for b in resp.published
        for i in range(b.count)
    ]
