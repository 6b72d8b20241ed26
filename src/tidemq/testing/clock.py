"""A clock that moves only when a test says so."""

from __future__ import annotations

__all__ = ["ManualClock"]


class ManualClock:
    """Implements `tidemq.core.clock.Clock`. Tests call `advance(ms)`; nothing sleeps."""

    def __init__(self, now_ms: int = 1_700_000_000_000) -> None:
        self._now_ms = now_ms
        self._monotonic_ms = 0.0

    def now_ms(self) -> int:
        return self._now_ms

    def monotonic_ms(self) -> float:
        return self._monotonic_ms

    def advance(self, ms: float) -> None:
        assert ms >= 0, "time does not go backwards on a ManualClock; use set_wall_ms"
        self._now_ms += int(ms)
        self._monotonic_ms += ms

    def set_wall_ms(self, now_ms: int) -> None:
        """Move the wall clock only (to test a clock that jumps back)."""
        self._now_ms = now_ms
