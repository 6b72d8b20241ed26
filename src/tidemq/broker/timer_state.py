"""The timer service's state and its recovery: pending batches, the wheel, the done set.

A delayed batch is appended to the internal timer topic (`system_topics.TIMER_TOPIC`) with
its target and due time in the record's properties; its offset there is its id. The
in-memory `TimerWheel` indexes pending schedules by due time; the wheel holds no payloads,
only offsets.

Durability (docs/design/timers-and-transactions.md): schedules, cancels, hand-overs and
deliveries are commit-log records. The saved state is a `DoneSet` of finished timer
offsets, the hand-over dedup marks (`handover_book`) and a log position P; a restart reads
the timer topic from the set's low watermark and scans the log from P for delivered
records. A schedule is put on the wheel only once its append is durable, and marked done
only once its delivery is, so a crash at any point either redelivers (a delivery written
but its mark not saved is found by the scan: no duplicate) or delivers for the first time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

import msgspec

from tidemq.broker.config import BrokerConfig
from tidemq.broker.done_set import DoneSet
from tidemq.broker.handover_book import HANDED, HANDOFF, Handoff, HandoverBook, QueueKey
from tidemq.broker.moves import InFlightMoves
from tidemq.broker.store_gateway import StoreGateway
from tidemq.broker.system_topics import TIMER_TOPIC, MovedRecord, read_internal
from tidemq.broker.timer_wheel import TimerWheel
from tidemq.core.clock import Clock
from tidemq.core.errors import RequestTimeout
from tidemq.core.message import topic_hash
from tidemq.core.properties import SystemProperties, is_origin_of, qualified_origin
from tidemq.core.record import RecordFlags
from tidemq.store.message_store import MessageStore

__all__ = ["HANDOVER_SETTLE_S", "Pending", "TimerState"]

log = logging.getLogger(__name__)

#: How long a hand-over waits for the schedules and deliveries of its queue in flight.
HANDOVER_SETTLE_S: Final = 10.0


@dataclass(slots=True)
class Pending:
    topic: str
    queue: int
    count: int
    due_ms: int
    #: An adopted batch (static topics): the broker it was sent to and its timer offset
    #: there, which its messages' ids name.
    origin: tuple[str, int] | None = None


class _SavedState(msgspec.Struct):
    position: int
    done: list[tuple[int, int]]
    delivered: int
    cancelled: int
    #: The adopters' dedup marks (topic, queue, source broker, source offset).
    marks: list[tuple[str, int, str, int]] = []


_STATE_DECODER: Final = msgspec.msgpack.Decoder(_SavedState)


class TimerState:
    """The service's state; `TimerService` builds on it."""

    def __init__(
        self,
        config: BrokerConfig,
        gateway: StoreGateway,
        clock: Clock,
        topic_exists: Callable[[str, int], bool],
        *,
        static_writable: Callable[[str, int], bool | None] = lambda topic, queue: None,
    ) -> None:
        """`static_writable(topic, queue)`: None for an ordinary topic's queue; for a
        static queue, whether this broker holds its write end."""
        self._config = config
        self._gateway = gateway
        self._clock = clock
        self._topic_exists = topic_exists
        self._static_writable = static_writable
        self._me = config.broker_name
        #: The origin topic in the ids of the messages scheduled here.
        self.origin = qualified_origin(TIMER_TOPIC, config.broker_name)
        self._wheel: TimerWheel[int] = TimerWheel(
            precision_ms=config.timer_precision_ms,
            slots=config.timer_wheel_slots,
            now_ms=clock.now_ms(),
        )
        self._pending: dict[int, Pending] = {}
        #: Schedules whose delivery is being written (a cancel of one is refused).
        self._delivering: set[int] = set()
        self._moves = InFlightMoves()
        self._done = DoneSet()
        self._delivered = 0
        self._cancelled = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._timer_id = topic_hash(self.origin)
        #: Ids from before origins were qualified (ambiguous across brokers).
        self._legacy_id = topic_hash(TIMER_TOPIC)
        self._book = HandoverBook()
        #: Schedules being written per queue (a hand-over waits for those of its queue).
        self._scheduling: dict[QueueKey, int] = {}
        self._settle_waiters: list[asyncio.Future[None]] = []

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
            for topic, queue, source, offset in state.marks:
                self._book.mark_adopted((topic, queue), source, offset)
        pending: dict[int, Pending] = {}
        for rec in read_internal(store, TIMER_TOPIC, self._done.low):
            p = rec.props
            if rec.header.flags & RecordFlags.CONTROL:
                self._replay_control(rec.offset, rec.count, p, pending)
                continue
            if p.hb:  # adopted: its dedup mark, delivered or not
                self._book.mark_adopted((p.tt, p.tq), p.hb, p.hx)
            if self._done.is_done(rec.offset):
                continue
            origin = (p.ob, p.ho) if p.ob else None
            pending[rec.offset] = Pending(p.tt, p.tq, rec.count, p.due, origin)
        for m in moved:
            if m.flags & RecordFlags.FROM_TIMER and is_origin_of(m.props.ot, TIMER_TOPIC):
                local = m.props.ref if m.props.ref >= 0 else m.props.oo
                if pending.pop(local, None) is not None:
                    self._delivered += 1
                self._done.mark(local, m.count)
        for offset, entry in pending.items():
            self._add_pending(offset, entry)
            self._wheel.add(offset, entry.due_ms)
        if pending:
            log.info("timer service: %d scheduled batches pending after restart", len(pending))

    def _replay_control(
        self, offset: int, count: int, p: SystemProperties, pending: dict[int, Pending]
    ) -> None:
        """A cancel, handoff or handed record met by the rebuild."""
        if p.hop == HANDOFF:  # done once handed
            self._book.handoffs[(p.tt, p.tq)] = Handoff(p.ref, p.hb, offset, count)
            return
        self._done.mark(offset, count)
        if p.hop == HANDED:
            key = (p.tt, p.tq)
            handoff = self._book.handoffs.pop(key, None)
            if handoff is not None:
                self._done.mark(handoff.record, handoff.record_count)
            gone = [o for o, e in pending.items() if (e.topic, e.queue) == key and o <= p.ref]
            for o in gone:
                self._done.mark(o, pending.pop(o).count)
            return
        target = pending.pop(p.ref, None)  # a cancel
        if target is not None:
            self._done.mark(p.ref, target.count)

    def _add_pending(self, offset: int, entry: Pending) -> None:
        self._pending[offset] = entry
        if self._static_writable(entry.topic, entry.queue) is not None:
            self._book.add((entry.topic, entry.queue), offset)
        if entry.origin is not None:
            origin_id = topic_hash(qualified_origin(TIMER_TOPIC, entry.origin[0]))
            self._book.adopted[(origin_id, entry.origin[1])] = offset

    def _drop_pending(self, offset: int) -> Pending | None:
        entry = self._pending.pop(offset, None)
        if entry is not None:
            self._book.remove((entry.topic, entry.queue), offset)
            if entry.origin is not None:
                origin_id = topic_hash(qualified_origin(TIMER_TOPIC, entry.origin[0]))
                self._book.adopted.pop((origin_id, entry.origin[1]), None)
        return entry

    def save_state(self, flushed_position: int) -> bytes:
        """The state to save: everything marked done is durable at or before
        `flushed_position` (marks follow durable deliveries), and a delivery not marked yet
        starts after the scan position (`InFlightMoves`), so a restart scans from it."""
        position = self._moves.scan_position(flushed_position)
        return msgspec.msgpack.encode(
            _SavedState(
                position,
                self._done.export(),
                self._delivered,
                self._cancelled,
                self._book.export_marks(),
            )
        )

    @property
    def low_watermark(self) -> int:
        """Timer offsets below this are all delivered or cancelled."""
        return self._done.low

    # ------------------------------------------------------------------ writes in flight

    def _notify_settled(self) -> None:
        waiters, self._settle_waiters = self._settle_waiters, []
        for waiter in waiters:
            if not waiter.done():
                waiter.set_result(None)

    def _busy(self, key: QueueKey) -> bool:
        if key in self._scheduling:
            return True
        return any(
            (e.topic, e.queue) == key
            for e in (self._pending.get(o) for o in self._delivering)
            if e is not None
        )

    async def _wait_settled(self, key: QueueKey) -> None:
        """Until no schedule or delivery of `key` is being written."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + HANDOVER_SETTLE_S
        while self._busy(key):
            waiter = loop.create_future()
            self._settle_waiters.append(waiter)
            try:
                await asyncio.wait_for(waiter, max(0.0, deadline - loop.time()))
            except TimeoutError:
                raise RequestTimeout(
                    f"queue {key[1]} of {key[0]!r}: writes in flight did not end within "
                    f"{HANDOVER_SETTLE_S:g} s; hand its delayed messages over again"
                ) from None

    def _finish_scheduling(self, key: QueueKey) -> None:
        self._scheduling[key] -= 1
        if not self._scheduling[key]:
            del self._scheduling[key]
        self._notify_settled()
