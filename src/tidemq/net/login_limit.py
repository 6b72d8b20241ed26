"""Failed logins per IP address: after `max_failures` within `window_ms`, further logins
from that address are refused at once (without checking the password) until the oldest
failure leaves the window. The 1 s delay of each failed login slows one connection; this
bounds what a guesser gains from opening many connections in parallel.

Bounded: at most `max_addresses` addresses are remembered; past that the one whose last
failure is oldest is forgotten. Time from the injected `Clock` (monotonic), so tests move
a ManualClock instead of sleeping. Not thread-safe: owned by its server's loop.
"""

from __future__ import annotations

from collections import OrderedDict, deque

from tidemq.core.clock import Clock
from tidemq.core.limits import (
    AUTH_FAILURE_WINDOW_MS,
    AUTH_MAX_FAILURES_PER_ADDRESS,
    AUTH_MAX_TRACKED_ADDRESSES,
)

__all__ = ["LoginLimit"]


class LoginLimit:
    def __init__(
        self,
        clock: Clock,
        *,
        max_failures: int = AUTH_MAX_FAILURES_PER_ADDRESS,
        window_ms: int = AUTH_FAILURE_WINDOW_MS,
        max_addresses: int = AUTH_MAX_TRACKED_ADDRESSES,
    ) -> None:
        if max_failures < 1 or window_ms < 1 or max_addresses < 1:
            raise ValueError("max_failures, window_ms and max_addresses must be >= 1")
        self._clock = clock
        self._max = max_failures
        self._window = window_ms
        self._max_addresses = max_addresses
        #: address -> monotonic ms of its failures in the window, oldest first; the
        #: address with the least recent failure first.
        self._failures: OrderedDict[str, deque[float]] = OrderedDict()

    def _recent(self, address: str, now: float) -> deque[float] | None:
        times = self._failures.get(address)
        if times is None:
            return None
        while times and now - times[0] >= self._window:
            times.popleft()
        if not times:
            del self._failures[address]
            return None
        return times

    def refused_for_s(self, address: str) -> float | None:
        """None if `address` may try to log in now; else how long until it may."""
        now = self._clock.monotonic_ms()
        times = self._recent(address, now)
        if times is None or len(times) < self._max:
            return None
        return max(0.0, (times[-self._max] + self._window - now) / 1000)

    def failed(self, address: str) -> None:
        """Record a failed login from `address`."""
        now = self._clock.monotonic_ms()
        times = self._recent(address, now)
        if times is None:
            times = deque(maxlen=self._max)
            self._failures[address] = times
            while len(self._failures) > self._max_addresses:
                self._failures.popitem(last=False)
        times.append(now)
        self._failures.move_to_end(address)

    def tracked(self) -> int:
        """Addresses remembered (for tests and status)."""
        return len(self._failures)
