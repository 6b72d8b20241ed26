"""TimerWheel against a model: a dict key -> due time, where advancing to `now` removes and
returns the items due at or before `now`, sorted by (due, key).

Precision and slot count are random, so the window (precision * slots) ranges from 1 ms to
64 s; due times are drawn around the current time in units of the window and of the
precision (so tick boundaries, the window's edge and the overflow all get hit), and time
moves by small steps, by long jumps, to just before a due time (rolling entries over from
the overflow without firing them), and backwards. The threshold for compacting the wheel's
lazy-deletion heaps is lowered at random, so compaction runs in a 40-step example too.
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from tidemq.broker import timer_wheel
from tidemq.broker.timer_wheel import TimerWheel

_KEYS = st.integers(min_value=0, max_value=15)  # few keys: re-adds and removes collide


class TimerWheelMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.model: dict[int, int] = {}
        self.now = 0  # the latest time advanced to (the model's clock for drawing dues)
        self.wheel: TimerWheel[int] = TimerWheel(precision_ms=1, slots=1, now_ms=0)
        self.compact_after = timer_wheel._MIN_STALE_TO_COMPACT

    def teardown(self) -> None:
        timer_wheel._MIN_STALE_TO_COMPACT = 64

    @initialize(
        precision=st.integers(min_value=1, max_value=1000),
        slots=st.integers(min_value=1, max_value=64),
        start=st.integers(min_value=-10_000, max_value=10**9),
        compact_after=st.sampled_from([0, 1, 3, 64]),
    )
    def create(self, precision: int, slots: int, start: int, compact_after: int) -> None:
        # A module constant read at each use: patched here, restored by `teardown`.
        timer_wheel._MIN_STALE_TO_COMPACT = self.compact_after = compact_after
        self.precision = precision
        self.window = precision * slots
        self.now = start
        self.wheel = TimerWheel(precision_ms=precision, slots=slots, now_ms=start)

    def _draw_due(self, data: st.DataObject) -> int:
        """A due time near `now`: past, this tick, the window's edge, or well beyond it."""
        p, w = self.precision, self.window
        tick_start = self.now - self.now % p
        return data.draw(
            st.one_of(
                st.integers(min_value=self.now - 2 * w, max_value=self.now + 3 * w),
                st.sampled_from([tick_start + d for d in (0, p - 1, p, w - 1, w, w + p)]),
                st.integers(min_value=self.now + 3 * w, max_value=self.now + 200 * w),
            ),
            label="due",
        )

    # ------------------------------------------------------------------ changes

    @rule(key=_KEYS, data=st.data())
    def add(self, key: int, data: st.DataObject) -> None:
        due = self._draw_due(data)
        self.wheel.add(key, due)
        self.model[key] = due

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def readd_same_due_after_remove(self, data: st.DataObject) -> None:
        """Leaves a stale tuple in the overflow that looks exactly like the live one."""
        key = data.draw(st.sampled_from(sorted(self.model)))
        assert self.wheel.remove(key)
        self.wheel.add(key, self.model[key])

    @rule(key=_KEYS)
    def remove(self, key: int) -> None:
        assert self.wheel.remove(key) == (key in self.model)
        self.model.pop(key, None)

    # ------------------------------------------------------------------ time

    def _advance(self, now: int) -> None:
        got = self.wheel.advance(now)
        expected = sorted((due, key) for key, due in self.model.items() if due <= now)
        assert got == expected
        for _, key in expected:
            del self.model[key]
        self.now = max(self.now, now)

    @rule(step=st.integers(min_value=0, max_value=3000))
    def advance_a_little(self, step: int) -> None:
        self._advance(self.now + step % (2 * self.precision + 1))

    @rule(data=st.data())
    def advance_to_next_due(self, data: st.DataObject) -> None:
        due = self.wheel.next_due_ms()
        if due is not None:
            self._advance(due + data.draw(st.sampled_from([-1, 0])))

    @precondition(lambda self: bool(self.model))
    @rule(data=st.data())
    def advance_to_just_before_a_due_time(self, data: st.DataObject) -> None:
        """Brings an overflow entry into the window without firing it (a roll over)."""
        due = self.model[data.draw(st.sampled_from(sorted(self.model)))]
        self._advance(due - data.draw(st.integers(min_value=1, max_value=self.window)))

    @rule(windows=st.integers(min_value=1, max_value=10**6), extra=st.integers(0, 999))
    def jump(self, windows: int, extra: int) -> None:
        self._advance(self.now + windows * self.window + extra)

    @rule(back=st.integers(min_value=1, max_value=10**5))
    def go_back(self, back: int) -> None:
        self._advance(self.now - back)

    # ------------------------------------------------------------------ queries

    @rule()
    def next_due(self) -> None:
        # A rule, not an invariant: asking fills the cache, and the wheel must also be
        # right when it is asked only now and then.
        assert self.wheel.next_due_ms() == min(self.model.values(), default=None)

    @invariant()
    def contents_match(self) -> None:
        assert len(self.wheel) == len(self.model)
        for key in range(16):
            assert (key in self.wheel) == (key in self.model)
            assert self.wheel.due_of(key) == self.model.get(key)

    @invariant()
    def bookkeeping_is_consistent(self) -> None:
        w = self.wheel
        busy = [slot for slot in w._slots if slot is not None]
        assert all(busy)  # an emptied slot is dropped
        assert sum(len(slot) for slot in busy) == w._in_wheel
        assert w._in_wheel + w._overflow_live == len(self.model)
        assert w._busy_slots == len(busy)
        for key, due in self.model.items():
            tick = due // self.precision
            if tick < w._tick + w.slots:  # in the wheel: its slot's tick has a heap item
                assert max(tick, w._tick) in w._busy
                assert key in (w._slots[max(tick, w._tick) % w.slots] or ())
        # Lazy deletion stays bounded: compaction kicks in past `compact_after` stale items.
        bound = self.compact_after
        assert len(w._overflow) - w._overflow_live <= max(w._overflow_live, bound)
        assert len(w._busy) - w._busy_slots <= max(w._busy_slots, bound)


TimerWheelMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None
)
TestTimerWheelModel = TimerWheelMachine.TestCase
