"""Moving pop messages out of their leases: to the group's retry topic (a nack on a plain
topic, through the timer service), to its dead-letter topic (attempts used up), or
suspended with the broker until an operator's `resume` (`pop_service` tells the story).
Retries and dead letters are their own marks: each record names the lease it finishes.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
from collections.abc import Awaitable, Callable
from typing import Final

from tidemq.broker.long_polling import LongPolling
from tidemq.broker.pop_lease_book import LeaseBook
from tidemq.broker.pop_leases import MOVING, SUSPENDED, Lease, PopOp, PopQueue
from tidemq.broker.pop_reads import PopReader
from tidemq.broker.store_gateway import StoreGateway
from tidemq.core.batch import MessageRecord, encode_batch
from tidemq.core.clock import Clock
from tidemq.core.errors import InvalidRequest
from tidemq.core.message import parse_message_id, topic_hash
from tidemq.core.properties import SystemProperties, encode_properties
from tidemq.core.record import RecordFlags
from tidemq.core.retry_headers import (
    RETRY_ATTEMPTS_HEADER,
    RETRY_ERROR_HEADER,
    RETRY_HEADER_PREFIX,
    RETRY_ID_HEADER,
    RETRY_OFFSET_HEADER,
    RETRY_ORIGIN_HEADER,
    RETRY_PREFIX,
    RETRY_QUEUE_HEADER,
    RETRY_TOPIC_HEADER,
    format_retry_origin,
    retry_topic,
)
from tidemq.protocol.commands import PopResumeResponse

__all__ = ["EXHAUSTED_ACTIONS", "RESUME_ACTIONS", "PopMoves", "Scheduler", "dlq_topic"]

#: The pop service's one logger, as before it was split (operators filter by its name).
log = logging.getLogger("tidemq.broker.pop_service")

EXHAUSTED_ACTIONS: Final = ("dead-letter", "suspend")
RESUME_ACTIONS: Final = ("retry", "dead-letter")
#: schedule(target topic, queue, payload, deliver-at ms, the lease it finishes)
Scheduler = Callable[[str, int, bytes, int, tuple[str, str, int, int]], Awaitable[object]]


def dlq_topic(group: str) -> str:
    return f"%DLQ%{group}"


class PopMoves:
    """Retries, dead letters, suspensions and resumes of one broker's pop service (on its
    loop)."""

    def __init__(
        self,
        book: LeaseBook,
        reader: PopReader,
        gateway: StoreGateway,
        *,
        polling: LongPolling,
        clock: Clock,
        ensure_topic: Callable[[str], Awaitable[None]],
        schedule: Scheduler,
        logical_offset: Callable[[str, int, int], int],
    ) -> None:
        self._book = book
        self._reader = reader
        self._gateway = gateway
        self._polling = polling
        self._clock = clock
        self._ensure_topic = ensure_topic
        self._schedule = schedule
        self._logical_offset = logical_offset

    async def dead_letter(
        self, group: str, topic: str, queue: int, table: PopQueue, offsets: list[int]
    ) -> None:
        """Move messages that used up their attempts to the group's dead-letter topic.
        Each dead letter names the lease it finishes (FROM_POP), so it is its own mark: a
        crash after it is durable cannot dead-letter the message twice."""
        store = self._gateway.store
        dlq = dlq_topic(group)
        await self._ensure_topic(dlq)
        items: list[tuple[str, int, bytes | memoryview, bytes, int]] = []
        moving: list[int] = []
        for offset in offsets:
            found = await self._reader.message_at(topic, queue, offset)
            if found is None:
                continue
            m, _ = found
            lease = table.leases.get(offset)
            origin = self._reader.first_stored(topic, queue, offset, found)
            extra = (
                ("tidemq.dlq.topic", origin.topic.encode()),
                ("tidemq.dlq.queue", str(origin.queue).encode()),
                ("tidemq.dlq.offset", str(origin.offset).encode()),
                ("tidemq.dlq.message_id", origin.message_id.encode()),
                ("tidemq.dlq.attempts", str(lease.attempt if lease else 0).encode()),
                ("tidemq.dlq.error", (lease.error if lease else "").encode()),
            )
            headers = tuple(h for h in m.headers if not h[0].startswith(RETRY_HEADER_PREFIX))
            record = MessageRecord(m.value, m.key, m.tag, m.keys, headers + extra, m.timestamp_ms)
            props = SystemProperties(pg=group, pt=topic, pq=queue, po=offset)
            items.append(
                (dlq, 0, encode_batch([record]), encode_properties(props), RecordFlags.FROM_POP)
            )
            moving.append(offset)
        with self._book.in_flight.writing(store):
            results, error = await self._gateway.append_many(items)
            done = moving[: len(results)]
            if done:
                self._book.apply(PopOp("dlq", group, topic, queue, done))  # the records are the log
        if done:
            log.info("moved %d messages of %s/%d to %s", len(done), topic, queue, dlq)
        if error is not None:
            raise error

    async def suspend(
        self, group: str, topic: str, queue: int, offsets: list[int], *, error: str = ""
    ) -> None:
        # Fresh epochs: the consumer's handles are stale from here on, so only `resume`
        # (an operator's decision) brings a suspended message back.
        epochs = [self._book.next_epoch() for _ in offsets]
        op = PopOp("suspend", group, topic, queue, offsets, epochs, error=error)
        self._book.apply(op)
        await self._book.log(op)
        log.warning(
            "suspended %d message(s) of %s/%d for group %s after their last attempt",
            len(offsets),
            topic,
            queue,
            group,
        )

    async def resume(self, group: str, message_id_text: str, action: str) -> PopResumeResponse:
        """Resume a suspended message: deliver it again with a fresh count of attempts
        ("retry"), or move it to the dead-letter topic now ("dead-letter")."""
        if action not in RESUME_ACTIONS:
            raise InvalidRequest(
                f"action must be one of {', '.join(RESUME_ACTIONS)}, got {action!r}"
            )
        try:
            wanted_hash, queue, offset = parse_message_id(message_id_text)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        for (g, topic, q), table in self._book.tables.items():
            if g != group:
                continue
            at = offset
            ours = q == queue and topic_hash(topic) == wanted_hash
            if not ours and not topic.startswith(RETRY_PREFIX):
                continue
            if not ours or self._logical_offset(topic, q, offset) != offset:
                # A retried message is known by the id it had before its first retry; a
                # static topic's by its logical offset.
                at = next(
                    (
                        o
                        for o, ls in table.leases.items()
                        if ls.deadline == SUSPENDED
                        and self._reader.display_id(topic, q, o) == message_id_text
                    ),
                    -1,
                )
            lease = table.leases.get(at)
            if lease is None or lease.deadline != SUSPENDED:
                continue
            if action == "retry":
                op = PopOp("resume", group, topic, queue, [at], [self._book.next_epoch()])
                self._book.apply(op)
                await self._book.log(op)
            else:
                await self.dead_letter(group, topic, queue, table, [at])
            self._polling.notify({(topic, queue)})
            return PopResumeResponse(topic=topic, queue=queue, offset=at, action=action)
        raise InvalidRequest(f"no suspended message {message_id_text} for group {group!r}")

    async def retry(
        self,
        group: str,
        table: PopQueue,
        where: tuple[str, int, int],
        lease: Lease,
        delay_ms: int,
    ) -> None:
        """Move a message to `%RETRY%<group>`, due in `delay_ms`: one timer schedule record
        that names the lease it finishes. Until it is durable the lease is parked (no
        receive takes it, every handle of it is stale); if the write fails it is due now."""
        topic, queue, offset = where
        store = self._gateway.store
        found = await self._reader.message_at(topic, queue, offset)
        if found is None:
            raise InvalidRequest(f"{topic}/{queue} offset {offset} is no longer stored")
        m, _ = found
        origin = self._reader.first_stored(topic, queue, offset, found)
        headers = tuple(h for h in m.headers if not h[0].startswith(RETRY_HEADER_PREFIX))
        headers += (
            (RETRY_TOPIC_HEADER, origin.topic.encode()),
            (RETRY_QUEUE_HEADER, str(origin.queue).encode()),
            (RETRY_OFFSET_HEADER, str(origin.offset).encode()),
            (RETRY_ID_HEADER, origin.message_id.encode()),
            (RETRY_ATTEMPTS_HEADER, str(lease.attempt).encode()),
            (RETRY_ERROR_HEADER, lease.error.encode()),
        )
        if origin.id_origin is not None:
            headers += ((RETRY_ORIGIN_HEADER, format_retry_origin(origin.id_origin).encode()),)
        payload = encode_batch(
            [MessageRecord(m.value, m.key, m.tag, m.keys, headers, m.timestamp_ms)]
        )
        target = retry_topic(group)
        await self._ensure_topic(target)
        key = (group, topic, queue, offset)
        lease.deadline, lease.epoch = MOVING, self._book.next_epoch()
        due = self._clock.now_ms() + delay_ms

        async def move() -> None:
            with self._book.in_flight.writing(store):
                try:
                    await self._schedule(target, 0, payload, due, key)
                except BaseException:
                    lease.deadline = self._clock.now_ms()  # not moved: deliver it again here
                    heapq.heappush(table.expiry, (lease.deadline, offset, lease.epoch))
                    raise
                self._book.finish_moved(group, topic, queue, offset, retried=True)

        # Once the record is written the move must finish even if this request is
        # cancelled (its connection closed): shielded, and its outcome always retrieved.
        task = asyncio.ensure_future(move())
        task.add_done_callback(_retrieve)
        await asyncio.shield(task)


def _retrieve(task: asyncio.Future[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.debug("a move to the retry topic failed: %s", task.exception())
