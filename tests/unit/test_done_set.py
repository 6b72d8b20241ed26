"""DoneSet edge cases: the watermark moving over runs, merging, idempotence, big runs,
and export/restore with the snapshots it must refuse."""

from __future__ import annotations

import pytest

from tidemq.broker.done_set import DoneSet


def test_in_order_marks_only_move_the_watermark() -> None:
    d = DoneSet()
    for offset in range(100):
        d.mark(offset)
    assert d.low == 100
    assert d.pending_above == 0
    assert d.export() == [(0, 100)]


def test_out_of_order_marks_wait_above_then_fold_into_low() -> None:
    d = DoneSet(10)
    d.mark(12)
    d.mark(15, 3)
    assert d.low == 10
    assert d.pending_above == 4
    assert d.export() == [(0, 10), (12, 13), (15, 18)]
    assert [d.is_done(o) for o in range(9, 19)] == [
        True, False, False, True, False, False, True, True, True, False,
    ]  # fmt: skip
    d.mark(13, 2)  # fills 13..14: joins 12..13 and 15..18 into one run
    assert d.export() == [(0, 10), (12, 18)]
    assert d.run_count == 1
    d.mark(10, 2)  # reaches the run: low jumps over it
    assert d.low == 18
    assert d.pending_above == 0
    assert d.export() == [(0, 18)]


def test_marks_are_idempotent_and_ignore_offsets_below_low() -> None:
    d = DoneSet(5)
    d.mark(0, 3)
    d.mark(4)
    assert d.export() == [(0, 5)]
    d.mark(8, 4)
    d.mark(9, 2)
    d.mark(8, 4)
    d.mark(3, 3)  # partly below low: offset 5 counts
    assert d.low == 6
    assert d.pending_above == 4
    assert d.export() == [(0, 6), (8, 12)]


def test_mark_overlapping_many_runs() -> None:
    d = DoneSet()
    for start in range(10, 100, 10):
        d.mark(start, 2)
    assert d.run_count == 9
    d.mark(15, 70)  # [15, 85) swallows the runs from 20 to 80, not 10..12 nor 90..92
    assert d.export() == [(0, 0), (10, 12), (15, 85), (90, 92)]
    assert d.pending_above == 2 + 70 + 2


def test_adjacent_runs_merge() -> None:
    d = DoneSet()
    d.mark(5, 5)
    d.mark(10, 5)
    d.mark(3, 2)
    assert d.export() == [(0, 0), (3, 15)]


def test_zero_count_is_a_no_op_and_negative_is_refused() -> None:
    d = DoneSet()
    d.mark(4, 0)
    assert d.export() == [(0, 0)]
    with pytest.raises(ValueError, match="count must not be negative"):
        d.mark(4, -1)


def test_a_million_done_offsets_in_few_runs_stay_compact() -> None:
    d = DoneSet()
    d.mark(1, 400_000)
    d.mark(500_000, 600_000)
    assert d.pending_above == 1_000_000
    assert d.export() == [(0, 0), (1, 400_001), (500_000, 1_100_000)]
    for offset in [*range(1, 400_001, 97), *range(500_000, 1_100_000, 101)]:
        d.mark(offset)  # inside the runs: changes nothing
    assert d.run_count == 2
    d.mark(0)
    assert d.low == 400_001
    assert d.pending_above == 600_000


def test_bad_low_is_refused() -> None:
    with pytest.raises(ValueError, match="non-negative"):
        DoneSet(-1)
    with pytest.raises(ValueError, match="non-negative"):
        DoneSet(True)


def test_export_restore_round_trip() -> None:
    d = DoneSet(3)
    d.mark(7, 2)
    d.mark(20)
    again = DoneSet.restore(d.export())
    assert again == d
    assert again.pending_above == 3
    assert DoneSet.restore([[0, 3], [7, 9], [20, 21]]) == d  # JSON gives lists
    assert repr(d) == "DoneSet(low=3, runs=[(7, 9), (20, 21)])"


@pytest.mark.parametrize(
    "data",
    [
        [],
        "0,3",
        [(0,)],
        [(0, 1, 2)],
        [(1, 5)],  # must start with (0, low)
        [(0, -1)],
        [(0, 5), (5, 8)],  # a run touching low would have been folded into it
        [(0, 5), (3, 8)],
        [(0, 5), (8, 8)],  # empty
        [(0, 5), (9, 8)],
        [(0, 5), (8, 10), (10, 12)],  # touching runs would have been merged
        [(0, 5), (12, 14), (8, 10)],  # out of order
        [(0, 5), (8, 10.5)],
        [(0, True)],
        [(0, 5), "ab"],
        None,
    ],
)
def test_restore_refuses_nonsense(data: object) -> None:
    with pytest.raises(ValueError, match="DoneSet snapshot"):
        DoneSet.restore(data)  # type: ignore[arg-type]
