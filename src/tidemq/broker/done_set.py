"""Which offsets of a dense offset sequence are finished: a low watermark plus done runs above.

Scheduled-message timer records and transaction half records are appended in offset
order but finish (delivered, committed, cancelled) in any order. Recovery needs to know
which of them are still pending, and the broker needs to know how far the log is finished
without gaps (the low watermark: every offset below `low` is done, `low` itself is not).

Above `low` the done offsets are kept as sorted, disjoint, non-adjacent half-open runs
``[start, end)`` in two parallel lists searched with bisect. Marking merges a new run with
its neighbours, and a run that reaches `low` is absorbed into it, so memory is
proportional to the number of gaps, not to the number of done offsets: a million done
offsets in three runs are three pairs of ints. Marking is O(log n + r) for n runs and r
runs merged away (plus the list shift of one insertion); `is_done` is O(log n).

`export` gives a compact, JSON-friendly snapshot: ``(0, low)`` first (all of ``[0, low)``
is done), then the runs above low in order; `restore` checks that shape and rebuilds.

Not thread-safe. No I/O.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence

__all__ = ["DoneSet"]


def _is_int(value: object) -> bool:
    # bool is an int subclass; True as an offset is a corrupted snapshot, not offset 1.
    return isinstance(value, int) and not isinstance(value, bool)


class DoneSet:
    """Done offsets as a low watermark plus sorted disjoint runs above it."""

    def __init__(self, low: int = 0) -> None:
        if not _is_int(low) or low < 0:
            raise ValueError(f"low must be a non-negative int, got {low!r}")
        self._low = low
        # Runs [starts[i], ends[i]) above low: starts[0] > low, ends[i] < starts[i + 1].
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._above = 0  # done offsets in the runs

    @property
    def low(self) -> int:
        """Every offset below `low` is done; `low` itself is not."""
        return self._low

    @property
    def pending_above(self) -> int:
        """How many done offsets are stored above `low` (done out of order), for metrics."""
        return self._above

    @property
    def run_count(self) -> int:
        """How many separate runs are stored above `low` (what the memory is proportional to)."""
        return len(self._starts)

    def is_done(self, offset: int) -> bool:
        if offset < self._low:
            return True
        i = bisect_right(self._starts, offset) - 1
        return i >= 0 and offset < self._ends[i]

    def mark(self, offset: int, count: int = 1) -> None:
        """Mark ``[offset, offset + count)`` done; already-done offsets are ignored."""
        if count < 0:
            raise ValueError(f"count must not be negative, got {count}")
        start = max(offset, self._low)
        end = offset + count
        if end <= start:
            return
        starts, ends = self._starts, self._ends
        # Runs i..j-1 overlap or touch [start, end): ends[k] >= start and starts[k] <= end.
        i = bisect_left(ends, start)
        j = bisect_right(starts, end)
        if i < j:
            start = min(start, starts[i])
            end = max(end, ends[j - 1])
            merged = sum(ends[i:j]) - sum(starts[i:j])
        else:
            merged = 0
        if start == self._low:
            # The run reaches the watermark: absorb it (it can only be the first run).
            del starts[:j]
            del ends[:j]
            self._above -= merged
            self._low = end
            return
        starts[i:j] = [start]
        ends[i:j] = [end]
        self._above += (end - start) - merged

    def export(self) -> list[tuple[int, int]]:
        """``[(0, low), (start, end), ...]``: the done runs, the first one from 0 to `low`."""
        return [(0, self._low), *zip(self._starts, self._ends, strict=True)]

    @classmethod
    def restore(cls, data: Sequence[Sequence[int]]) -> DoneSet:
        """Rebuild from `export`'s shape; ValueError if `data` is not that shape."""
        if isinstance(data, str | bytes) or not isinstance(data, Sequence) or not data:
            raise ValueError("a DoneSet snapshot is a non-empty list of (start, end) pairs")
        pairs: list[tuple[int, int]] = []
        for i, pair in enumerate(data):
            if (
                isinstance(pair, str | bytes)
                or not isinstance(pair, Sequence)
                or len(pair) != 2
                or not all(_is_int(v) for v in pair)
            ):
                raise ValueError(f"DoneSet snapshot entry {i} is not a pair of ints: {pair!r}")
            pairs.append((pair[0], pair[1]))
        zero, low = pairs[0]
        if zero != 0 or low < 0:
            raise ValueError(f"DoneSet snapshot must start with (0, low >= 0), got {pairs[0]}")
        done = cls(low)
        prev_end = low
        for start, end in pairs[1:]:
            # Exactly what `export` writes: runs above low, ascending, with gaps between.
            if not prev_end < start < end:
                raise ValueError(
                    f"DoneSet snapshot run ({start}, {end}) is empty, out of order or not"
                    f" separated from what precedes it (ending at {prev_end})"
                )
            done._starts.append(start)
            done._ends.append(end)
            done._above += end - start
            prev_end = end
        return done

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, DoneSet):
            return NotImplemented
        return (self._low, self._starts, self._ends) == (other._low, other._starts, other._ends)

    __hash__ = None  # type: ignore[assignment]  # mutable

    def __repr__(self) -> str:
        return f"DoneSet(low={self._low}, runs={list(zip(self._starts, self._ends, strict=True))})"
