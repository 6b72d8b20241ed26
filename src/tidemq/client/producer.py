"""The asyncio producer: an accumulator per queue, and an ordered sender per queue.

* Queue choice: the explicit `queue`, else the key's stable hash, else round robin.
* Accumulator: sends to one queue made in the same loop tick (or within `linger_ms`) go
  out as one batch, up to `batch_bytes` / `batch_messages`. `send_batch` sends its list as
  one batch of its own: one record, one index entry.
* Size: no batch whose encoding exceeds `max_request_bytes` is sent; its messages fail
  with BatchTooLarge at once. (A frame over the broker's frame limit would only get the
  connection closed, which looks retriable: the batch would be resent until retries ran
  out and then fail as BrokerNotAvailable, taking the queue's other batches with it.)
* Sender: up to `max_in_flight_per_queue` (32) batches in flight per queue, acknowledged
  in order; an idempotent producer keeps no more than the broker remembers per (producer,
  queue), which the broker says when it hands out the producer id. A retriable failure
  (connection lost, timeout, disk full) waits for the window to settle, backs off,
  re-reads routes, and resends every unacknowledged batch in order. With
  `idempotent=True` (default) each batch carries (producer id, epoch, sequence), so a
  resent batch that was in fact stored gets its original offsets back instead of being
  written twice.
* Fast path (`send`, and the sync `Producer.send`/`send_async`): when the queue's sender is
  idle (nothing accumulated, waiting or in flight), no linger is asked and the route,
  connection and producer id are known, the message is encoded and its request written at
  once from the calling task, and the connection's answer resolves the receipt directly:
  no accumulator turn, no sender task, no request task. The request counts as the sender's
  first in flight, with the next sequence number, so what is sent meanwhile goes after it
  through the sender; a failure hands it to the sender task, which retries or fails it
  exactly as any batch. The cached routes are trusted for at most `_ROUTES_RECHECK_S` after
  an awaited route lookup, so they are never older than `route_refresh_ms` plus that.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import math
import time
from collections import deque
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from tidemq.client.cluster import ClientConfig, ClusterClient
from tidemq.core import limits
from tidemq.core.batch import Codec, MessageRecord, encode_batch, encode_values
from tidemq.core.errors import (
    AlreadyDelivered,
    BatchTooLarge,
    InvalidBatch,
    OutOfOrderSequence,
    RequestTimeout,
    TidemqError,
    UnknownMessage,
)
from tidemq.core.message import BatchReceipts, Receipt
from tidemq.net.client import ClientConnection
from tidemq.protocol.codec import decode_response
from tidemq.protocol.commands import (
    CancelDelayedRequest,
    CancelDelayedResponse,
    InitProducerRequest,
    InitProducerResponse,
    ProduceRequest,
    ProduceResponse,
)
from tidemq.protocol.frame import Frame

__all__ = ["AsyncProducer", "Delay", "DeliverAt", "deliver_at_ms"]

#: A delay or delivery time, as `send` takes it.
Delay = float | timedelta | None
DeliverAt = datetime | float | None

_CODECS = {"none": Codec.NONE, "zstd": Codec.ZSTD, "lz4": Codec.LZ4}

#: How long the fast path trusts the cached route table after an awaited route lookup
#: (which refreshes it when it is older than the client's route_refresh_ms).
_ROUTES_RECHECK_S = 1.0

#: Where a message's receipt goes: the future `send` awaits, or the sync API's future.
_ReceiptFuture = asyncio.Future[Receipt] | concurrent.futures.Future[Receipt]


@dataclass(slots=True)
class _Batch:
    topic: str
    queue: int
    payload: bytes
    count: int
    futures: list[_ReceiptFuture] | None  # one per message; None for send_batch
    whole: asyncio.Future[Sequence[Receipt]] | None  # send_batch's single future
    deadline: float
    stamp: tuple[str, int, int, int] | None = None  # (address, producer id, epoch, sequence)

    def resolve(self, base: int) -> None:
        if base < 0:  # acks=0: where the messages landed is not known
            unknown = [Receipt(self.topic, self.queue, -1)] * self.count
            if self.whole is not None and not self.whole.done():
                self.whole.set_result(unknown)
            for fut, receipt in zip(self.futures or (), unknown, strict=False):
                if not fut.done():
                    fut.set_result(receipt)
            return
        if self.count == 1 and self.futures:  # one message (the fast path): no sequence
            fut = self.futures[0]
            if not fut.done():
                fut.set_result(Receipt(self.topic, self.queue, base))
            return
        receipts = BatchReceipts(self.topic, self.queue, base, self.count)
        if self.whole is not None and not self.whole.done():
            self.whole.set_result(receipts)
        for fut, receipt in zip(self.futures or (), receipts, strict=False):
            if not fut.done():
                fut.set_result(receipt)

    def fail(self, error: BaseException) -> None:
        if self.whole is not None and not self.whole.done():
            self.whole.set_exception(error)
        for fut in self.futures or ():
            if not fut.done():
                fut.set_exception(error)


@dataclass(slots=True)
class _Pending:
    records: list[MessageRecord] = field(default_factory=list)
    futures: list[_ReceiptFuture] = field(default_factory=list)
    size: int = 0
    timer: asyncio.TimerHandle | asyncio.Handle | None = None


class AsyncProducer:
    def __init__(
        self,
        bootstrap: str = "127.0.0.1:9876",
        *,
        linger_ms: float = 0,
        batch_bytes: int = 1 << 20,
        batch_messages: int = 4096,
        idempotent: bool = True,
        acks: str | int = "all",
        compression: str = "none",
        max_in_flight_per_queue: int = 32,
        delivery_timeout_ms: int = 120_000,
        max_request_bytes: int = 16 << 20,
        client_config: ClientConfig | None = None,
        cluster: ClusterClient | None = None,
    ) -> None:
        """`max_request_bytes`: the largest encoded batch this producer sends; keep it at or
        below the broker's frame limit (by default its max_fetch_bytes, 16 MiB, plus room
        for the frame header). The broker's max_message_bytes (4 MiB by default) is checked
        by the broker and also answers BatchTooLarge.

        `acks`: "all" (the default; -1 is a synonym) waits for the broker's answer, given once
        the batch is stored as durably as its flush mode promises. 0 sends without waiting
        for any answer: nothing is retried, receipts carry offset -1, and a refused or lost
        batch goes unnoticed; it cannot be combined with idempotence."""
        if acks not in ("all", -1, 0):
            raise ValueError(f"acks must be 'all', -1 or 0, got {acks!r}")
        self._acks_none = acks == 0
        if self._acks_none and idempotent:
            raise ValueError(
                "acks=0 gets no answers, so nothing can be retried or deduplicated: "
                "pass idempotent=False with it"
            )
        if not 0 < max_request_bytes <= limits.MAX_BATCH_BYTES:
            raise ValueError(f"max_request_bytes must be in 1..{limits.MAX_BATCH_BYTES}")
        if linger_ms < 0 or batch_bytes <= 0 or not 0 < batch_messages <= limits.MAX_BATCH_MESSAGES:
            raise ValueError(
                "linger_ms must be >= 0, batch_bytes > 0, and batch_messages in "
                f"1..{limits.MAX_BATCH_MESSAGES}"
            )
        if compression not in _CODECS:
            raise ValueError(f"compression must be one of {', '.join(_CODECS)}")
        if not 1 <= max_in_flight_per_queue <= limits.MAX_IN_FLIGHT_PER_QUEUE:
            raise ValueError(
                f"max_in_flight_per_queue must be 1..{limits.MAX_IN_FLIGHT_PER_QUEUE}, "
                f"got {max_in_flight_per_queue}"
            )
        self._cluster = cluster or ClusterClient(bootstrap, client_config)
        self._own_cluster = cluster is None
        self._linger_s = linger_ms / 1000
        self._batch_bytes = batch_bytes
        self._batch_messages = batch_messages
        self._idempotent = idempotent
        self._codec = _CODECS[compression]
        self._window = max_in_flight_per_queue
        self._delivery_timeout_s = delivery_timeout_ms / 1000
        self._max_request_bytes = max_request_bytes
        self._pending: dict[tuple[str, int], _Pending] = {}
        self._senders: dict[tuple[str, int], _QueueSender] = {}
        self._round_robin = itertools.count()
        self._producer_ids: dict[str, tuple[int, int]] = {}
        #: Per broker: how many batches it remembers per (producer, queue).
        self._broker_windows: dict[str, int] = {}
        #: Until when the fast path may use the cached routes without an awaited lookup.
        self._routes_trusted_until = 0.0
        self._closed = False

    # ------------------------------------------------------------------ sending

    async def _queue_for(self, topic: str, key: bytes | None, queue: int | None) -> int:
        if queue is not None:
            if queue < 0:
                raise ValueError(f"queue must be >= 0, got {queue}")
            return queue
        routes = await self._cluster.refresh_routes()
        if topic not in routes:
            routes = await self._cluster.refresh_routes(force=True)
        self.routes_checked()
        return routes.select_queue(topic, key, next(self._round_robin))

    def _queue_now(self, topic: str, key: bytes | None, queue: int | None) -> int | None:
        """`_queue_for` without awaiting, from routes looked up less than
        `_ROUTES_RECHECK_S` ago; None when that needs a route lookup."""
        if queue is not None:
            if queue < 0:
                raise ValueError(f"queue must be >= 0, got {queue}")
            return queue
        routes = self._cluster.routes
        if time.monotonic() >= self._routes_trusted_until or topic not in routes:
            return None
        return routes.select_queue(topic, key, next(self._round_robin))

    def routes_checked(self) -> None:
        """An awaited route lookup just answered: the cached routes are current."""
        self._routes_trusted_until = time.monotonic() + _ROUTES_RECHECK_S

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
        delay: Delay = None,
        deliver_at: DeliverAt = None,
    ) -> Receipt:
        """Send one message; returns once the broker acknowledged it (per its flush mode).

        `delay` (seconds or a timedelta) or `deliver_at` (an aware datetime or epoch
        seconds) makes it a delayed message: stored now, delivered to `topic` at that time
        (a time in the past: at once). Its receipt has offset -1 (the offset is known only
        at delivery) and the id to `cancel` it with."""
        if delay is not None or deliver_at is not None:
            due = deliver_at_ms(delay, deliver_at)
            record = _record(value, key, tag, keys, headers, timestamp)
            q = await self._queue_for(topic, key, queue)
            return (await self._send_special(topic, q, [record], deliver_at_ms=due))[0]
        self._check_open()
        record = _record(value, key, tag, keys, headers, timestamp)
        known = self._queue_now(topic, key, queue)
        q = await self._queue_for(topic, key, queue) if known is None else known
        future: asyncio.Future[Receipt] = asyncio.get_running_loop().create_future()
        if not self._send_direct(topic, q, record, future):
            self._accumulate(topic, q, record, future)
        return await future

    def start_send(  # noqa: PLR0917 - call_soon_threadsafe passes no keywords
        self,
        sink: concurrent.futures.Future[Receipt],
        topic: str,
        value: bytes | None,
        key: bytes | None,
        tag: str | None,
        keys: Sequence[str],
        headers: Mapping[str, bytes] | None,
        queue: int | None,
        timestamp: datetime | float | None,
        delay: Delay,
        deliver_at: DeliverAt,
    ) -> None:
        """`send`, completing `sink` (the sync API's future) instead of returning: called
        on this producer's loop, from the sync `Producer`. The fast path and the
        accumulator complete `sink` straight from the connection's answer, with no task."""
        if not sink.set_running_or_notify_cancel():
            return  # cancelled before it started: nothing was sent
        loop = asyncio.get_running_loop()
        coro: Coroutine[Any, Any, Receipt]
        if delay is not None or deliver_at is not None:
            coro = self.send(
                topic, value, key=key, tag=tag, keys=keys, headers=headers, queue=queue,
                timestamp=timestamp, delay=delay, deliver_at=deliver_at,
            )  # fmt: skip
        else:
            try:
                self._check_open()
                record = _record(value, key, tag, keys, headers, timestamp)
                q = self._queue_now(topic, key, queue)
                if q is not None:
                    if not self._send_direct(topic, q, record, sink):
                        self._accumulate(topic, q, record, sink)
                    return
            except Exception as exc:
                sink.set_exception(exc)
                return
            coro = self._send_record(topic, key, queue, record)
        task = loop.create_task(coro)
        task.add_done_callback(functools.partial(_complete_from_task, sink))

    async def _send_record(
        self, topic: str, key: bytes | None, queue: int | None, record: MessageRecord
    ) -> Receipt:
        q = await self._queue_for(topic, key, queue)
        self._check_open()
        future: asyncio.Future[Receipt] = asyncio.get_running_loop().create_future()
        if not self._send_direct(topic, q, record, future):
            self._accumulate(topic, q, record, future)
        return await future

    def _send_direct(
        self, topic: str, queue: int, record: MessageRecord, future: _ReceiptFuture
    ) -> bool:
        """The fast path (see the module's docstring): True if the message left, its
        receipt to come in `future`; False if it must go through the accumulator."""
        if self._linger_s > 0 or self._acks_none or (topic, queue) in self._pending:
            return False
        sender = self._senders.get((topic, queue))
        if sender is None or time.monotonic() >= self._routes_trusted_until:
            return False  # the first send to a queue looks up its route, connection and id
        return sender.send_direct(record, future)

    async def send_nowait(
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
    ) -> asyncio.Future[Receipt]:
        """Queue one message and return a future of its receipt (sends batch up)."""
        self._check_open()
        record = _record(value, key, tag, keys, headers, timestamp)
        q = await self._queue_for(topic, key, queue)
        future: asyncio.Future[Receipt] = asyncio.get_running_loop().create_future()
        self._accumulate(topic, q, record, future)
        return future

    def _accumulate(
        self, topic: str, q: int, record: MessageRecord, future: _ReceiptFuture
    ) -> None:
        """Add a message to its queue's accumulated batch (sealed this loop turn, after
        `linger_ms`, or when full)."""
        size = _approx_size(record)
        pending = self._pending.get((topic, q))
        if pending is not None and pending.size + size > self._max_request_bytes:
            # Together they might be too large to send: the accumulated batch goes first, so
            # that a message too large on its own fails alone (when its batch is encoded).
            self._seal(topic, q)
        pending = self._pending.setdefault((topic, q), _Pending())
        pending.records.append(record)
        pending.futures.append(future)
        pending.size += size
        if pending.size >= self._batch_bytes or len(pending.records) >= self._batch_messages:
            self._seal(topic, q)
        elif pending.timer is None:
            loop = asyncio.get_running_loop()
            if self._linger_s > 0:
                pending.timer = loop.call_later(self._linger_s, self._seal, topic, q)
            else:
                pending.timer = loop.call_soon(self._seal, topic, q)

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
        delay: Delay = None,
        deliver_at: DeliverAt = None,
    ) -> Sequence[Receipt]:
        """Send `values` as one end-to-end batch (one record, one index entry) to one queue:
        the explicit `queue`, else the first key's queue, else round robin. With `delay` or
        `deliver_at` the batch is scheduled, delivered, and cancellable as one unit.

        The receipts are a read-only sequence (`BatchReceipts`, equal to the list of the
        same receipts) that builds each receipt when it is read."""
        if delay is not None or deliver_at is not None:
            due = deliver_at_ms(delay, deliver_at)
            records = _batch_records(values, keys, tags, headers, timestamp)
            q = await self._queue_for(topic, keys[0] if keys else None, queue)
            return await self._send_special(topic, q, records, deliver_at_ms=due)
        return await (
            await self.send_batch_nowait(
                topic, values, keys=keys, tags=tags, headers=headers, queue=queue,
                timestamp=timestamp,
            )
        )  # fmt: skip

    async def send_batch_nowait(
        self,
        topic: str,
        values: Sequence[bytes | None],
        *,
        keys: Sequence[bytes | None] | None = None,
        tags: Sequence[str | None] | None = None,
        headers: Mapping[str, bytes] | None = None,
        queue: int | None = None,
        timestamp: datetime | float | None = None,
    ) -> asyncio.Future[Sequence[Receipt]]:
        self._check_open()
        n = len(values)
        if (keys is not None and len(keys) != n) or (tags is not None and len(tags) != n):
            raise ValueError("keys and tags must have one entry per value")
        first_key = keys[0] if keys else None
        q = await self._queue_for(topic, first_key, queue)
        self._seal(topic, q)  # whatever was accumulated for this queue goes first
        # Columns straight from the lists: no record object per message (issue #4).
        payload = encode_values(
            values,
            timestamp_ms=_timestamp_ms(timestamp),
            keys=keys,
            tags=tags,
            headers=headers,
            codec=self._codec,
            max_batch_bytes=self._max_request_bytes,
        )
        future: asyncio.Future[Sequence[Receipt]] = asyncio.get_running_loop().create_future()
        self._sender(topic, q).add(
            _Batch(topic, q, payload, n, None, future, time.monotonic() + self._delivery_timeout_s)
        )
        return future

    async def _send_special(
        self,
        topic: str,
        queue: int,
        records: list[MessageRecord],
        *,
        deliver_at_ms: int = 0,
        txn_id: str = "",
    ) -> list[Receipt]:
        """Send one batch straight to the broker, outside the accumulator and the ordered
        sender: a delayed or transactional batch. Not retried: a timeout leaves its
        outcome unknown (a delayed one shows in the timer status)."""
        self._check_open()
        payload = encode_batch(records, codec=self._codec, max_batch_bytes=self._max_request_bytes)
        request = ProduceRequest(
            topic=topic, queue=queue, deliver_at_ms=deliver_at_ms, txn_id=txn_id
        )
        address = await self._cluster.broker_for(topic, queue)
        try:
            resp, _ = await self._cluster.request(address, request, ProduceResponse, payload)
        except TidemqError as exc:
            self._cluster.invalidate(exc)
            raise
        origin = resp.origin_topic
        return [
            Receipt(topic, queue, -1, (origin, resp.origin_queue, resp.base_offset + i))
            if origin
            else Receipt(topic, queue, resp.base_offset + i)
            for i in range(resp.count)
        ]

    async def cancel(self, message_id: str) -> CancelDelayedResponse:
        """Cancel a delayed message before its delivery, by the id its receipt carries. A
        delayed `send_batch` is one unit: cancelling any of its ids cancels the batch.
        Raises AlreadyDelivered after delivery (or a second cancel), UnknownMessage for an
        id no broker scheduled."""
        self._check_open()
        routes = await self._cluster.refresh_routes()
        addresses = sorted(set(routes.brokers.values())) or [await self._cluster.any_broker()]
        unknown: UnknownMessage | None = None
        for address in addresses:
            try:
                return await self._cluster.call(
                    address, CancelDelayedRequest(message_id=message_id), CancelDelayedResponse
                )
            except AlreadyDelivered:
                raise
            except UnknownMessage as exc:
                unknown = exc  # another broker may hold it
        assert unknown is not None
        raise unknown

    def _seal(self, topic: str, queue: int) -> None:
        pending = self._pending.pop((topic, queue), None)
        if pending is None:
            return
        if pending.timer is not None:
            pending.timer.cancel()
        try:
            payload = encode_batch(
                pending.records, codec=self._codec, max_batch_bytes=self._max_request_bytes
            )
        except (InvalidBatch, BatchTooLarge) as exc:
            for fut in pending.futures:
                if not fut.done():
                    fut.set_exception(exc)
            return
        deadline = time.monotonic() + self._delivery_timeout_s
        batch = _Batch(topic, queue, payload, len(pending.records), pending.futures, None, deadline)
        self._sender(topic, queue).add(batch)

    def _sender(self, topic: str, queue: int) -> _QueueSender:
        sender = self._senders.get((topic, queue))
        if sender is None:
            sender = self._senders[(topic, queue)] = _QueueSender(self, topic, queue)
        return sender

    async def flush(self) -> None:
        """Send everything accumulated and wait until every batch is answered."""
        for topic, queue in list(self._pending):
            self._seal(topic, queue)
        waits = [s.idle.wait() for s in self._senders.values() if not s.idle.is_set()]
        if waits:
            await asyncio.gather(*waits)

    async def close(self) -> None:
        if self._closed:
            return
        await self.flush()
        self._closed = True
        if self._own_cluster:
            await self._cluster.close()

    async def __aenter__(self) -> AsyncProducer:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("the producer is closed")

    # ------------------------------------------------------------------ used by senders

    @property
    def cluster(self) -> ClusterClient:
        return self._cluster

    async def producer_id(self, address: str, *, renew: bool = False) -> tuple[int, int]:
        if renew or address not in self._producer_ids:
            resp = await self._cluster.call(address, InitProducerRequest(), InitProducerResponse)
            self._producer_ids[address] = (resp.producer_id, resp.epoch)
            self._broker_windows[address] = max(1, resp.window)
        return self._producer_ids[address]

    def window_for(self, address: str) -> int:
        """Batches in flight per queue on this broker: as many as asked, and for an
        idempotent producer no more than the broker remembers (5 until it said)."""
        if not self._idempotent:
            return self._window
        return min(self._window, self._broker_windows.get(address, 5))


class _QueueSender:
    """Ordered delivery of one queue's batches, with a window of requests in flight."""

    def __init__(self, producer: AsyncProducer, topic: str, queue: int) -> None:
        self._p = producer
        self._topic = topic
        self._queue = queue
        self._waiting: deque[_Batch] = deque()
        #: Requests in flight, oldest first: the sender task's, or a fast-path send's (a
        #: plain future the connection's answer completes).
        self._inflight: deque[tuple[_Batch, asyncio.Future[ProduceResponse]]] = deque()
        self._task: asyncio.Task[None] | None = None
        #: The connection of the last request, for the fast path.
        self._conn: ClientConnection | None = None
        self._sequence = 0
        self._stamp_key: tuple[str, int, int] | None = None  # (address, pid, epoch)
        #: The next batch stamped starts over under a fresh producer id: a batch that was
        #: stamped has failed for good, leaving a gap in this queue's sequence.
        self._restamp = False
        self.idle = asyncio.Event()
        self.idle.set()

    def add(self, batch: _Batch) -> None:
        self._waiting.append(batch)
        self.idle.clear()
        self._start_task()

    def _start_task(self) -> None:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self._run())
            self._task.add_done_callback(self._on_done)

    def _direct_target(self) -> tuple[ClientConnection, int, int, int] | None:
        """(connection, producer id, epoch, sequence) for a fast-path send, when this
        sender is idle and they are known without awaiting; else None."""
        idle = not self._waiting and not self._inflight and not self._restamp
        if not idle or (self._task is not None and not self._task.done()):
            return None
        conn = self._conn
        if conn is None or not conn.has_free_slot or not conn.is_open:
            return None
        p = self._p
        if p.cluster.routes.broker_for(self._topic, self._queue) != conn.address:
            return None
        if not p._idempotent:
            return conn, -1, -1, -1
        # As `_stamp` would, without awaiting: the same producer id, the next number.
        ids = p._producer_ids.get(conn.address)
        if ids is None or self._stamp_key != (conn.address, *ids):
            return None
        return conn, ids[0], ids[1], self._sequence

    def send_direct(self, record: MessageRecord, future: _ReceiptFuture) -> bool:
        """Send one message now from the caller (the fast path), when this sender is idle
        and its route, connection and producer id are known: True if it left."""
        target = self._direct_target()
        if target is None:
            return False
        conn, pid, epoch, seq = target
        address = conn.address
        p = self._p
        payload = encode_batch([record], codec=p._codec, max_batch_bytes=p._max_request_bytes)
        deadline = time.monotonic() + p._delivery_timeout_s
        batch = _Batch(
            self._topic,
            self._queue,
            payload,
            1,
            [future],
            None,
            deadline,
            (address, pid, epoch, seq),
        )
        request = ProduceRequest(
            topic=self._topic, queue=self._queue, producer_id=pid, epoch=epoch, base_sequence=seq
        )
        response: asyncio.Future[ProduceResponse] = asyncio.get_running_loop().create_future()
        try:
            conn.request_nowait(
                request,
                payload,
                timeout_s=p.cluster.config.request_timeout_ms / 1000,
                callback=functools.partial(self._direct_answer, batch, response),
            )
        except TidemqError:
            return False  # closed since: the accumulator's way reconnects
        if p._idempotent:
            self._sequence += 1
        self._inflight.append((batch, response))
        self.idle.clear()
        return True

    def _direct_answer(
        self,
        batch: _Batch,
        response: asyncio.Future[ProduceResponse],
        frame: Frame | None,
        error: BaseException | None,
    ) -> None:
        """The connection's answer to a fast-path request."""
        if response.done():
            return  # the sender was abandoned (its loop is closing); the batch has failed
        if frame is not None:
            try:
                header = decode_response(frame, ProduceResponse)
            except Exception as exc:
                error = exc
            else:
                response.set_result(header)
                if self._task is None or self._task.done():
                    # Nothing else was sent meanwhile: settle it here, not in a task.
                    entry = self._inflight.popleft()
                    assert entry[1] is response
                    batch.resolve(header.base_offset)
                    if not self._inflight and not self._waiting:
                        self.idle.set()
                # Else the sender task, started meanwhile, settles it first, in order.
                return
        assert error is not None
        response.set_exception(error)
        # The sender task retries it (with what follows) or fails it, as any batch.
        self._start_task()

    def _on_done(self, task: asyncio.Task[None]) -> None:
        # A task cancelled before its first step never ran `_run`'s own handler.
        if task is self._task and task.cancelled():
            self._abandon(self._inflight)

    def _abandon(self, inflight: deque[tuple[_Batch, asyncio.Future[ProduceResponse]]]) -> None:
        """The sending task was cancelled (its event loop is shutting down): answer what is
        left, or a flush or a send waiting for it would never return."""
        error = RequestTimeout(
            f"the producer's sender for {self._topic}/{self._queue} was cancelled; "
            "the outcome of its unacknowledged messages is unknown"
        )
        for b, task in inflight:
            task.cancel()
            b.fail(error)
        inflight.clear()
        for b in self._waiting:
            b.fail(error)
        self._waiting.clear()
        self.idle.set()

    async def _stamp(self, batch: _Batch, address: str, *, renew: bool = False) -> None:
        if not self._p._idempotent:
            batch.stamp = (address, -1, -1, -1)
            return
        pid, epoch = await self._p.producer_id(address, renew=renew)
        if self._stamp_key != (address, pid, epoch):
            self._stamp_key = (address, pid, epoch)
            self._sequence = 0
        batch.stamp = (address, pid, epoch, self._sequence)
        self._sequence += batch.count

    async def _send(self, batch: _Batch) -> ProduceResponse:
        assert batch.stamp is not None
        address, pid, epoch, seq = batch.stamp
        request = ProduceRequest(
            topic=self._topic, queue=self._queue, producer_id=pid, epoch=epoch, base_sequence=seq
        )
        conn = await self._p.cluster.connection(address)
        self._conn = conn
        if self._p._acks_none:
            # One-way frame: the broker stores it and answers nothing.
            conn.send_oneway(request, batch.payload)
            return ProduceResponse(base_offset=-1, count=batch.count)
        timeout_s = self._p.cluster.config.request_timeout_ms / 1000
        header, _ = await conn.request(request, ProduceResponse, batch.payload, timeout_s=timeout_s)
        return header

    async def _run(self) -> None:
        inflight = self._inflight
        attempt = 0
        try:
            while self._waiting or inflight:
                try:
                    address = await self._p.cluster.broker_for(self._topic, self._queue)
                    self._p.routes_checked()
                    window = self._p.window_for(address)
                    while self._waiting and len(inflight) < window:
                        batch = self._waiting.popleft()
                        if batch.stamp is None or batch.stamp[0] != address or self._restamp:
                            await self._stamp(batch, address, renew=self._restamp)
                            self._restamp = False
                        task = asyncio.get_running_loop().create_task(self._send(batch))
                        inflight.append((batch, task))
                except TidemqError as exc:
                    # No route (yet): every waiting batch waits for the next attempt.
                    attempt = await self._retry_or_fail(exc, attempt, list(self._waiting))
                    continue
                batch, answer = inflight[0]
                try:
                    response = await answer
                except TidemqError as exc:
                    settled = await self._settle(inflight)
                    requeue = [b for b, err in settled if err is not None]
                    if exc.retriable:
                        self._waiting.extendleft(reversed(requeue))
                        attempt = await self._retry_or_fail(exc, attempt, requeue)
                        continue
                    batch.fail(exc)
                    rest = [b for b in requeue if b is not batch]
                    self._waiting.extendleft(reversed(rest))
                    # Later batches were refused for the gap this one left, and so would every
                    # later send be: restart the sequence under a fresh producer id before
                    # sending anything else to this queue (even if nothing is waiting now).
                    self._restamp = self._p._idempotent
                    for b in self._waiting:
                        b.stamp = None
                    continue
                inflight.popleft()
                attempt = 0
                batch.resolve(response.base_offset)
        except asyncio.CancelledError:
            self._abandon(inflight)
            raise
        self.idle.set()

    async def _settle(
        self, inflight: deque[tuple[_Batch, asyncio.Future[ProduceResponse]]]
    ) -> list[tuple[_Batch, BaseException | None]]:
        """Wait for every request in flight; resolve the ones that succeeded."""
        out: list[tuple[_Batch, BaseException | None]] = []
        while inflight:
            batch, task = inflight.popleft()
            try:
                response = await task
            except TidemqError as exc:
                out.append((batch, exc))
                continue
            batch.resolve(response.base_offset)
            out.append((batch, None))
        return out

    async def _retry_or_fail(self, exc: TidemqError, attempt: int, batches: list[_Batch]) -> int:
        attempt += 1
        now = time.monotonic()
        expired = [b for b in batches if b.deadline <= now]
        if not exc.retriable or attempt > self._p.cluster.config.retries or expired:
            error: TidemqError = exc
            if expired and exc.retriable:
                error = RequestTimeout(f"delivery timed out after retries: {exc}")
            if not exc.retriable or attempt > self._p.cluster.config.retries:
                for b in list(self._waiting):
                    b.fail(error)
                self._waiting.clear()
                # The failed batches may have been stamped (and, after a timeout, maybe
                # stored): the next send must not depend on their sequence numbers.
                self._restamp = self._p._idempotent
            else:
                for b in expired:
                    b.fail(error)
                    if b in self._waiting:
                        self._waiting.remove(b)
            return 0
        self._p.cluster.invalidate(exc)
        if isinstance(exc, OutOfOrderSequence):
            for b in self._waiting:
                b.stamp = None
        await asyncio.sleep(self._p.cluster.backoff_s(attempt))
        return attempt


def _complete_from_task(
    sink: concurrent.futures.Future[Receipt], task: asyncio.Task[Receipt]
) -> None:
    """Copy a task's outcome to the sync API's future (already set running)."""
    if task.cancelled():
        sink.set_exception(concurrent.futures.CancelledError())
    elif (exc := task.exception()) is not None:
        sink.set_exception(exc)
    else:
        sink.set_result(task.result())


def deliver_at_ms(delay: Delay, deliver_at: DeliverAt) -> int:
    """The delivery time in epoch milliseconds from a `delay` or a `deliver_at`."""
    if delay is not None and deliver_at is not None:
        raise ValueError("pass delay or deliver_at, not both")
    if delay is not None:
        seconds = delay.total_seconds() if isinstance(delay, timedelta) else float(delay)
        if math.isnan(seconds) or seconds < 0:
            raise ValueError(f"delay must be >= 0 seconds, got {delay!r}")
        return time.time_ns() // 1_000_000 + max(1, round(seconds * 1000))
    if isinstance(deliver_at, datetime):
        if deliver_at.tzinfo is None:
            raise ValueError("deliver_at must be timezone-aware (e.g. tzinfo=UTC)")
        return max(1, int(deliver_at.timestamp() * 1000))
    assert deliver_at is not None
    if math.isnan(deliver_at) or deliver_at < 0:
        raise ValueError(f"deliver_at must be epoch seconds >= 0, got {deliver_at!r}")
    return max(1, int(deliver_at * 1000))


def _batch_records(
    values: Sequence[bytes | None],
    keys: Sequence[bytes | None] | None,
    tags: Sequence[str | None] | None,
    headers: Mapping[str, bytes] | None,
    timestamp: datetime | float | None,
) -> list[MessageRecord]:
    n = len(values)
    if (keys is not None and len(keys) != n) or (tags is not None and len(tags) != n):
        raise ValueError("keys and tags must have one entry per value")
    ts = _timestamp_ms(timestamp)
    hdr = tuple((headers or {}).items())
    return [
        MessageRecord(
            v,
            keys[i] if keys is not None else None,
            tags[i] if tags is not None else None,
            (),
            hdr,
            ts,
        )
        for i, v in enumerate(values)
    ]


def _timestamp_ms(timestamp: datetime | float | None) -> int:
    if timestamp is None:
        return time.time_ns() // 1_000_000
    if isinstance(timestamp, datetime):
        if timestamp.tzinfo is None:
            raise ValueError("timestamp must be timezone-aware")
        return int(timestamp.timestamp() * 1000)
    return int(timestamp * 1000)


def _record(  # noqa: PLR0917 - mirrors send()'s arguments one to one
    value: bytes | None,
    key: bytes | None,
    tag: str | None,
    keys: Sequence[str],
    headers: Mapping[str, bytes] | None,
    timestamp: datetime | float | None,
) -> MessageRecord:
    if value is not None and not isinstance(value, (bytes, bytearray, memoryview)):
        raise TypeError(f"value must be bytes or None, got {type(value).__name__}")
    if key is not None and not isinstance(key, (bytes, bytearray, memoryview)):
        raise TypeError(f"key must be bytes or None, got {type(key).__name__}")
    if isinstance(keys, str):
        raise TypeError("keys is a sequence of strings, not one string")
    return MessageRecord(
        None if value is None else bytes(value),
        None if key is None else bytes(key),
        tag,
        tuple(keys),
        tuple((headers or {}).items()),
        _timestamp_ms(timestamp),
    )


def _approx_size(record: MessageRecord) -> int:
    size = 24 + len(record.value or b"") + len(record.key or b"")
    if record.headers:
        size += sum(len(k) + len(v) + 8 for k, v in record.headers)
    return size
