"""A pop receive: check the request, then lease messages from the subscribed queues (due
redeliveries first, then new ones), parking until some arrive or the wait ends. The
leases of every queue are made durable in one record before the answer."""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from typing import Final

from tidemq.broker.config import BrokerConfig
from tidemq.broker.filters import compile_filter
from tidemq.broker.groups import check_group_name
from tidemq.broker.long_polling import LongPolling
from tidemq.broker.pop_lease_book import LeaseBook
from tidemq.broker.pop_leases import PopOp, encode_handle, push_back, take_due
from tidemq.broker.pop_moves import EXHAUSTED_ACTIONS, PopMoves
from tidemq.broker.pop_reads import (
    NO_LIMIT,
    PopReader,
    Taken,
    earlier_attempts,
    offsets_in,
    queue_reader,
    take_new,
)
from tidemq.broker.store_gateway import StoreGateway
from tidemq.core import names
from tidemq.core.clock import Clock
from tidemq.core.errors import InvalidRequest, TidemqError, TopicNotFound
from tidemq.core.filters import Sql92Filter, TagExpression
from tidemq.core.retry_headers import RETRY_PREFIX, retry_topic
from tidemq.protocol.commands import (
    PoppedMessage,
    PopReceiveRequest,
    PopReceiveResponse,
    PopRecord,
    PopSubscription,
)

__all__ = ["PopReceiver"]

#: The retry topic's filter: its messages passed a subscription's when first delivered.
_ALL: Final = compile_filter("tag", "*")


class PopReceiver:
    """Serves one broker's pop receives (on its loop)."""

    def __init__(
        self,
        config: BrokerConfig,
        book: LeaseBook,
        reader: PopReader,
        moves: PopMoves,
        gateway: StoreGateway,
        *,
        polling: LongPolling,
        clock: Clock,
        queues_of: Callable[[str], list[int]],
        is_fifo: Callable[[str], bool],
        pop_limit: Callable[[str, str, int], int | None],
    ) -> None:
        self._config = config
        self._book = book
        self._reader = reader
        self._moves = moves
        self._gateway = gateway
        self._polling = polling
        self._clock = clock
        self._queues_of = queues_of
        self._is_fifo = is_fifo
        self._pop_limit = pop_limit
        self._rr = 0

    async def receive(self, req: PopReceiveRequest) -> tuple[PopReceiveResponse, bytes]:
        cfg = self._config
        _check_group(req.group)
        if not 1 <= req.max_messages <= cfg.pop_max_messages:
            raise InvalidRequest(f"max_messages must be 1..{cfg.pop_max_messages}")
        if not cfg.pop_min_invisible_ms <= req.invisible_ms <= cfg.pop_max_invisible_ms:
            raise InvalidRequest(
                f"invisible duration must be {cfg.pop_min_invisible_ms / 1000:g} s to "
                f"{cfg.pop_max_invisible_ms / 1000:g} s, got {req.invisible_ms / 1000:g} s"
            )
        if not 1 <= req.max_attempts <= cfg.pop_max_attempts_limit:
            raise InvalidRequest(f"max_attempts must be 1..{cfg.pop_max_attempts_limit}")
        if req.on_exhausted not in EXHAUSTED_ACTIONS:
            raise InvalidRequest(
                f"on_exhausted must be one of {', '.join(EXHAUSTED_ACTIONS)}, "
                f"got {req.on_exhausted!r}"
            )
        if not 0 <= req.max_wait_ms <= cfg.max_fetch_wait_ms:
            raise InvalidRequest(f"max_wait_ms must be 0..{cfg.max_fetch_wait_ms}")
        if not req.subscriptions:
            raise InvalidRequest("a receive needs at least one subscription")
        queues = self._subscribed_queues(req.group, req.subscriptions)
        deadline = time.monotonic() + req.max_wait_ms / 1000
        while True:
            seen = {(t, q): self._polling.version((t, q)) for t, q, _ in queues}
            response, body = await self._receive_once(req, queues)
            if response.messages:
                return response, body
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return response, body
            # Wake for new data, or when the earliest lease of these queues runs out.
            wait = min(remaining, self._next_expiry_s(req.group, queues))
            await self._polling.wait_any(seen, wait)

    def _subscribed_queues(
        self, group: str, subscriptions: list[PopSubscription]
    ) -> list[tuple[str, int, TagExpression | Sql92Filter]]:
        """The queues a receive takes from: the subscribed topics' queues on this broker,
        and the group's retry topic once it exists (its messages passed a subscription's
        filter when first delivered, so they are not filtered again)."""
        out = []
        for sub in subscriptions:
            flt = compile_filter(sub.kind, sub.expression)
            for q in self._queues_of(sub.topic):
                out.append((sub.topic, q, flt))
        try:
            retry_queues = self._queues_of(retry_topic(group))
        except TopicNotFound:
            retry_queues = []
        out.extend((retry_topic(group), q, _ALL) for q in retry_queues)
        return out

    def _next_expiry_s(
        self, group: str, queues: list[tuple[str, int, TagExpression | Sql92Filter]]
    ) -> float:
        now = self._clock.now_ms()
        soonest = 1.0
        for topic, q, _ in queues:
            table = self._book.tables.get((group, topic, q))
            if table is not None and table.expiry:
                soonest = min(soonest, max(0.0, (table.expiry[0][0] - now) / 1000))
        return max(soonest, 0.005)

    async def _receive_once(
        self, req: PopReceiveRequest, queues: list[tuple[str, int, TagExpression | Sql92Filter]]
    ) -> tuple[PopReceiveResponse, bytes]:
        want = req.max_messages
        records: list[PopRecord] = []
        bodies: list[bytes] = []
        messages: list[PoppedMessage] = []
        n = len(queues)
        self._rr += 1
        ops: list[PopOp] = []
        for i in range(n):
            if len(messages) >= want:
                break
            topic, q, flt = queues[(self._rr + i) % n]
            got, popped, op = await self._receive_queue(req, topic, q, flt, want - len(messages))
            for record in got:
                records.append(PopRecord(topic=topic, queue=q, size=len(record)))
                bodies.append(record)
            messages.extend(popped)
            if op is not None:
                ops.append(op)
        try:
            await self._book.log_many(ops)  # one flush makes every queue's leases durable
        except TidemqError:
            for op in ops:  # not durable: hand them out again at once
                table = self._book.tables[(op.group, op.topic, op.queue)]
                for offset in op.offsets:
                    lease = table.leases.get(offset)
                    if lease is not None:
                        lease.deadline = 0
                        heapq.heappush(table.expiry, (0, offset, lease.epoch))
            raise
        return PopReceiveResponse(records=records, messages=messages), b"".join(bodies)

    async def _receive_queue(
        self,
        req: PopReceiveRequest,
        topic: str,
        queue: int,
        flt: TagExpression | Sql92Filter,
        want: int,
    ) -> tuple[list[bytes], list[PoppedMessage], PopOp | None]:
        """Lease up to `want` messages of one queue: due redeliveries first, then new
        ones. Returns the records holding them, the leases, and the operation to log
        (applied already; the caller makes it durable before answering)."""
        store = self._gateway.store
        table = self._book.table(req.group, topic, queue)
        now = self._clock.now_ms()
        chosen, exhausted = take_due(table, want, req.max_attempts, now)
        if exhausted:
            # Dead-letter (or suspend) first (a dead letter may free the next message of a
            # FIFO group), with the entries taken so far back in the heap meanwhile.
            push_back(table, [o for o, _ in chosen])
            try:
                if req.on_exhausted == "suspend":
                    await self._moves.suspend(req.group, topic, queue, exhausted)
                else:
                    await self._moves.dead_letter(req.group, topic, queue, table, exhausted)
            except BaseException:
                push_back(table, exhausted)
                raise
            chosen, later = take_due(table, want, req.max_attempts, now)
            push_back(table, later)  # beyond the scan limit: dead-lettered by a later receive
        taken = Taken(chosen, [""] * len(chosen))
        start_next = table.next_offset
        fifo = self._is_fifo(topic)
        limit = self._pop_limit(req.group, topic, queue) if fifo else None
        first = await self._reader.read_tier_first(topic, queue, table.next_offset, flt)
        records, next_offset = take_new(
            store,
            topic,
            queue,
            read=queue_reader(store, topic, queue, first, tiered=self._reader.tier is not None),
            flt=flt,
            next_offset=table.next_offset,
            taken=taken,
            want=want,
            fifo_table=table if fifo else None,
            limit=NO_LIMIT if limit is None else limit,  # 0 is a limit
        )
        if not chosen and next_offset == start_next:
            return [], [], None
        if topic.startswith(RETRY_PREFIX):
            # A retried message goes on counting the deliveries it had before its retry.
            chosen = [
                (o, a + earlier_attempts(records, o) if o >= start_next else a) for o, a in chosen
            ]
        deadline = now + req.invisible_ms
        epochs = [self._book.next_epoch() for _ in chosen]
        op = PopOp(
            "lease",
            req.group,
            topic,
            queue,
            [o for o, _ in chosen],
            epochs,
            [a for _, a in chosen],
            deadline,
            next_offset,
            groups=taken.groups if fifo else [],
            held=taken.held,
            held_groups=taken.held_groups,
        )
        self._book.apply(op)
        for offset, _ in chosen:
            if not any(offset in offsets_in(r) for r in records.values()):
                found = await self._reader.read_one(topic, queue, offset)
                if found is not None:
                    records[found.base_offset] = found.record
        popped = [
            PoppedMessage(
                topic=topic,
                queue=queue,
                offset=offset,
                attempt=attempt,
                handle=encode_handle(topic, queue, offset, epoch),
                deadline_ms=deadline,
            )
            for (offset, attempt), epoch in zip(chosen, epochs, strict=True)
        ]
        return [r for _, r in sorted(records.items())], popped, op


def _check_group(group: str) -> None:
    # A pop group names its %RETRY%<group> and %DLQ%<group> topics: a user name only
    # (`tidemq.core.names`, the rule every group follows), never an internal one.
    check_group_name(group)
    problem = names.user_name_problem(group, group=True)
    if problem is not None:
        raise InvalidRequest(f"group name {group!r} {problem}; use {names.NAME_RULE}")
