"""Delay/timer messages: schedule, deliver on time, cancel, rebuild after a restart.

A delayed batch is appended to the internal timer topic (`system_topics.TIMER_TOPIC`) with
its target and due time in the record's properties; its offset there is its id (the
messages' ids are computed from it, and stay the same after delivery). The in-memory
`TimerWheel` indexes pending schedules by due time; the wheel holds no payloads, only
offsets. At due time the batch is read back from the timer topic and appended, unchanged,
to its real topic with flag FROM_TIMER and properties naming its origin and due time.

Never early: an entry is delivered only once the broker's clock reaches its due time.
Late by at most the loop's reaction time plus, after a crash, the restart.

Durability and the restart: `timer_state`.

Ids: a batch's messages are named after the timer offset where it was scheduled, in a
timer topic qualified by this broker's name (`qualified_origin`), so two brokers' ids
never collide and a cancel reaches only the right schedule.

Static topics: a batch whose queue is sealed here is handed over to the queue's new write
end by the remap (`timer_handover`); it keeps its ids there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

from tidemq.broker.handover_book import QueueKey
from tidemq.broker.system_topics import (
    TIMER_TOPIC,
    control_payload,
    read_internal,
)
from tidemq.broker.timer_handover import TimerHandovers
from tidemq.broker.timer_state import Pending
from tidemq.core.errors import (
    AlreadyDelivered,
    DelayTooLong,
    QueueMoved,
    QueueNotFound,
    TidemqError,
    TopicNotFound,
    UnknownMessage,
)
from tidemq.core.message import parse_message_id
from tidemq.core.properties import (
    SystemProperties,
    encode_properties,
    qualified_origin,
)
from tidemq.core.record import RecordFlags
from tidemq.net.tasks import cancel_and_wait
from tidemq.protocol.commands import CancelDelayedResponse, TimerStatusResponse, TimerTopicStatus
from tidemq.store.message_store import AppendResult, MessageStore

__all__ = ["TimerService"]

log = logging.getLogger(__name__)

#: Deliveries appended per round (one fsync covers them all).
_DELIVERY_BATCH: Final = 512
#: After a failed delivery round (disk full, ...), wait this long before trying again.
_RETRY_DELAY_MS: Final = 1_000
#: The runner wakes at least this often even with nothing due (cheap: one wheel check).
_MAX_SLEEP_S: Final = 1.0


class TimerService(TimerHandovers):
    # ------------------------------------------------------------------ scheduling

    def check_due(self, deliver_at_ms: int) -> None:
        now = self._clock.now_ms()
        if deliver_at_ms - now > self._config.max_delay_ms:
            raise DelayTooLong(
                f"delivery time is {(deliver_at_ms - now) / 1000:.0f} s ahead; the maximum "
                f"delay is {self._config.max_delay_ms / 1000:.0f} s (broker.max_delay_ms)"
            )

    async def schedule(
        self,
        topic: str,
        queue: int,
        payload: bytes | memoryview,
        deliver_at_ms: int,
        *,
        finishes: tuple[str, str, int, int] | None = None,
    ) -> AppendResult:
        """Store a delayed batch; it is on the wheel once durable. A time in the past is
        delivered at once (it still goes through the timer topic). `finishes` names the pop
        lease (group, topic, queue, offset) a consumer retry moves here: the schedule
        record says so itself (FROM_POP), so the move is one write."""
        self.check_due(deliver_at_ms)
        props = SystemProperties(tt=topic, tq=queue, due=deliver_at_ms)
        flags = RecordFlags.DELAYED
        if finishes is not None:
            props.pg, props.pt, props.pq, props.po = finishes
            flags |= RecordFlags.FROM_POP
        key = (topic, queue)
        self._scheduling[key] = self._scheduling.get(key, 0) + 1
        try:
            result = await self._gateway.append(
                TIMER_TOPIC, 0, payload, properties=encode_properties(props), flags=flags
            )
            if not self._done.is_done(result.base_offset):
                entry = Pending(topic, queue, result.count, deliver_at_ms)
                self._add_pending(result.base_offset, entry)
                self._wheel.add(result.base_offset, deliver_at_ms)
                self._wake.set()
        finally:
            self._finish_scheduling(key)
        return result

    def is_pending(self, base_offset: int) -> bool:
        """Whether the timer-topic batch at `base_offset` is scheduled and not delivered
        or cancelled yet."""
        return base_offset in self._pending

    def topic_of(self, message_id: str) -> str | None:
        """The topic of the pending delayed batch `message_id` names here (None: none),
        for the authorization of its cancel."""
        try:
            topic_id, queue, offset = parse_message_id(message_id)
        except ValueError:
            return None
        if queue != 0:
            return None
        base = self._adopted_base(topic_id, offset)
        if base is None and topic_id in (self._timer_id, self._legacy_id):
            if offset < self._done.low:
                return None
            base = _batch_base(self._gateway.store, offset)
        entry = self._pending.get(base) if base is not None else None
        return entry.topic if entry is not None else None

    async def cancel(self, message_id: str) -> CancelDelayedResponse:
        try:
            topic_id, queue, offset = parse_message_id(message_id)
        except ValueError as exc:
            raise UnknownMessage(str(exc)) from None
        own = topic_id in (self._timer_id, self._legacy_id)
        # Adopted first: a batch sent here, handed over with its static queue and handed
        # back when the queue returned, is pending under a new offset here.
        base = self._adopted_base(topic_id, offset) if queue == 0 else None
        if base is None and (queue != 0 or not own):
            raise UnknownMessage(
                f"{message_id} is not the id of a delayed message held by {self._me}: only "
                "the ids that sending with delay= or deliver_at= returned can be cancelled"
            )
        if base is None:
            if offset < self._done.low:
                # Every offset below the low watermark is delivered, cancelled or handed
                # over, and the checkpoint may have trimmed its batch from the timer topic.
                raise AlreadyDelivered(
                    f"delayed message {message_id} was already delivered or cancelled"
                )
            base = await self._gateway.call(lambda s: _batch_base(s, offset))
        if base is None:
            raise UnknownMessage(f"no delayed message {message_id} on this broker")
        handoff_entry = self._pending.get(base)
        if handoff_entry is not None and self._book.reserved(
            (handoff_entry.topic, handoff_entry.queue), base
        ):
            raise QueueMoved(
                f"delayed message {message_id} is being handed over to broker "
                f"{self._book.handoffs[(handoff_entry.topic, handoff_entry.queue)].dest} with "
                "its static queue; cancel it again once the remap is done"
            )
        if base in self._delivering:
            # Its delivery is being written: cancelling now would answer "cancelled" for a
            # message that is about to be (or already is) in its topic.
            raise AlreadyDelivered(f"delayed message {message_id} is being delivered now")
        entry = self._drop_pending(base)
        if entry is None:
            raise AlreadyDelivered(
                f"delayed message {message_id} was already delivered or cancelled"
            )
        self._wheel.remove(base)
        props = encode_properties(SystemProperties(ref=base))
        try:
            result = await self._gateway.append(
                TIMER_TOPIC,
                0,
                control_payload(),
                properties=props,
                flags=RecordFlags.DELAYED | RecordFlags.CONTROL,
            )
        except BaseException:
            self._add_pending(base, entry)  # not cancelled: it stays scheduled
            self._wheel.add(base, entry.due_ms)
            raise
        self._done.mark(result.base_offset, result.count)
        self._done.mark(base, entry.count)
        self._cancelled += 1
        return CancelDelayedResponse(
            topic=entry.topic, deliver_at_ms=entry.due_ms, count=entry.count
        )

    def status(self, topic: str = "") -> TimerStatusResponse:
        by_topic: dict[str, TimerTopicStatus] = {}
        for entry in self._pending.values():
            if topic and entry.topic != topic:
                continue
            s = by_topic.get(entry.topic)
            if s is None:
                s = by_topic[entry.topic] = TimerTopicStatus(
                    topic=entry.topic, pending_batches=0, pending_messages=0, next_due_ms=0
                )
            s.pending_batches += 1
            s.pending_messages += entry.count
            if not s.next_due_ms or entry.due_ms < s.next_due_ms:
                s.next_due_ms = entry.due_ms
        return TimerStatusResponse(
            topics=sorted(by_topic.values(), key=lambda s: s.topic),
            precision_ms=self._config.timer_precision_ms,
            max_delay_ms=self._config.max_delay_ms,
            delivered_batches=self._delivered,
            cancelled_batches=self._cancelled,
        )

    # ------------------------------------------------------------------ delivery

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)

    async def _run(self) -> None:
        while True:
            now = self._clock.now_ms()
            due = self._wheel.advance(now)
            early = [(d, o) for d, o in due if d > now]
            if early:
                # Never early is the promise; the wheel keeps it, and this keeps it even if
                # the wheel did not: put such entries back rather than deliver them.
                log.error("timer wheel returned %d entries before their due time", len(early))
                for d, o in early:
                    self._wheel.add(o, d)
                due = [(d, o) for d, o in due if d <= now]
            if due:
                await self._deliver(due)
                continue
            next_due = self._wheel.next_due_ms()
            sleep_s = _MAX_SLEEP_S if next_due is None else (next_due - now) / 1000
            self._wake.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), max(0.001, min(sleep_s, _MAX_SLEEP_S)))

    async def _deliver(self, due: list[tuple[int, int]]) -> None:
        for start in range(0, len(due), _DELIVERY_BATCH):
            chunk = due[start : start + _DELIVERY_BATCH]
            try:
                await self._deliver_chunk(chunk)
            except TidemqError as exc:
                log.warning("timer delivery failed (%s); retrying in %d ms", exc, _RETRY_DELAY_MS)
                retry_at = self._clock.now_ms() + _RETRY_DELAY_MS
                for _, offset in due[start:]:
                    if offset in self._pending:
                        self._wheel.add(offset, retry_at)
                return

    def _delivery(
        self, offset: int
    ) -> tuple[Pending, tuple[str, int, bytes | memoryview, bytes, int]] | None:
        """The record delivering pending batch `offset`; None when it is not delivered now
        (cancelled meanwhile, parked, or dropped: its queue or its record is gone)."""
        entry = self._pending.get(offset)
        if entry is None:
            return None  # cancelled meanwhile
        key = (entry.topic, entry.queue)
        if key in self._book.static and not self._deliverable(key, offset):
            self._book.park(key, offset)  # until handed over, or writable here again
            return None
        if not self._topic_exists(entry.topic, entry.queue):
            log.warning(
                "dropping delayed batch %d: its topic %r queue %d no longer exists",
                offset,
                entry.topic,
                entry.queue,
            )
            self._drop_pending(offset)
            self._done.mark(offset, entry.count)
            return None
        rec = next(read_internal(self._gateway.store, TIMER_TOPIC, offset, max_bytes=1), None)
        if rec is None or rec.offset != offset:
            log.error("timer record %d is missing from the timer topic; dropped", offset)
            self._drop_pending(offset)
            self._done.mark(offset, entry.count)
            return None
        # The scheduled time, not the wheel's (a retried delivery sits there later).
        props = SystemProperties(ot=self.origin, oq=0, oo=offset, due=entry.due_ms)
        if entry.origin is not None:  # adopted: the ids of where it was sent
            props.ot = qualified_origin(TIMER_TOPIC, entry.origin[0])
            props.oo, props.ref = entry.origin[1], offset
        record = (
            entry.topic,
            entry.queue,
            rec.payload,
            encode_properties(props),
            int(RecordFlags.FROM_TIMER),
        )
        return entry, record

    async def _deliver_chunk(self, chunk: list[tuple[int, int]]) -> None:
        store = self._gateway.store
        items: list[tuple[str, int, bytes | memoryview, bytes, int]] = []
        offsets: list[tuple[int, Pending]] = []
        for _, offset in chunk:
            found = self._delivery(offset)
            if found is not None:
                items.append(found[1])
                offsets.append((offset, found[0]))
        if not items:
            return
        delivering = [offset for offset, _ in offsets]
        self._delivering.update(delivering)
        try:
            with self._moves.writing(store):
                results, error = await self._gateway.append_many(items)
                for offset, entry in offsets[: len(results)]:
                    if self._drop_pending(offset) is not None:
                        self._delivered += 1
                    self._done.mark(offset, entry.count)
        finally:
            self._delivering.difference_update(delivering)
            self._notify_settled()
        if isinstance(error, TopicNotFound | QueueNotFound | QueueMoved):
            # Deleted, or its static queue sealed, between the check and the append: drop
            # or park it as above; the rest of the chunk goes back on the wheel.
            offset, entry = offsets[len(results)]
            if isinstance(error, QueueMoved):
                self._book.park((entry.topic, entry.queue), offset)
            else:
                self._drop_pending(offset)
                self._done.mark(offset, entry.count)
            now = self._clock.now_ms()
            for later, _ in offsets[len(results) + 1 :]:
                self._wheel.add(later, now)
            self._wake.set()
        elif error is not None:
            raise error

    def _deliverable(self, key: QueueKey, offset: int) -> bool:
        return self._static_writable(*key) is True and not self._book.reserved(key, offset)


def _batch_base(store: MessageStore, offset: int) -> int | None:
    """Base offset of the timer-topic batch holding `offset`, or None if there is none."""
    rec = next(read_internal(store, TIMER_TOPIC, offset, max_bytes=1), None)
    if rec is None or not rec.offset <= offset < rec.offset + rec.count:
        return None
    if rec.header.flags & RecordFlags.CONTROL:
        return None
    return rec.offset
