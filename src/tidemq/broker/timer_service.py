"""Delay/timer messages: schedule, deliver on time, cancel, rebuild after a restart.

A delayed batch is appended to the internal timer topic (`system_topics.TIMER_TOPIC`) with
its target and due time in the record's properties; its offset there is its id (the
messages' ids are computed from it, and stay the same after delivery). The in-memory
`TimerWheel` indexes pending schedules by due time; the wheel holds no payloads, only
offsets. At due time the batch is read back from the timer topic and appended, unchanged,
to its real topic with flag FROM_TIMER and properties naming its origin and due time.

Never early: an entry is delivered only once the broker's clock reaches its due time.
Late by at most the loop's reaction time plus, after a crash, the restart.

Durability (docs/design/timers-and-transactions.md): schedules, cancels and deliveries
are commit-log records. The saved state is a `DoneSet` of finished timer offsets and a log
position P; a restart reads the timer topic from the set's low watermark and scans the log
from P for delivered records. A schedule is put on the wheel only once its append is
durable, and marked done only once its delivery is, so a crash at any point either
redelivers (a delivery written but its mark not saved is found by the scan: no duplicate)
or delivers for the first time.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

import msgspec

from tidemq.broker.config import BrokerConfig
from tidemq.broker.done_set import DoneSet
from tidemq.broker.moves import InFlightMoves
from tidemq.broker.store_gateway import StoreGateway
from tidemq.broker.system_topics import (
    TIMER_TOPIC,
    MovedRecord,
    control_payload,
    read_internal,
)
from tidemq.broker.timer_wheel import TimerWheel
from tidemq.core.clock import Clock
from tidemq.core.errors import (
    AlreadyDelivered,
    DelayTooLong,
    QueueNotFound,
    TidemqError,
    TopicNotFound,
    UnknownMessage,
)
from tidemq.core.message import parse_message_id, topic_hash
from tidemq.core.properties import SystemProperties, encode_properties
from tidemq.core.record import RecordFlags
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


@dataclass(slots=True)
class _Pending:
    topic: str
    queue: int
    count: int
    due_ms: int


class _SavedState(msgspec.Struct):
    position: int
    done: list[tuple[int, int]]
    delivered: int
    cancelled: int


_STATE_DECODER: Final = msgspec.msgpack.Decoder(_SavedState)


class TimerService:
    def __init__(
        self,
        config: BrokerConfig,
        gateway: StoreGateway,
        clock: Clock,
        topic_exists: Callable[[str, int], bool],
    ) -> None:
        self._config = config
        self._gateway = gateway
        self._clock = clock
        self._topic_exists = topic_exists
        self._wheel: TimerWheel[int] = TimerWheel(
            precision_ms=config.timer_precision_ms,
            slots=config.timer_wheel_slots,
            now_ms=clock.now_ms(),
        )
        self._pending: dict[int, _Pending] = {}
        #: Schedules whose delivery is being written (a cancel of one is refused).
        self._delivering: set[int] = set()
        self._moves = InFlightMoves()
        self._done = DoneSet()
        self._delivered = 0
        self._cancelled = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._timer_id = topic_hash(TIMER_TOPIC)

    # ------------------------------------------------------------------ recovery

    @staticmethod
    def scan_position(saved: bytes | None) -> int:
        """Where the restart scan for delivered records starts."""
        return 0 if saved is None else _STATE_DECODER.decode(saved).position

    def rebuild(
        self, store: MessageStore, saved: bytes | None, moved: Iterable[MovedRecord]
    ) -> None:
        """Rebuild the pending schedules: saved state, then the timer topic from the low
        watermark, then the delivered records found by the log scan. Runs before serving."""
        if saved is not None:
            state = _STATE_DECODER.decode(saved)
            self._done = DoneSet.restore(state.done)
            self._delivered, self._cancelled = state.delivered, state.cancelled
        pending: dict[int, _Pending] = {}
        for rec in read_internal(store, TIMER_TOPIC, self._done.low):
            if rec.header.flags & RecordFlags.CONTROL:
                self._done.mark(rec.offset, rec.count)  # the cancel record itself
                target = pending.pop(rec.props.ref, None)
                if target is not None:
                    self._done.mark(rec.props.ref, target.count)
                continue
            if self._done.is_done(rec.offset):
                continue
            pending[rec.offset] = _Pending(rec.props.tt, rec.props.tq, rec.count, rec.props.due)
        for m in moved:
            if m.flags & RecordFlags.FROM_TIMER and m.props.ot == TIMER_TOPIC:
                if pending.pop(m.props.oo, None) is not None:
                    self._delivered += 1
                self._done.mark(m.props.oo, m.count)
        for offset, entry in pending.items():
            self._wheel.add(offset, entry.due_ms)
        self._pending = pending
        if pending:
            log.info("timer service: %d scheduled batches pending after restart", len(pending))

    def save_state(self, flushed_position: int) -> bytes:
        """The state to save: everything marked done is durable at or before
        `flushed_position` (marks follow durable deliveries), and a delivery not marked yet
        starts after the scan position (`InFlightMoves`), so a restart scans from it."""
        position = self._moves.scan_position(flushed_position)
        return msgspec.msgpack.encode(
            _SavedState(position, self._done.export(), self._delivered, self._cancelled)
        )

    @property
    def low_watermark(self) -> int:
        """Timer offsets below this are all delivered or cancelled."""
        return self._done.low

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
        result = await self._gateway.append(
            TIMER_TOPIC, 0, payload, properties=encode_properties(props), flags=flags
        )
        if not self._done.is_done(result.base_offset):
            self._pending[result.base_offset] = _Pending(topic, queue, result.count, deliver_at_ms)
            self._wheel.add(result.base_offset, deliver_at_ms)
            self._wake.set()
        return result

    async def cancel(self, message_id: str) -> CancelDelayedResponse:
        try:
            topic_id, queue, offset = parse_message_id(message_id)
        except ValueError as exc:
            raise UnknownMessage(str(exc)) from None
        if topic_id != self._timer_id or queue != 0:
            raise UnknownMessage(
                f"{message_id} is not the id of a delayed message: only the ids that sending "
                "with delay= or deliver_at= returned can be cancelled"
            )
        if offset < self._done.low:
            # Every offset below the low watermark is delivered or cancelled, and the
            # checkpoint may already have trimmed its batch from the timer topic.
            raise AlreadyDelivered(
                f"delayed message {message_id} was already delivered or cancelled"
            )
        base = await self._gateway.call(lambda s: _batch_base(s, offset))
        if base is None:
            raise UnknownMessage(f"no delayed message {message_id} on this broker")
        if base in self._delivering:
            # Its delivery is being written: cancelling now would answer "cancelled" for a
            # message that is about to be (or already is) in its topic.
            raise AlreadyDelivered(f"delayed message {message_id} is being delivered now")
        entry = self._pending.pop(base, None)
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
            self._pending[base] = entry  # not cancelled: it stays scheduled
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
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

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

    async def _deliver_chunk(self, chunk: list[tuple[int, int]]) -> None:
        store = self._gateway.store
        items: list[tuple[str, int, bytes | memoryview, bytes, int]] = []
        offsets: list[tuple[int, _Pending]] = []
        for _, offset in chunk:
            entry = self._pending.get(offset)
            if entry is None:
                continue  # cancelled meanwhile
            if not self._topic_exists(entry.topic, entry.queue):
                log.warning(
                    "dropping delayed batch %d: its topic %r queue %d no longer exists",
                    offset,
                    entry.topic,
                    entry.queue,
                )
                self._pending.pop(offset)
                self._done.mark(offset, entry.count)
                continue
            rec = next(read_internal(store, TIMER_TOPIC, offset, max_bytes=1), None)
            if rec is None or rec.offset != offset:
                log.error("timer record %d is missing from the timer topic; dropped", offset)
                self._pending.pop(offset)
                self._done.mark(offset, entry.count)
                continue
            # The scheduled time, not the wheel's (a retried delivery sits there later).
            props = SystemProperties(ot=TIMER_TOPIC, oq=0, oo=offset, due=entry.due_ms)
            items.append(
                (
                    entry.topic,
                    entry.queue,
                    rec.payload,
                    encode_properties(props),
                    RecordFlags.FROM_TIMER,
                )
            )
            offsets.append((offset, entry))
        if not items:
            return
        delivering = [offset for offset, _ in offsets]
        self._delivering.update(delivering)
        try:
            with self._moves.writing(store):
                results, error = await self._gateway.append_many(items)
                for offset, entry in offsets[: len(results)]:
                    if self._pending.pop(offset, None) is not None:
                        self._delivered += 1
                    self._done.mark(offset, entry.count)
        finally:
            self._delivering.difference_update(delivering)
        if isinstance(error, TopicNotFound | QueueNotFound):
            # Deleted between the check and the append: drop it, as above, and go on.
            offset, entry = offsets[len(results)]
            self._pending.pop(offset, None)
            self._done.mark(offset, entry.count)
        elif error is not None:
            raise error


def _batch_base(store: MessageStore, offset: int) -> int | None:
    """Base offset of the timer-topic batch holding `offset`, or None if there is none."""
    rec = next(read_internal(store, TIMER_TOPIC, offset, max_bytes=1), None)
    if rec is None or not rec.offset <= offset < rec.offset + rec.count:
        return None
    if rec.header.flags & RecordFlags.CONTROL:
        return None
    return rec.offset
