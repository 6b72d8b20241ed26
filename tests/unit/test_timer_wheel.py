"""TimerWheel edge cases: replacing, cancelling, past due, time going back, long jumps,
roll over from the overflow heap, and due times on either side of a tick boundary."""

from __future__ import annotations

import time

import pytest

from tidemq.broker.timer_wheel import TimerWheel


def _wheel(precision_ms: int = 10, slots: int = 8, now_ms: int = 0) -> TimerWheel[int]:
    return TimerWheel(precision_ms=precision_ms, slots=slots, now_ms=now_ms)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"precision_ms": 0, "slots": 4, "now_ms": 0}, "precision_ms must be positive"),
        ({"precision_ms": -5, "slots": 4, "now_ms": 0}, "precision_ms must be positive"),
        ({"precision_ms": 10, "slots": 0, "now_ms": 0}, "slots must be positive"),
        ({"precision_ms": 1.5, "slots": 4, "now_ms": 0}, "precision_ms must be an int"),
        ({"precision_ms": True, "slots": 4, "now_ms": 0}, "precision_ms must be an int"),
        ({"precision_ms": 10, "slots": "4", "now_ms": 0}, "slots must be an int"),
        ({"precision_ms": 10, "slots": 4, "now_ms": 0.0}, "now_ms must be an int"),
    ],
)
def test_bad_arguments_are_refused_by_name(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TimerWheel(**kwargs)  # type: ignore[arg-type]


def test_empty_wheel() -> None:
    w = _wheel()
    assert len(w) == 0
    assert w.next_due_ms() is None
    assert w.advance(1_000_000) == []
    assert 1 not in w
    assert w.due_of(1) is None
    assert not w.remove(1)
    assert (w.precision_ms, w.slots) == (10, 8)


def test_fires_in_due_order_then_key_order() -> None:
    w = _wheel()
    for key, due in [(5, 30), (1, 30), (3, 12), (9, 55), (2, 11)]:
        w.add(key, due)
    assert len(w) == 5
    assert w.next_due_ms() == 11
    assert w.advance(30) == [(11, 2), (12, 3), (30, 1), (30, 5)]
    assert len(w) == 1
    assert w.next_due_ms() == 55
    assert w.advance(60) == [(55, 9)]
    assert w.next_due_ms() is None


def test_never_early_within_the_current_tick() -> None:
    w = _wheel(precision_ms=100, now_ms=0)
    w.add(1, 150)
    w.add(2, 199)
    w.add(3, 100)
    assert w.advance(149) == [(100, 3)]  # tick 1: 150 and 199 share the slot, not due
    assert w.advance(150) == [(150, 1)]
    assert w.advance(198) == []
    assert w.advance(199) == [(199, 2)]


def test_precision_boundaries() -> None:
    w = _wheel(precision_ms=10, slots=4, now_ms=0)
    # 39 is the last ms of the window (ticks 0..3), 40 the first beyond it.
    for key, due in enumerate([9, 10, 39, 40, 41]):
        w.add(key, due)
    assert w.advance(9) == [(9, 0)]
    assert w.advance(10) == [(10, 1)]
    assert w.advance(38) == []
    assert w.advance(39) == [(39, 2)]
    assert w.advance(40) == [(40, 3)]
    assert w.next_due_ms() == 41
    assert w.advance(41) == [(41, 4)]


def test_add_replaces_and_moves() -> None:
    w = _wheel()
    w.add(1, 50)
    w.add(1, 20)  # earlier, within the window
    assert len(w) == 1
    assert w.due_of(1) == 20
    assert w.next_due_ms() == 20
    w.add(1, 5_000)  # out to the overflow
    assert w.next_due_ms() == 5_000
    w.add(1, 5_000)  # same due: nothing moves
    assert len(w) == 1
    assert w.advance(4_999) == []
    w.add(1, 30)  # back into the wheel, past due by now
    assert w.advance(4_999) == [(30, 1)]
    assert w.advance(10_000) == []
    assert len(w) == 0


def test_remove() -> None:
    w = _wheel()
    w.add(1, 15)
    w.add(2, 9_000)
    w.add(3, 25)
    assert w.remove(1)
    assert not w.remove(1)
    assert w.remove(2)
    assert 1 not in w
    assert 3 in w
    assert w.next_due_ms() == 25
    assert w.advance(100_000) == [(25, 3)]


def test_removed_then_readded_in_overflow_fires_once() -> None:
    w = _wheel(precision_ms=10, slots=4)
    w.add(1, 500)
    w.remove(1)
    w.add(1, 500)  # a second (500, 1) tuple; the first is stale but looks the same
    w.add(2, 100)
    w.remove(2)
    w.add(2, 200)
    w.add(2, 100)  # back to the first due: its stale tuple matches again
    assert w.advance(480) == [(100, 2)]  # 500 rolled into the window, not yet due
    assert w._in_wheel == 1  # counted once, though both tuples looked live
    assert w._overflow_live == 0
    assert w.advance(500) == [(500, 1)]
    assert w.advance(10_000) == []
    assert len(w) == 0


def test_past_due_fires_on_next_advance() -> None:
    w = _wheel(now_ms=1_000)
    w.add(1, 3)
    w.add(2, 1_000)
    w.add(3, -50)
    assert w.next_due_ms() == -50
    assert w.advance(1_000) == [(-50, 3), (3, 1), (1_000, 2)]


def test_time_going_back_returns_nothing_new() -> None:
    w = _wheel(precision_ms=10, slots=8, now_ms=0)
    w.add(1, 500)
    w.add(2, 50)
    assert w.advance(1_000) == [(50, 2), (500, 1)]
    w.add(3, 1_005)
    w.add(4, 1_060)
    assert w.advance(900) == []
    assert w.advance(0) == []
    w.add(5, 950)  # past due: fires even at an earlier time, since 950 <= 990
    assert w.advance(990) == [(950, 5)]
    assert w.advance(1_005) == [(1_005, 3)]
    assert w.advance(1_060) == [(1_060, 4)]


def test_jump_far_beyond_the_window_returns_everything_in_order() -> None:
    w = _wheel(precision_ms=1, slots=16, now_ms=0)
    dues = {key: (key * 7_919) % 100_000 for key in range(2_000)}
    for key, due in dues.items():
        w.add(key, due)
    later = {2_000 + i: 10**12 + i for i in range(3)}  # still pending after the jump
    for key, due in later.items():
        w.add(key, due)
    started = time.perf_counter()
    fired = w.advance(10**9)  # a billion empty ticks
    assert time.perf_counter() - started < 1.0
    assert fired == sorted((due, key) for key, due in dues.items())
    assert len(w) == 3
    assert w.next_due_ms() == 10**12
    assert w.advance(10**12 + 1) == [(10**12, 2_000), (10**12 + 1, 2_001)]


def test_roll_over_from_overflow_in_steps() -> None:
    w = _wheel(precision_ms=10, slots=4, now_ms=0)  # window: 40 ms
    for key in range(20):
        w.add(key, 5 + key * 10)  # 5, 15, ..., 195
    fired: list[tuple[int, int]] = []
    for now in range(0, 201, 10):
        got = w.advance(now)
        assert all(due <= now for due, _ in got)
        assert all(due > now for due in (w.due_of(k) for k in range(20)) if due is not None)
        fired.extend(got)
    assert fired == [(5 + key * 10, key) for key in range(20)]


def test_one_slot_wheel() -> None:
    w = _wheel(precision_ms=7, slots=1, now_ms=3)
    w.add(1, 6)
    w.add(2, 7)
    w.add(3, 13)
    assert w.advance(6) == [(6, 1)]
    assert w.advance(12) == [(7, 2)]
    assert w.advance(13) == [(13, 3)]


def test_many_cancellations_compact_the_overflow() -> None:
    w = _wheel(precision_ms=1, slots=4)
    for key in range(1_000):
        w.add(key, 10_000 + key)
    for key in range(999):
        w.remove(key)
    assert len(w._overflow) <= 2 * len(w) + 64 + 1
    assert w.next_due_ms() == 10_999
    assert w.advance(20_000) == [(10_999, 999)]


def test_a_slot_emptied_and_refilled_many_times_keeps_the_busy_heap_small() -> None:
    w = _wheel(precision_ms=1, slots=100)
    w.add(0, 90)
    for _ in range(1_000):
        w.add(1, 50)
        w.remove(1)
    assert len(w._busy) <= 2 * 1 + 64 + 1
    assert w.advance(100) == [(90, 0)]


@pytest.mark.parametrize("churn", [0, 1, 64, 65, 66, 130, 131, 200])
def test_an_entry_added_after_churn_fires(churn: int) -> None:
    # Whenever the busy heap happens to be compacted, the slot being filled keeps its item.
    w = _wheel(precision_ms=1, slots=100)
    for _ in range(churn):
        w.add(1, 50)
        w.remove(1)
    w.add(1, 50)
    assert w.next_due_ms() == 50
    assert w.advance(1_000) == [(50, 1)]


def test_a_wide_sparse_wheel_does_not_walk_its_empty_slots() -> None:
    # The broker's default shape: an hour of 100 ms ticks. One entry waits near the far
    # end of the window while others fire one per tick: finding the next due entry after
    # each firing must not walk the ~36,000 empty slots in between.
    w = _wheel(precision_ms=100, slots=36_000, now_ms=0)
    w.add(0, 3_590_000)
    for key in range(1, 2_001):
        w.add(key, key * 100)
    started = time.perf_counter()
    for key in range(1, 2_001):
        assert w.advance(key * 100) == [(key * 100, key)]
        assert w.next_due_ms() == ((key + 1) * 100 if key < 2_000 else 3_590_000)
    assert time.perf_counter() - started < 1.0
    assert w.advance(3_600_000) == [(3_590_000, 0)]


def test_a_stale_busy_tick_does_not_stand_for_a_later_tick_in_its_slot() -> None:
    w = _wheel(precision_ms=1, slots=4, now_ms=0)
    w.add(1, 3)
    w.add(2, 1)
    w.remove(1)  # tick 3's busy item goes stale (and stays: 2 is the earliest)
    assert w.advance(1) == [(1, 2)]
    assert w.advance(5) == []  # tick 3 passed: slot 3 now means tick 7
    w.add(3, 7)  # slot 3 again
    w.add(4, 6)
    w.add(5, 5)
    w.remove(5)  # drops the cached earliest
    assert w.next_due_ms() == 6
    assert w.advance(6) == [(6, 4)]
    assert w.advance(7) == [(7, 3)]


def test_compacting_the_busy_heap_keeps_the_current_slot() -> None:
    w = _wheel(precision_ms=1, slots=100, now_ms=1_000)
    w.add(0, 1_000)  # the current slot, due now
    w.add(1, 500)  # past due: the current slot too
    for _ in range(200):  # churn another slot until the busy heap is compacted
        w.add(2, 1_050)
        w.remove(2)
    assert len(w._busy) < 100
    assert w.remove(1)  # the earliest: next_due_ms now asks the busy heap
    assert w.next_due_ms() == 1_000
    assert w.advance(1_001) == [(1_000, 0)]  # a new tick: a sweep by the busy heap


def test_next_due_follows_adds_removes_and_firing() -> None:
    w = _wheel(precision_ms=10, slots=4)
    w.add(1, 300)
    assert w.next_due_ms() == 300
    w.add(2, 25)
    assert w.next_due_ms() == 25
    w.add(3, 25)
    w.remove(2)
    assert w.next_due_ms() == 25
    w.remove(3)
    assert w.next_due_ms() == 300
    w.add(4, 5)
    assert w.advance(10) == [(5, 4)]
    assert w.next_due_ms() == 300
    w.remove(1)
    assert w.next_due_ms() is None


def test_string_keys() -> None:
    w: TimerWheel[str] = TimerWheel(precision_ms=5, slots=3, now_ms=0)
    w.add("b", 10)
    w.add("a", 10)
    assert w.advance(10) == [(10, "a"), (10, "b")]
