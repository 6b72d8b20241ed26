"""Pop consumption (asyncio): `SimpleConsumer` leases messages; many consumers of one group
share every queue.

    consumer = SimpleConsumer(bootstrap, "jobs", {"orders": "paid || shipped"})
    for msg in await consumer.receive(32, invisible_duration=30.0):
        await msg.ack()  # or nack(delay=10.0), release(), change_invisible_duration(60.0)

A received message is invisible to the group's other consumers until it is acknowledged
or its invisible duration runs out; then it is delivered again with `delivery_attempt`
+ 1. A `nack` on a plain topic moves it to the group's retry topic `%RETRY%<group>`, due
after the delay; the consumers of the group receive it from there with the topic, id and
attempt count it had (its headers `tidemq.retry.*` say where it came from). On a FIFO
topic a nack keeps it in place, so its message group waits for it. After `max_attempts`
deliveries the broker moves it to the group's dead-letter topic `%DLQ%<group>`.
Subscriptions take a tag expression ("*", "a || b") or a `Sql92("...")`
filter over message headers and the tag; both are checked when the consumer is made (an
invalid one raises FilterSyntaxError with the column) and evaluated on the broker.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Self, cast

from tidemq.client import checks
from tidemq.client.cluster import ClientConfig, ClusterClient
from tidemq.client.fifo_progress import FifoProgress
from tidemq.client.stream_consumer import D
from tidemq.client.typed_values import deserialize_values
from tidemq.core import limits
from tidemq.core.errors import InvalidRequest, TidemqError
from tidemq.core.filters import Sql92
from tidemq.core.message import Message, V, messages_from_records
from tidemq.core.retry_headers import (
    RETRY_OFFSET_HEADER,
    RETRY_ORIGIN_HEADER,
    RETRY_PREFIX,
    RETRY_QUEUE_HEADER,
    RETRY_TOPIC_HEADER,
    parse_retry_origin,
)
from tidemq.protocol.commands import (
    Empty,
    PopAckRequest,
    PopAckResponse,
    PopChangeInvisibleRequest,
    PopChangeInvisibleResponse,
    PopNackRequest,
    PopReceiveRequest,
    PopReceiveResponse,
    PopSubscription,
)

__all__ = ["AsyncReceivedMessage", "AsyncSimpleConsumer", "Sql92"]

#: Limits of a receive, checked here for a clear error (the broker checks them too).
MIN_INVISIBLE_S = 1.0
MAX_INVISIBLE_S = 12 * 3600.0
#: Deliveries of one message at most (RocketMQ's maxReconsumeTimes is far below).
MAX_ATTEMPTS = 1000
#: What the broker may do with a message whose attempts are used up.
ON_EXHAUSTED = ("dead-letter", "suspend")
#: Acks coalesced into one request at most (the broker answers each one).
_ACKS_PER_REQUEST = 1024

log = logging.getLogger(__name__)


Filter = str | Sql92


@dataclass(frozen=True, slots=True)
class AsyncReceivedMessage(Message[V]):
    """A leased message: `Message` fields plus its delivery attempt and handle."""

    delivery_attempt: int = 1
    #: Opaque: names this lease. A newer lease of the same message makes it stale.
    handle: str = ""
    #: When the lease runs out (epoch ms), unless acked or changed.
    invisible_until_ms: int = 0
    _consumer: AsyncSimpleConsumer[Any] | None = field(default=None, repr=False, compare=False)
    _broker: str = field(default="", repr=False, compare=False)

    def _owner(self) -> AsyncSimpleConsumer[Any]:
        if self._consumer is None:
            raise InvalidRequest("this message was not received by a SimpleConsumer")
        return self._consumer

    async def ack(self) -> None:
        await self._owner().ack(self)

    async def nack(self, delay: float = 0.0, *, reason: str = "") -> None:
        await self._owner().nack(self, delay=delay, reason=reason)

    async def release(self) -> None:
        await self._owner().release(self)

    async def change_invisible_duration(self, duration: float) -> AsyncReceivedMessage[V]:
        return await self._owner().change_invisible_duration(self, duration)


def _as_first_stored(msg: Message) -> Message:
    """A message of a retry topic as it was first stored: its topic, queue, offset and id
    (from its `tidemq.retry.*` headers)."""
    h = dict(msg.headers)
    topic = h.get(RETRY_TOPIC_HEADER, b"").decode(errors="replace")
    queue = h.get(RETRY_QUEUE_HEADER, b"").decode(errors="replace")
    offset = h.get(RETRY_OFFSET_HEADER, b"").decode(errors="replace")
    if not topic or not queue.isdigit() or not offset.isdigit():
        return msg
    origin = parse_retry_origin(h.get(RETRY_ORIGIN_HEADER, b"").decode(errors="replace"))
    return dataclasses.replace(
        msg, topic=topic, queue=int(queue), offset=int(offset), origin=origin, deliver_at_ms=0
    )


def _subscriptions(subscriptions: object) -> list[PopSubscription]:
    """{topic: filter} as the broker takes it; FilterSyntaxError, with the column, here."""
    if subscriptions is None:
        raise ValueError("subscriptions are required: {topic: filter}, e.g. {'orders': '*'}")
    if not isinstance(subscriptions, Mapping):
        hint = ""
        if isinstance(subscriptions, str):
            hint = f": write {{{subscriptions!r}: '*'}}"
        elif isinstance(subscriptions, list | tuple | set | frozenset):
            hint = f": write {{topic: '*' for topic in {subscriptions!r}}}"
        raise TypeError(
            "subscriptions must be a dict of topic to filter (a tag expression such as "
            f"'*' or Sql92(...)), got {type(subscriptions).__name__}{hint}"
        )
    if not subscriptions:
        raise ValueError("subscriptions must name at least one topic: {topic: filter}")
    out = []
    for topic, flt in subscriptions.items():
        name = checks.check_readable_topic(topic, "subscriptions: topic")
        kind, expression = checks.check_filter(flt, f"subscriptions[{name!r}]")
        out.append(PopSubscription(topic=name, expression=expression, kind=kind))
    return out


def _ms(seconds: object, what: str, lo: float, hi: float) -> int:
    return round(checks.check_seconds(seconds, what, minimum=lo, maximum=hi) * 1000)


def _lease(msg: object, arg: str = "msg") -> AsyncReceivedMessage[Any]:
    if not isinstance(msg, AsyncReceivedMessage):
        raise TypeError(
            f"{arg} must be a message received by this consumer, got {type(msg).__name__}"
        )
    return msg


class AsyncSimpleConsumer(Generic[D]):
    def __init__(
        self,
        bootstrap: str = "127.0.0.1:9876",
        group: str = "",
        subscriptions: Mapping[str, Filter] | None = None,
        *,
        invisible_duration: float = 60.0,
        max_attempts: int = 16,
        on_exhausted: str = "dead-letter",
        await_duration: float = 5.0,
        client_config: ClientConfig | None = None,
        value_deserializer: Callable[[bytes], D] | None = None,
    ) -> None:
        """`await_duration`: how long `receive` waits on the broker for messages (long
        polling) before it returns an empty list. `on_exhausted`: what the broker does
        with a message after `max_attempts` deliveries: "dead-letter" (move it to
        `%DLQ%<group>`) or "suspend" (keep it, and on a FIFO topic its message group,
        until an operator resumes it: `Admin.resume`).

        `value_deserializer(data) -> value`: messages come with their values deserialized.
        A message it cannot turn is not handed out: it is nacked at once with the failure
        as its reason (logged), so it is delivered again and, failing every time, ends in
        the dead-letter topic (or suspended) after `max_attempts`."""
        self.group = checks.check_group_name(group)
        self._subs = _subscriptions(subscriptions)
        self._invisible_ms = _ms(
            invisible_duration, "invisible_duration", MIN_INVISIBLE_S, MAX_INVISIBLE_S
        )
        self._max_attempts = checks.check_int(
            max_attempts, "max_attempts", minimum=1, maximum=MAX_ATTEMPTS
        )
        if not isinstance(on_exhausted, str) or on_exhausted not in ON_EXHAUSTED:
            raise ValueError(
                f"on_exhausted must be one of {', '.join(ON_EXHAUSTED)}, got {on_exhausted!r}"
            )
        self._on_exhausted = on_exhausted
        self._wait_ms = _ms(await_duration, "await_duration", 0.0, 30.0)
        self._cluster = ClusterClient(bootstrap, client_config)
        self._rr = 0
        self._fifo = FifoProgress()
        self._pending_acks: dict[str, list[tuple[str, asyncio.Future[None]]]] = {}
        self._ack_flush_scheduled = False
        self._ack_tasks: set[asyncio.Task[None]] = set()
        self._closed = False
        if value_deserializer is not None and not callable(value_deserializer):
            raise TypeError(
                f"value_deserializer must be callable, got {type(value_deserializer).__name__}"
            )
        self._deserializer = value_deserializer

    @property
    def cluster(self) -> ClusterClient:
        return self._cluster

    async def _brokers(self) -> list[str]:
        routes = await self._cluster.refresh_routes()
        topics = [s.topic for s in self._subs]
        if any(t not in routes for t in topics):
            routes = await self._cluster.refresh_routes(force=True)
        addresses = {
            routes.broker_for(t, q) for t in topics if t in routes for q in routes.queues(t)
        }
        # A static topic's sealed links are popped on their own brokers too.
        for t in topics:
            chains = (
                [routes.chain(t, q) for q in range(routes.queue_count(t))] if t in routes else []
            )
            for chain in chains:
                if chain is not None:
                    addresses.update(routes.brokers.get(link.broker) for link in chain.links)

        found = sorted(a for a in addresses if a)
        if not found:
            missing = [t for t in topics if t not in routes]
            detail = f" (unknown: {missing})" if missing else ""
            raise TidemqError(f"no broker serves the subscribed topics{detail}")
        return found

    async def receive(
        self, max_messages: int = 16, invisible_duration: float | None = None
    ) -> list[AsyncReceivedMessage[D | None]]:
        """Lease up to `max_messages` messages (1 to MAX_RECEIVE_MESSAGES); waits up to
        `await_duration` for some."""
        max_messages = checks.check_int(
            max_messages, "max_messages", minimum=1, maximum=limits.MAX_RECEIVE_MESSAGES
        )
        if self._closed:
            raise TidemqError("the consumer is closed")
        invisible_ms = (
            self._invisible_ms
            if invisible_duration is None
            else _ms(invisible_duration, "invisible_duration", MIN_INVISIBLE_S, MAX_INVISIBLE_S)
        )
        brokers = await self._brokers()
        finished = self._fifo.finished(await self._cluster.refresh_routes())
        self._rr += 1
        per_broker = max(1, math.ceil(max_messages / len(brokers)))
        # The first broker (in turn) waits; the others answer at once with what they have.
        order = brokers[self._rr % len(brokers) :] + brokers[: self._rr % len(brokers)]
        results = await asyncio.gather(
            *(
                self._receive_from(
                    a, per_broker, invisible_ms, self._wait_ms if i == 0 else 0, finished
                )
                for i, a in enumerate(order)
            )
        )
        received = [m for batch in results for m in batch]
        if self._deserializer is None:
            return cast("list[AsyncReceivedMessage[D | None]]", received)
        return await self._deserialize(received, self._deserializer)

    async def _deserialize(
        self, received: list[AsyncReceivedMessage], deserializer: Callable[[bytes], D]
    ) -> list[AsyncReceivedMessage[D | None]]:
        typed, failed = deserialize_values(received, deserializer, per_queue=False)
        for exc in failed.values():
            raw = next(m for m in received if (m.topic, m.queue, m.offset) == exc.position)
            log.warning("%s; nacked (it ends in the dead-letter topic if it keeps failing)", exc)
            try:
                await self.nack(raw, reason=str(exc)[:200])
            except TidemqError as nack_error:  # its lease runs out instead
                log.warning("nacking %s failed: %s", raw.message_id, nack_error)
        return cast("list[AsyncReceivedMessage[D | None]]", typed)

    async def _receive_from(
        self,
        address: str,
        max_messages: int,
        invisible_ms: int,
        wait_ms: int,
        finished: list[tuple[str, int, int]],
    ) -> list[AsyncReceivedMessage]:
        req = PopReceiveRequest(
            group=self.group,
            subscriptions=self._subs,
            max_messages=max_messages,
            invisible_ms=invisible_ms,
            max_wait_ms=wait_ms,
            max_attempts=self._max_attempts,
            on_exhausted=self._on_exhausted,
            fifo_finished=finished,
        )
        timeout = self._cluster.config.request_timeout_ms + wait_ms
        try:
            resp, body = await self._cluster.request(
                address, req, PopReceiveResponse, timeout_ms=timeout
            )
        except TidemqError as exc:
            self._cluster.invalidate(exc)
            raise
        if resp.fifo_finished:
            self._fifo.record(await self._cluster.refresh_routes(), address, resp.fifo_finished)
        return self._messages(address, resp, body)

    def _messages(
        self, address: str, resp: PopReceiveResponse, body: bytes
    ) -> list[AsyncReceivedMessage]:
        decoded: dict[tuple[str, int, int], Message] = {}
        pos = 0
        for rec in resp.records:
            chunk = body[pos : pos + rec.size]
            pos += rec.size
            for m in messages_from_records(rec.topic, rec.queue, chunk, [rec.size], 0):
                decoded[(m.topic, m.queue, m.offset)] = m
        out: list[AsyncReceivedMessage] = []
        for p in resp.messages:
            got = decoded.get((p.topic, p.queue, p.offset))
            if got is None:
                raise TidemqError(
                    f"broker leased {p.topic}/{p.queue}@{p.offset} without its record"
                )
            if got.topic.startswith(RETRY_PREFIX):
                got = _as_first_stored(got)
            out.append(
                AsyncReceivedMessage(
                    got.topic,
                    got.queue,
                    got.offset,
                    got.value,
                    got.key,
                    got.tag,
                    got.keys,
                    got.headers,
                    got.timestamp_ms,
                    got.origin,
                    got.deliver_at_ms,
                    p.attempt,
                    p.handle,
                    p.deadline_ms,
                    self,
                    address,
                )
            )
        return out

    async def ack(self, msg: AsyncReceivedMessage[Any]) -> None:
        """Acknowledge: the message is done for the group. Raises for a stale or foreign
        handle (the lease ran out and the message went to another consumer).

        Acks made in the same event-loop turn (many handlers finishing together) travel
        as one request per broker, up to `_ACKS_PER_REQUEST`; each still gets its own
        answer."""
        msg = _lease(msg)
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._pending_acks.setdefault(msg._broker, []).append((msg.handle, future))
        if not self._ack_flush_scheduled:
            self._ack_flush_scheduled = True
            loop.call_soon(self._flush_acks)
        await future

    def _flush_acks(self) -> None:
        self._ack_flush_scheduled = False
        pending, self._pending_acks = self._pending_acks, {}
        for address, items in pending.items():
            for i in range(0, len(items), _ACKS_PER_REQUEST):
                task = asyncio.get_running_loop().create_task(
                    self._send_acks(address, items[i : i + _ACKS_PER_REQUEST])
                )
                self._ack_tasks.add(task)
                task.add_done_callback(self._ack_tasks.discard)

    async def _send_acks(self, address: str, items: list[tuple[str, asyncio.Future[None]]]) -> None:
        try:
            resp = await self._cluster.call(
                address,
                PopAckRequest(group=self.group, handles=[h for h, _ in items]),
                PopAckResponse,
            )
        except BaseException as exc:
            for _, future in items:
                if not future.done():
                    future.set_exception(exc)
            if not isinstance(exc, Exception):
                raise
            return
        for (_, future), error in zip(items, resp.errors, strict=True):
            if future.done():
                continue
            if error:
                future.set_exception(InvalidRequest(error))
            else:
                future.set_result(None)

    async def ack_many(self, messages: Sequence[AsyncReceivedMessage[Any]]) -> None:
        """Acknowledge several in one request per broker; raises for the first refused."""
        if not isinstance(messages, list | tuple):
            raise TypeError(f"messages must be a list of messages, got {type(messages).__name__}")
        messages = [_lease(m, f"messages[{i}]") for i, m in enumerate(messages)]
        by_broker: dict[str, list[AsyncReceivedMessage[Any]]] = {}
        for m in messages:
            by_broker.setdefault(m._broker, []).append(m)
        for address, msgs in by_broker.items():
            resp = await self._cluster.call(
                address,
                PopAckRequest(group=self.group, handles=[m.handle for m in msgs]),
                PopAckResponse,
            )
            refused = [e for e in resp.errors if e]
            if refused:
                raise InvalidRequest(refused[0])

    async def nack(
        self, msg: AsyncReceivedMessage[Any], *, delay: float = 0.0, reason: str = ""
    ) -> None:
        """Give it back, to be delivered again after `delay` seconds (this delivery counts
        as an attempt): through `%RETRY%<group>` on a plain topic, in place on a FIFO one.
        If this was its `max_attempts`-th delivery it goes to `%DLQ%<group>` now (or is
        suspended, with `on_exhausted="suspend"`)."""
        msg = _lease(msg)
        delay_ms = _ms(delay, "delay", 0.0, MAX_INVISIBLE_S)
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, got {type(reason).__name__}")
        await self._cluster.call(
            msg._broker,
            PopNackRequest(
                group=self.group,
                handle=msg.handle,
                delay_ms=delay_ms,
                reason=reason,
                max_attempts=self._max_attempts,
                on_exhausted=self._on_exhausted,
            ),
            Empty,
        )

    async def release(self, msg: AsyncReceivedMessage[Any]) -> None:
        """Give it back at once, without counting this delivery as an attempt."""
        msg = _lease(msg)
        await self._cluster.call(
            msg._broker, PopNackRequest(group=self.group, handle=msg.handle, release=True), Empty
        )

    async def change_invisible_duration(
        self, msg: AsyncReceivedMessage[V], duration: float
    ) -> AsyncReceivedMessage[V]:
        """Keep the lease for `duration` seconds from now; returns the message with its new
        handle (the old one becomes stale)."""
        msg = _lease(msg)
        ms = _ms(duration, "duration", MIN_INVISIBLE_S, MAX_INVISIBLE_S)
        resp = await self._cluster.call(
            msg._broker,
            PopChangeInvisibleRequest(group=self.group, handle=msg.handle, invisible_ms=ms),
            PopChangeInvisibleResponse,
        )
        return AsyncReceivedMessage(
            msg.topic, msg.queue, msg.offset, msg.value, msg.key, msg.tag, msg.keys, msg.headers,
            msg.timestamp_ms, msg.origin, msg.deliver_at_ms, msg.delivery_attempt, resp.handle,
            resp.deadline_ms,
            self, msg._broker,
        )  # fmt: skip

    async def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._ack_tasks:  # acks on their way finish first
                await asyncio.gather(*self._ack_tasks, return_exceptions=True)
            await self._cluster.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
