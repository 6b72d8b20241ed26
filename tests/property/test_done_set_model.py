"""DoneSet against a model: the initial watermark plus a plain set of done offsets.

Offsets are drawn from a small range so marks overlap, touch and fill gaps often, with
the occasional long run; every few steps the DoneSet is replaced by its own
export -> restore round trip (also through lists, as JSON would give them).
"""

from __future__ import annotations

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tidemq.broker.done_set import DoneSet

_SPAN = 120  # offsets drawn from [0, _SPAN]; the initial low is at most 40


def _runs(offsets: list[int]) -> list[tuple[int, int]]:
    """Sorted offsets as half-open runs of consecutive offsets."""
    runs: list[tuple[int, int]] = []
    for offset in offsets:
        if runs and runs[-1][1] == offset:
            runs[-1] = (runs[-1][0], offset + 1)
        else:
            runs.append((offset, offset + 1))
    return runs


class DoneSetMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.base = 0
        self.done: set[int] = set()
        self.subject = DoneSet()

    @initialize(low=st.integers(min_value=0, max_value=40))
    def create(self, low: int) -> None:
        self.base = low
        self.subject = DoneSet(low)

    def _model_low(self) -> int:
        low = self.base
        while low in self.done:
            low += 1
        return low

    def _model_is_done(self, offset: int) -> bool:
        return offset < self.base or offset in self.done

    @rule(
        offset=st.integers(min_value=0, max_value=_SPAN),
        count=st.integers(min_value=0, max_value=6),
    )
    def mark(self, offset: int, count: int) -> None:
        self.subject.mark(offset, count)
        self.done.update(range(max(offset, self.base), offset + count))

    @rule(offset=st.integers(min_value=0, max_value=_SPAN), count=st.integers(20, 80))
    def mark_long_run(self, offset: int, count: int) -> None:
        self.subject.mark(offset, count)
        self.done.update(range(max(offset, self.base), offset + count))

    @rule()
    def mark_low(self) -> None:
        low = self._model_low()
        self.subject.mark(low)
        self.done.add(low)

    @rule(as_lists=st.booleans())
    def export_and_restore(self, as_lists: bool) -> None:
        exported = self.subject.export()
        data = [list(pair) for pair in exported] if as_lists else exported
        restored = DoneSet.restore(data)
        assert restored == self.subject
        assert restored.export() == exported
        self.subject = restored

    @invariant()
    def matches_model(self) -> None:
        low = self._model_low()
        above = sorted(o for o in self.done if o > low)
        assert self.subject.low == low
        assert self.subject.pending_above == len(above)
        assert self.subject.export() == [(0, low), *_runs(above)]
        assert self.subject.run_count == len(_runs(above))
        top = max(self.done, default=self.base) + 3
        for offset in range(max(self.base - 2, 0), top):
            assert self.subject.is_done(offset) == self._model_is_done(offset)


DoneSetMachine.TestCase.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)
TestDoneSetModel = DoneSetMachine.TestCase
