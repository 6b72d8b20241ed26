"""The asyncio producer: every send goes to its queue in the order it was made.

* Checks: every argument is checked at the call (`records.py`, `checks.py`); a wrong one
  raises there, and nothing is sent.
* Queue choice: the explicit `queue`, else the key's stable hash, else round robin, from
  the topic's route. A send whose topic's route is not known (or not checked within
  `ROUTES_RECHECK_S`) waits in the topic's line (`route_wait.py`), and so does every later
  send to that topic until the line is handed over: no send overtakes an earlier one.
* Accumulator: sends to one queue made in the same loop turn (or within `linger_ms`) go
  out as one batch, up to `batch_bytes` / `batch_messages`. `send_batch` sends its list as
  one batch of its own: one record, one index entry.
* Size: no batch whose encoding exceeds `max_request_bytes` is sent; its messages fail
  with BatchTooLarge at once. (A frame over the broker's frame limit would only get the
  connection closed, which looks retriable.)
* Sender: one ordered sender per queue (`queue_sender.py`): a window of batches in flight,
  answered in order, retried in order, deduplicated by (producer id, epoch, sequence).
  Delayed and transactional batches go through the same sender, as barriers.
* Fast path: when a queue's sender is idle, nothing is accumulated for it, no linger is
  asked and its route, connection and producer id are known, a message is encoded and
  written at once by the caller, and the connection's answer resolves its receipt.
* Bounds: every send ends, in a receipt or an error, within `delivery_timeout_ms` (plus
  at most one attempt's grace); no failure anywhere on the way leaves a send unanswered.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from tidemq.client import checks
from tidemq.client._loop import call_soon
from tidemq.client.accumulator import Accumulator
from tidemq.client.cluster import ClientConfig, ClusterClient
from tidemq.client.producer_config import ProducerConfig
from tidemq.client.queue_sender import (
    Batch,
    BatchFuture,
    QueueSender,
    ReceiptFuture,
    SenderContext,
    Special,
    Stamp,
    WholeFuture,
)
from tidemq.client.records import (
    Delay,
    DeliverAt,
    batch_columns,
    check_send,
    deliver_at_ms,
    due_ms_of,
)
from tidemq.client.results import CancelResult, cancel_result_from_wire
from tidemq.client.route_wait import RouteWait, WaitingSend
from tidemq.core.batch import MessageRecord, encode_batch, encode_values
from tidemq.core.errors import AlreadyDelivered, QueueMoved, TidemqError, UnknownMessage
from tidemq.core.message import Receipt
from tidemq.protocol.commands import CancelDelayedRequest, CancelDelayedResponse

__all__ = ["AsyncProducer", "Delay", "DeliverAt", "ValueSerializer", "deliver_at_ms"]

#: (topic, value) -> the value's bytes.
ValueSerializer = Callable[[str, Any], bytes]


class AsyncProducer:
    """Sends messages to topics; receipts say where each was stored. Lives on the event
    loop it is first used on (the sync `tidemq.Producer` runs one on its client loop)."""

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
        value_serializer: ValueSerializer | None = None,
        key_serializer: ValueSerializer | None = None,
    ) -> None:
        """`value_serializer(topic, value) -> bytes` turns every value given to a send
        into its bytes (for example `tidemq.AvroSerializer`); None values (tombstones)
        stay None. `key_serializer(topic, key) -> bytes` does the same for keys (a
        message's key, and the keys of a batch); without one, keys are bytes.

        `max_request_bytes`: the largest encoded batch this producer sends; keep it at or
        below the broker's frame limit (by default its max_fetch_bytes, 16 MiB, plus room
        for the frame header). The broker's max_message_bytes (4 MiB by default) is checked
        by the broker and also answers BatchTooLarge.

        `acks`: "all" (the default; -1 is a synonym) waits for the broker's answer, given once
        the batch is stored as durably as its flush mode promises. 0 sends without waiting
        for any answer: nothing is retried, receipts carry offset -1, and a refused or lost
        batch goes unnoticed; it cannot be combined with idempotence.

        `delivery_timeout_ms`: the longest a send takes to end in a receipt or an error,
        retries included (an attempt that started before the deadline may finish up to
        one second after it)."""
        self._config = ProducerConfig(
            linger_ms=linger_ms,
            batch_bytes=batch_bytes,
            batch_messages=batch_messages,
            idempotent=idempotent,
            acks=acks,
            compression=compression,
            max_in_flight_per_queue=max_in_flight_per_queue,
            delivery_timeout_ms=delivery_timeout_ms,
            max_request_bytes=max_request_bytes,
        )
        self._cluster = cluster or ClusterClient(bootstrap, client_config)
        self._own_cluster = cluster is None
        self._ctx = SenderContext(self._config, self._cluster)
        self._route_wait = RouteWait(self._cluster, self._ctx.routes_checked)
        self._accumulator = Accumulator(self._config, self._ctx, self._sender)
        self._senders: dict[tuple[str, int], QueueSender] = {}
        self._closed = False
        self._serializer = value_serializer
        self._key_serializer = key_serializer

    @property
    def config(self) -> ProducerConfig:
        return self._config

    @property
    def cluster(self) -> ClusterClient:
        return self._cluster

    def window_for(self, address: str) -> int:
        """Batches this producer keeps in flight per queue on the broker at `address`."""
        return self._ctx.window_for(address)

    # ------------------------------------------------------------------ public API

    def serialize(self, topic: object, value: object) -> object:
        """`value` through the producer's `value_serializer` (as it is without one)."""
        if self._serializer is None or value is None:
            return value
        return self._serializer(checks.check_readable_topic(topic), value)

    def serialize_key(self, topic: object, key: object) -> object:
        """`key` through the producer's `key_serializer` (as it is without one)."""
        if self._key_serializer is None or key is None:
            return key
        return self._key_serializer(checks.check_readable_topic(topic), key)

    def _serialize_keys(self, topic: object, keys: object) -> object:
        if self._key_serializer is None or not isinstance(keys, list | tuple):
            return keys
        return [self.serialize_key(topic, k) for k in keys]

    def _serialize_all(self, topic: object, values: object) -> object:
        if self._serializer is None or not isinstance(values, list | tuple):
            return values
        return [self.serialize(topic, v) for v in values]

    async def send(
        self,
        topic: str,
        value: object,
        *,
        key: object = None,
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
        future = self.send_nowait_checked(
            *check_send(
                topic,
                self.serialize(topic, value),
                self.serialize_key(topic, key),
                tag,
                keys,
                headers,
                queue,
                timestamp,
            ),
            due_ms=due_ms_of(delay, deliver_at),
        )
        return await future

    async def send_nowait(
        self,
        topic: str,
        value: object,
        *,
        key: object = None,
        tag: str | None = None,
        keys: Sequence[str] = (),
        headers: Mapping[str, bytes] | None = None,
        queue: int | None = None,
        timestamp: datetime | float | None = None,
        delay: Delay = None,
        deliver_at: DeliverAt = None,
    ) -> asyncio.Future[Receipt]:
        """Queue one message and return a future of its receipt (sends batch up). Sends
        to one queue are stored in the order of the calls, whatever their path."""
        return self.send_nowait_checked(
            *check_send(
                topic,
                self.serialize(topic, value),
                self.serialize_key(topic, key),
                tag,
                keys,
                headers,
                queue,
                timestamp,
            ),
            due_ms=due_ms_of(delay, deliver_at),
        )

    def send_nowait_checked(
        self,
        topic: str,
        record: MessageRecord,
        key: bytes | None,
        queue: int | None,
        *,
        due_ms: int = 0,
    ) -> asyncio.Future[Receipt]:
        """`send_nowait` of a message already checked (by `build_record`)."""
        future: asyncio.Future[Receipt] = asyncio.get_running_loop().create_future()
        self.start_send(future, topic, record, key, queue, due_ms)
        return future

    def start_send(  # noqa: PLR0917 - call_soon_threadsafe passes no keywords
        self,
        sink: ReceiptFuture,
        topic: str,
        record: MessageRecord,
        key: bytes | None,
        queue: int | None,
        due_ms: int = 0,
    ) -> None:
        """Send a checked message, completing `sink`: called on this producer's loop (by
        the sync `Producer` through `call_soon`, with no task)."""
        if isinstance(sink, concurrent.futures.Future) and not sink.set_running_or_notify_cancel():
            return  # cancelled before it started: nothing was sent
        if self._closed:
            _fail(sink, RuntimeError("the producer is closed"))
            return
        if due_ms:
            whole: concurrent.futures.Future[Sequence[Receipt]] = concurrent.futures.Future()
            whole.set_running_or_notify_cancel()
            whole.add_done_callback(lambda f: _first_receipt(f, sink))
            self._start_special(whole, topic, [record], key, queue, Special(deliver_at_ms=due_ms))
            return
        self._submit(
            topic,
            key,
            queue,
            lambda q: self._deliver_record(topic, q, record, sink),
            lambda exc: _fail(sink, exc),
        )

    async def send_batch(
        self,
        topic: str,
        values: Sequence[object],
        *,
        keys: Sequence[object] | None = None,
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
        future = await self.send_batch_nowait(
            topic, values, keys=keys, tags=tags, headers=headers, queue=queue,
            timestamp=timestamp, delay=delay, deliver_at=deliver_at,
        )  # fmt: skip
        return await future

    async def send_batch_nowait(
        self,
        topic: str,
        values: Sequence[object],
        *,
        keys: Sequence[object] | None = None,
        tags: Sequence[str | None] | None = None,
        headers: Mapping[str, bytes] | None = None,
        queue: int | None = None,
        timestamp: datetime | float | None = None,
        delay: Delay = None,
        deliver_at: DeliverAt = None,
    ) -> BatchFuture:
        """Queue one end-to-end batch; returns a future of its receipts."""
        future: BatchFuture = asyncio.get_running_loop().create_future()
        self.start_send_batch(
            future,
            *self.check_batch(topic, values, keys, tags, headers, queue, timestamp),
            due_ms=due_ms_of(delay, deliver_at),
        )
        return future

    def check_batch(  # noqa: PLR0917 - mirrors send_batch()'s arguments one to one
        self,
        topic: object,
        values: object,
        keys: object,
        tags: object,
        headers: object,
        queue: object,
        timestamp: object,
    ) -> tuple[str, bytes, int, bytes | None, int | None]:
        """`send_batch`'s arguments checked and encoded: (topic, payload, count, first
        key, queue). Raises at the call for a wrong argument or a batch too large."""
        values = self._serialize_all(topic, values)
        keys = self._serialize_keys(topic, keys)
        topic = checks.check_readable_topic(topic)
        checked_queue = checks.check_queue(queue)
        out_values, out_keys, out_tags, hdr = batch_columns(values, keys, tags, headers)
        payload = encode_values(
            out_values,
            timestamp_ms=checks.timestamp_ms(timestamp),
            keys=out_keys,
            tags=out_tags,
            headers=hdr,
            codec=self._config.codec,
            max_batch_bytes=self._config.max_request_bytes,
        )
        first_key = out_keys[0] if out_keys else None
        return topic, payload, len(out_values), first_key, checked_queue

    def start_send_batch(  # noqa: PLR0917 - call_soon_threadsafe passes no keywords
        self,
        sink: WholeFuture,
        topic: str,
        payload: bytes,
        count: int,
        key: bytes | None,
        queue: int | None,
        due_ms: int = 0,
    ) -> None:
        """Send a batch checked by `check_batch`, completing `sink` (on this loop)."""
        if isinstance(sink, concurrent.futures.Future) and not sink.set_running_or_notify_cancel():
            return
        if self._closed:
            _fail(sink, RuntimeError("the producer is closed"))
            return
        special = Special(deliver_at_ms=due_ms) if due_ms else None
        self._submit(
            topic,
            key,
            queue,
            lambda q: self._deliver_batch(topic, q, payload, count, sink, special),
            lambda exc: _fail(sink, exc),
        )

    async def send_special(
        self,
        topic: str,
        records: list[MessageRecord],
        *,
        key: bytes | None = None,
        queue: int | None = None,
        special: Special,
    ) -> Sequence[Receipt]:
        """Send checked records as one delayed or transactional batch, in order with every
        other send to its queue (`TransactionProducer` stages its messages this way)."""
        future: BatchFuture = asyncio.get_running_loop().create_future()
        self._check_open()
        self._start_special(future, topic, records, key, queue, special)
        return await future

    def _start_special(  # noqa: PLR0917
        self,
        sink: WholeFuture,
        topic: str,
        records: list[MessageRecord],
        key: bytes | None,
        queue: int | None,
        special: Special,
    ) -> None:
        try:
            payload = encode_batch(
                records, codec=self._config.codec, max_batch_bytes=self._config.max_request_bytes
            )
        except Exception as exc:
            _fail(sink, exc)
            return
        self._submit(
            topic,
            key,
            queue,
            lambda q: self._deliver_batch(topic, q, payload, len(records), sink, special),
            lambda exc: _fail(sink, exc),
        )

    async def cancel(self, message_id: str) -> CancelResult:
        """Cancel a delayed message before its delivery, by the id its receipt carries. A
        delayed `send_batch` is one unit: cancelling any of its ids cancels the batch.
        Raises AlreadyDelivered after delivery (or a second cancel), UnknownMessage for an
        id no broker scheduled."""
        self._check_open()
        if not isinstance(message_id, str) or not message_id:
            raise TypeError(f"message_id must be a non-empty str, got {message_id!r}")
        routes = await self._cluster.refresh_routes()
        addresses = sorted(set(routes.brokers.values())) or [await self._cluster.any_broker()]
        refusals: list[TidemqError] = []
        for address in addresses:
            # Every broker is asked: the one it was sent to answers "already delivered" for a
            # batch it handed over with a static queue, which the broker holding it now
            # cancels (an id names one schedule in the cluster, so at most one succeeds).
            try:
                answer = await self._cluster.call(
                    address, CancelDelayedRequest(message_id=message_id), CancelDelayedResponse
                )
            except (AlreadyDelivered, UnknownMessage, QueueMoved) as exc:
                refusals.append(exc)
            else:
                return cancel_result_from_wire(answer)
        for kind in (QueueMoved, AlreadyDelivered):
            found = next((e for e in refusals if isinstance(e, kind)), None)
            if found is not None:
                raise found
        reasons = list(dict.fromkeys(str(e) for e in refusals))
        if len(reasons) == 1:
            raise refusals[0]
        raise UnknownMessage("; ".join(reasons))

    async def flush(self) -> None:
        """Send everything accumulated and wait until every send is answered."""
        await self._route_wait.wait_all()
        self._accumulator.seal_all()
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

    # ------------------------------------------------------------------ the sync fast path

    def direct_target(
        self, topic: str, key: bytes | None, queue: int | None
    ) -> tuple[int, str] | None:
        """(queue, broker address) for a send made now, from routes trusted without a
        lookup; None when the send must go through the loop (a route to look up, sends
        waiting for one, no broker for the queue). Safe from another thread: it reads the
        loop's state, changing nothing but the round-robin counter."""
        if self._closed or self._route_wait.waiting(topic):
            return None
        q = self._queue_now(topic, key, queue, peek=True)
        if q is None:
            return None
        address = self._cluster.peek_routes().broker_for(topic, q)
        return None if address is None else (q, address)

    def broker_at(self, address: str) -> str:
        """The name of the broker serving at `address`, by the routes known now."""
        return self._ctx.broker_at(address)

    def resend_stamped_threadsafe(  # noqa: PLR0917
        self,
        sink: concurrent.futures.Future[Receipt],
        topic: str,
        queue: int,
        payload: bytes,
        stamp: Stamp,
        deadline: float,
    ) -> None:
        """From another thread: hand one message written with `stamp` and not answered to
        the queue's sender, which resends it under that stamp (so the broker answers a
        copy it stored with its first offset) or fails it, completing `sink`."""
        call_soon(self._resend_stamped, sink, topic, queue, payload, stamp, deadline)

    def _resend_stamped(  # noqa: PLR0917
        self,
        sink: concurrent.futures.Future[Receipt],
        topic: str,
        queue: int,
        payload: bytes,
        stamp: Stamp,
        deadline: float,
    ) -> None:
        if not sink.set_running_or_notify_cancel():
            return
        self._accumulator.seal(topic, queue)
        batch = Batch(topic, queue, payload, 1, [sink], None, deadline, stamp)
        self._sender(topic, queue).add(batch)

    # ------------------------------------------------------------------ to its queue, in order

    def _submit(
        self,
        topic: str,
        key: bytes | None,
        queue: int | None,
        deliver: Callable[[int], None],
        fail: Callable[[BaseException], None],
    ) -> None:
        """Hand a send to its queue now if its route is known and no earlier send to the
        topic waits for it; else it waits in the topic's line."""
        if not self._route_wait.waiting(topic):
            q = self._queue_now(topic, key, queue)
            if q is not None:
                deliver(q)
                return
        self._route_wait.add(
            topic, WaitingSend(key, queue, deliver, fail, self._ctx.new_deadline())
        )

    def _queue_now(
        self, topic: str, key: bytes | None, queue: int | None, *, peek: bool = False
    ) -> int | None:
        """The send's queue from routes checked less than `ROUTES_RECHECK_S` ago; None
        when that needs a route lookup. `peek`: from another thread (the routes as they
        are, without checking the connections, which only the loop may do)."""
        if queue is not None and not peek:
            return queue
        if not self._ctx.routes_trusted():
            return None
        routes = self._cluster.peek_routes() if peek else self._cluster.routes
        if queue is not None:
            return queue  # (peek: the caller finds its broker in these routes)
        if topic not in routes:
            return None
        try:
            return routes.select_queue(topic, key, self._route_wait.next_round_robin())
        except TidemqError:
            return None  # no live broker for it now: the line retries

    def _deliver_record(
        self, topic: str, queue: int, record: MessageRecord, future: ReceiptFuture
    ) -> None:
        try:
            if not self._send_direct(topic, queue, record, future):
                self._accumulator.add(topic, queue, record, future)
        except Exception as exc:  # e.g. too large to encode: this message fails alone
            _fail(future, exc)

    def _deliver_batch(  # noqa: PLR0917
        self,
        topic: str,
        queue: int,
        payload: bytes,
        count: int,
        sink: WholeFuture,
        special: Special | None,
    ) -> None:
        self._accumulator.seal(topic, queue)  # what was accumulated for it goes first
        batch = Batch(
            topic, queue, payload, count, None, sink, self._ctx.new_deadline(), special=special
        )
        self._sender(topic, queue).add(batch)

    def _send_direct(
        self, topic: str, queue: int, record: MessageRecord, future: ReceiptFuture
    ) -> bool:
        """The fast path (see the module's docstring): True if the message left, its
        receipt to come in `future`; False if it must go through the accumulator."""
        config = self._config
        if config.linger_ms > 0 or config.acks_none or self._accumulator.holds(topic, queue):
            return False
        if not self._ctx.routes_trusted():
            return False
        # A queue's first send too: its sender takes the connection and producer id this
        # producer holds for the queue's broker (QueueSender._adopt_known_connection), or
        # declines and the accumulator's path looks them up.
        return self._sender(topic, queue).send_direct(record, future)

    def _sender(self, topic: str, queue: int) -> QueueSender:
        sender = self._senders.get((topic, queue))
        if sender is None:
            sender = self._senders[(topic, queue)] = QueueSender(self._ctx, topic, queue)
        return sender


def _fail(future: Any, error: BaseException) -> None:
    if not future.done():
        future.set_exception(error)


def _first_receipt(
    whole: concurrent.futures.Future[Sequence[Receipt]], sink: ReceiptFuture
) -> None:
    if sink.done():
        return
    if (exc := whole.exception()) is not None:
        sink.set_exception(exc)
    else:
        sink.set_result(whole.result()[0])
