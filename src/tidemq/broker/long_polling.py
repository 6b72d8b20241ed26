"""Parked fetches: a fetch that finds nothing waits here until data arrives or it times out.

Each (topic, queue) has a data version, bumped by `notify` when the store gateway reports
that the queue received readable data. A fetch notes the version before it reads; if the
read finds nothing it parks with that version, and returns at once if the version moved in
between, so data that lands between the read and the park is never missed. Bounded: at
most `max_waiters` parked at once (beyond that a fetch answers at once with no data, and
the client polls again). After `wake_all` (shutdown) nothing parks any more: a woken fetch
that re-reads and still finds nothing answers at once instead of parking again.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

__all__ = ["LongPolling"]


class LongPolling:
    def __init__(self, max_waiters: int) -> None:
        self._max = max_waiters
        self._waiters: defaultdict[tuple[str, int], set[asyncio.Event]] = defaultdict(set)
        self._versions: defaultdict[tuple[str, int], int] = defaultdict(int)
        self._count = 0
        self._closed = False

    @property
    def parked(self) -> int:
        return self._count

    def version(self, key: tuple[str, int]) -> int:
        return self._versions.get(key, 0)

    async def wait(self, key: tuple[str, int], seen_version: int, timeout_s: float) -> bool:
        """Wait until `key` gets data newer than `seen_version`, or the timeout passes.
        True if there may be new data."""
        return await self.wait_any({key: seen_version}, timeout_s)

    async def wait_any(self, seen: dict[tuple[str, int], int], timeout_s: float) -> bool:
        """`wait` over several queues (a pop receive covers every subscribed queue): until
        any of them gets data newer than its version in `seen`, or the timeout passes."""
        if any(self._versions.get(k, 0) != v for k, v in seen.items()):
            return True
        if self._closed or self._count >= self._max or timeout_s <= 0 or not seen:
            return False
        event = asyncio.Event()
        for key in seen:
            self._waiters[key].add(event)
        self._count += 1
        try:
            async with asyncio.timeout(timeout_s):
                await event.wait()
            return True
        except TimeoutError:
            return False
        finally:
            self._count -= 1
            for key in seen:
                waiters = self._waiters.get(key)
                if waiters is not None:
                    waiters.discard(event)
                    if not waiters:
                        del self._waiters[key]

    def notify(self, keys: set[tuple[str, int]]) -> None:
        for key in keys:
            self._versions[key] += 1
            for event in self._waiters.get(key, ()):
                event.set()

    def forget(self, topic: str) -> None:
        """A deleted topic's versions go (so a new topic of that name starts clean)."""
        for key in [k for k in self._versions if k[0] == topic]:
            del self._versions[key]

    def wake_all(self) -> None:
        """Shutdown: every parked fetch answers now, and no fetch parks from here on."""
        # Waking alone is not enough: a woken fetch re-reads, finds nothing new and would
        # park again until its own deadline, holding up the broker's drain.
        self._closed = True
        for waiters in self._waiters.values():
            for event in waiters:
                event.set()
