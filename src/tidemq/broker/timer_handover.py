"""The timer service's side of static-topic hand-overs (STATIC_TIMERS_TAKE, _ADOPT,
_HANDED): a sealed queue's pending delayed batches move to its new write end and keep
their ids. The protocol and its crash cases are in `handover_book`."""

from __future__ import annotations

import itertools
from typing import Final

from tidemq.broker.handover_book import HANDED, HANDOFF, Handoff, QueueKey
from tidemq.broker.system_topics import TIMER_TOPIC, control_payload, read_internal
from tidemq.broker.timer_state import Pending, TimerState
from tidemq.core.errors import InvalidRequest, RequestTimeout, TidemqError
from tidemq.core.properties import SystemProperties, encode_properties
from tidemq.core.record import RecordFlags
from tidemq.protocol.static_messages import StaticTimersPage, TimerHandover

__all__ = ["MAX_HANDOVER_PAGE_BYTES", "TimerHandovers"]

#: The largest page of batches handed over at once (a request's max_bytes is capped).
MAX_HANDOVER_PAGE_BYTES: Final = 4 << 20
#: What one batch adds to a page besides its payload (msgpack fields, origin name).
_ENTRY_OVERHEAD: Final = 128


class TimerHandovers(TimerState):
    def holding(self, topic: str, queue: int) -> int:
        """How many batches for a static queue are pending here while another broker
        writes it (not handed over yet)."""
        if self._static_writable(topic, queue):
            return 0
        return self._book.holding((topic, queue))

    def unpark(self, topic: str, queue: int) -> None:
        """The queue is writable here again: its parked batches are delivered here."""
        for offset in self._book.unpark((topic, queue)):
            entry = self._pending.get(offset)
            if entry is not None:
                self._wheel.add(offset, entry.due_ms)
        self._wake.set()

    def _adopted_base(self, origin_id: int, offset: int) -> int | None:
        """The timer offset here of the adopted batch holding message `offset` of the
        origin named by `origin_id` (a batch's messages have consecutive ids)."""
        local = self._book.adopted.get((origin_id, offset))
        if local is not None:
            return local
        for (oid, start), local in self._book.adopted.items():
            entry = self._pending.get(local)
            if oid == origin_id and entry is not None and start <= offset < start + entry.count:
                return local
        return None

    async def take(self, topic: str, queue: int, dest: str, max_bytes: int) -> StaticTimersPage:
        """STATIC_TIMERS_TAKE: the page reserved for a hand-over (reserving the next one
        when none is), or an empty page when nothing waits here."""
        key = (topic, queue)
        if key not in self._book.handoffs:
            if self._static_writable(topic, queue) is not False:
                return StaticTimersPage(source=self._me)  # delivered here
            await self._wait_settled(key)
        handoff = self._book.handoffs.get(key)
        if handoff is None:
            page_bytes = min(max(1, max_bytes), MAX_HANDOVER_PAGE_BYTES)
            handoff = await self._reserve(key, dest, page_bytes)
            if handoff is None:
                return StaticTimersPage(source=self._me)
        elif handoff.record < 0:
            raise RequestTimeout(
                f"queue {queue} of {topic!r}: another hand-over is reserving its page; try again"
            )
        offsets = [o for o in self._book.pending_of(key) if o <= handoff.through]
        timers = [self._handover_of(o) for o in offsets]
        more = len(self._book.pending_of(key)) > len(offsets)
        return StaticTimersPage(
            source=self._me, dest=handoff.dest, through=handoff.through, timers=timers, more=more
        )

    async def _reserve(self, key: QueueKey, dest: str, max_bytes: int) -> Handoff | None:
        offsets = [o for o in self._book.pending_of(key) if o not in self._delivering]
        if not offsets:
            return None
        # The page's frame must fit the adopter's limit (one batch + 64 KiB): it holds one
        # batch, or batches up to max_bytes together, never one more.
        size, n = 0, 0
        store = self._gateway.store
        for offset in offsets:
            rec = next(read_internal(store, TIMER_TOPIC, offset, max_bytes=1), None)
            size += (len(rec.payload) if rec is not None else 0) + _ENTRY_OVERHEAD
            if n and size > max_bytes:
                break
            n += 1
        handoff = self._book.handoffs[key] = Handoff(offsets[n - 1], dest)
        props = SystemProperties(hop=HANDOFF, tt=key[0], tq=key[1], ref=handoff.through, hb=dest)
        try:
            result = await self._gateway.append(
                TIMER_TOPIC,
                0,
                control_payload(),
                properties=encode_properties(props),
                flags=RecordFlags.DELAYED | RecordFlags.CONTROL,
            )
        except BaseException:
            del self._book.handoffs[key]
            raise
        handoff.record, handoff.record_count = result.base_offset, result.count
        return handoff

    def _handover_of(self, offset: int) -> TimerHandover:
        entry = self._pending[offset]
        rec = next(read_internal(self._gateway.store, TIMER_TOPIC, offset, max_bytes=1), None)
        if rec is None or rec.offset != offset:
            raise TidemqError(f"timer record {offset} is missing from the timer topic")
        origin_broker, origin_offset = entry.origin or (self._me, offset)
        return TimerHandover(
            offset=offset,
            origin_broker=origin_broker,
            origin_offset=origin_offset,
            due_ms=entry.due_ms,
            count=entry.count,
            payload=bytes(rec.payload),
        )

    async def adopt(
        self, topic: str, queue: int, source: str, timers: list[TimerHandover]
    ) -> tuple[int, int]:
        """STATIC_TIMERS_ADOPT: schedule what was not adopted yet; (adopted, skipped)."""
        key = (topic, queue)
        if self._static_writable(topic, queue) is None:
            raise InvalidRequest(f"{topic!r} queue {queue} is not a static queue on {self._me}")
        if any(b.offset <= a.offset for a, b in itertools.pairwise(timers)):
            raise InvalidRequest("a hand-over page lists its batches in increasing offsets")
        mark = self._book.adopted_mark(key, source)
        fresh = [t for t in timers if t.offset > mark]
        items: list[tuple[str, int, bytes | memoryview, bytes, int]] = []
        for t in fresh:
            props = SystemProperties(
                tt=topic, tq=queue, due=t.due_ms, ob=t.origin_broker, ho=t.origin_offset
            )
            props.hb, props.hx = source, t.offset
            items.append((TIMER_TOPIC, 0, t.payload, encode_properties(props), RecordFlags.DELAYED))
        self._scheduling[key] = self._scheduling.get(key, 0) + 1
        try:
            results, error = await self._gateway.append_many(items)
            for t, result in zip(fresh, results, strict=False):
                # The mark first: the batch can be delivered (and its record trimmed) only
                # once it is on the wheel.
                self._book.mark_adopted(key, source, t.offset)
                origin = (t.origin_broker, t.origin_offset)
                entry = Pending(topic, queue, result.count, t.due_ms, origin)
                self._add_pending(result.base_offset, entry)
                self._wheel.add(result.base_offset, t.due_ms)
        finally:
            self._finish_scheduling(key)
        self._wake.set()
        if error is not None:
            raise error
        return len(results), len(timers) - len(fresh)

    async def handed(self, topic: str, queue: int, through: int) -> int:
        """STATIC_TIMERS_HANDED: the reserved page is adopted; drop it. Returns how many
        batches were dropped (0 for a repeated request)."""
        key = (topic, queue)
        handoff = self._book.handoffs.get(key)
        if handoff is None:
            return 0
        if handoff.through != through:
            raise InvalidRequest(
                f"queue {queue} of {topic!r}: the page handed over ends at offset "
                f"{handoff.through}, not {through}"
            )
        if handoff.record < 0:
            raise RequestTimeout(f"queue {queue} of {topic!r}: its page is being reserved")
        props = SystemProperties(hop=HANDED, tt=topic, tq=queue, ref=through)
        result = await self._gateway.append(
            TIMER_TOPIC,
            0,
            control_payload(),
            properties=encode_properties(props),
            flags=RecordFlags.DELAYED | RecordFlags.CONTROL,
        )
        self._done.mark(result.base_offset, result.count)
        if self._book.handoffs.get(key) is not handoff:
            return 0  # a concurrent HANDED dropped it
        del self._book.handoffs[key]
        self._done.mark(handoff.record, handoff.record_count)
        dropped = 0
        for offset in self._book.pending_of(key):
            if offset > through:
                break
            entry = self._drop_pending(offset)
            if entry is not None:
                self._wheel.remove(offset)
                self._done.mark(offset, entry.count)
                dropped += 1
        return dropped
