"""Time is injected: production code asks a Clock, tests advance a ManualClock."""

from __future__ import annotations

import time
from typing import Protocol

__all__ = ["Clock", "SystemClock"]


class Clock(Protocol):
    def now_ms(self) -> int:
        """Wall-clock milliseconds since the epoch (stored in records, compared with retention)."""
        ...

    def monotonic_ms(self) -> float:
        """Monotonic milliseconds, for intervals and deadlines."""
        ...


class SystemClock:
    """The real clock."""

    def now_ms(self) -> int:
        return time.time_ns() // 1_000_000

    def monotonic_ms(self) -> float:
        return time.monotonic_ns() / 1_000_000
