"""Idempotent appends: the last few batches of each (topic, queue, producer id).

A producer stamps each batch with (producer id, epoch, base sequence); sequences count
messages per (producer, queue), so a batch of n messages at sequence s is followed by one
at s + n. A batch equal to a remembered one is a retry: the store answers with the
original offsets and writes nothing. A gap, a reuse outside the window, or an old epoch
is refused.

The table is rebuilt on open from its snapshot in the metadata database (written at each
checkpoint) plus the records replayed after the checkpoint.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from tidemq.core.errors import FencedProducer, OutOfOrderSequence

__all__ = ["NO_PRODUCER", "ProducerRow", "ProducerStamp", "ProducerStates", "RememberedBatch"]

#: Producer id stored in records appended without idempotence.
NO_PRODUCER = -1


@dataclass(frozen=True, slots=True)
class ProducerStamp:
    producer_id: int
    epoch: int
    base_sequence: int


@dataclass(frozen=True, slots=True)
class RememberedBatch:
    base_sequence: int
    count: int
    base_offset: int
    end_position: int


@dataclass(slots=True)
class _State:
    epoch: int
    window: deque[RememberedBatch] = field(default_factory=deque)


Key = tuple[int, int, int]  # topic id, queue id, producer id
#: A producer's window on a queue as saved: (topic id, queue id, producer id, epoch,
#: [[base sequence, count, base offset, end position], ...] oldest first).
ProducerRow = tuple[int, int, int, int, list[list[int]]]


class ProducerStates:
    def __init__(self, window: int) -> None:
        self._window = window
        self._states: dict[Key, _State] = {}
        self._dirty: set[Key] = set()

    def check(self, key: Key, stamp: ProducerStamp, count: int) -> RememberedBatch | None:
        """The remembered batch if this one is a retry of it; None if it is new and in order.

        Raises FencedProducer or OutOfOrderSequence otherwise.
        """
        state = self._states.get(key)
        seq = stamp.base_sequence
        if state is None or stamp.epoch > state.epoch:
            if seq != 0:
                raise OutOfOrderSequence(
                    f"producer {stamp.producer_id} epoch {stamp.epoch} must start at "
                    f"sequence 0 on this queue, got {seq}"
                )
            return None
        if stamp.epoch < state.epoch:
            raise FencedProducer(
                f"producer {stamp.producer_id} epoch {stamp.epoch} is fenced by epoch {state.epoch}"
            )
        for remembered in state.window:
            if remembered.base_sequence == seq:
                if remembered.count != count:
                    raise OutOfOrderSequence(
                        f"producer {stamp.producer_id} reused sequence {seq} for another batch"
                    )
                return remembered
        last = state.window[-1] if state.window else None
        expected = 0 if last is None else last.base_sequence + last.count
        if seq != expected:
            raise OutOfOrderSequence(
                f"producer {stamp.producer_id} sent sequence {seq}, expected {expected}"
            )
        return None

    def record(
        self, key: Key, stamp: ProducerStamp, count: int, base_offset: int, end_position: int
    ) -> None:
        state = self._states.get(key)
        if state is None or stamp.epoch != state.epoch:
            state = self._states[key] = _State(stamp.epoch)
        state.window.append(RememberedBatch(stamp.base_sequence, count, base_offset, end_position))
        while len(state.window) > self._window:
            state.window.popleft()
        self._dirty.add(key)

    def cut_from_position(self, position: int) -> None:
        """Forget the batches whose records end past log `position` (the log was cut
        there, or ends there after a crash): a retry of one is a new batch again."""
        for key, state in self._states.items():
            if state.window and state.window[-1].end_position > position:
                while state.window and state.window[-1].end_position > position:
                    state.window.pop()
                self._dirty.add(key)

    def drop_topic(self, topic_id: int) -> None:
        for key in [k for k in self._states if k[0] == topic_id]:
            del self._states[key]
            self._dirty.discard(key)

    def rows_before(self, position: int, max_batches: int) -> list[ProducerRow]:
        """The windows as far as their batches end at or before log `position` (what a
        replica starting over there cannot rebuild from the log it copies), newest
        first, at most `max_batches` batches in all (bounds the start-over answer)."""
        rows: list[tuple[int, ProducerRow]] = []
        for key, state in self._states.items():
            window = [
                [b.base_sequence, b.count, b.base_offset, b.end_position]
                for b in state.window
                if b.end_position <= position
            ]
            if window:
                rows.append((window[-1][3], (*key, state.epoch, window)))
        rows.sort(key=lambda r: r[0], reverse=True)
        out: list[ProducerRow] = []
        left = max_batches
        for _, row in rows:
            left -= len(row[4])
            if left < 0:
                break
            out.append(row)
        return out

    # ------------------------------------------------------------------ snapshot

    def take_dirty(self) -> list[tuple[int, int, int, int, list[list[int]]]]:
        rows = []
        for key in self._dirty:
            state = self._states.get(key)
            if state is not None:
                window = [
                    [b.base_sequence, b.count, b.base_offset, b.end_position] for b in state.window
                ]
                rows.append((*key, state.epoch, window))
        self._dirty.clear()
        return rows

    def load(self, rows: Iterable[tuple[int, int, int, int, list[list[int]]]]) -> None:
        for topic_id, queue_id, producer_id, epoch, window in rows:
            state = _State(epoch)
            state.window.extend(RememberedBatch(*w) for w in window)
            self._states[(topic_id, queue_id, producer_id)] = state
