"""Rate-limited logging: a flood of the same event costs one log line per interval.

A connection flood refused 3,993 times wrote 3,993 warnings; with this, each kind of
event (a short fixed key chosen by the caller: "refused", "read-timeout", ...) writes at
most one line per `interval_ms`, and the next line it writes says how many were left out.
"""

from __future__ import annotations

import logging

from tidemq.core.clock import Clock

__all__ = ["RateLimitedLog"]

#: Kinds remembered at once. Callers pass a fixed set of literal kinds, so this is only a
#: guard against a caller that builds kinds from peer data (they would be forgotten, not
#: accumulated).
_MAX_KINDS = 256


class RateLimitedLog:
    """One logger, at most one line per kind per `interval_ms` (clock: monotonic ms).

    Not thread-safe: owned by one event loop (the TcpServer's)."""

    def __init__(self, logger: logging.Logger, clock: Clock, *, interval_ms: int) -> None:
        assert interval_ms > 0
        self._log = logger
        self._clock = clock
        self._interval_ms = interval_ms
        #: kind -> (monotonic ms of the last line written, lines left out since)
        self._kinds: dict[str, tuple[float, int]] = {}

    def log(self, level: int, kind: str, msg: str, *args: object, exc_info: bool = False) -> bool:
        """Log `msg % args` unless a line of this kind was written less than an interval
        ago (then count it). True if the line was written."""
        now = self._clock.monotonic_ms()
        last = self._kinds.get(kind)
        if last is not None and now - last[0] < self._interval_ms:
            self._kinds[kind] = (last[0], last[1] + 1)
            return False
        suppressed = last[1] if last is not None else 0
        if last is None and len(self._kinds) >= _MAX_KINDS:
            self._kinds.clear()
        self._kinds[kind] = (now, 0)
        if suppressed:
            msg += " (%d more like this in the last %.0f s)"
            args = (*args, suppressed, (now - last[0]) / 1000 if last else 0.0)
        self._log.log(level, msg, *args, exc_info=exc_info)
        return True

    def suppressed(self, kind: str) -> int:
        """Lines of `kind` left out since the last one written (for tests and status)."""
        last = self._kinds.get(kind)
        return last[1] if last is not None else 0
