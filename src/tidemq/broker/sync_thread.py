"""The flusher thread: fdatasyncs back to back, as long as the loop asks for more.

The event loop appends to the page cache and, after an append that must become durable,
hands this thread the newest (target position, sync) pair. The thread syncs, reports the
target to the loop, and at once starts the next sync if a newer pair arrived meanwhile.
Requests that arrive during one sync are merged into the next (only the newest pair is
kept: syncing the active segment makes everything before its end durable), which is the
group commit.

Why a thread of its own rather than an executor task per sync: with an executor the next
sync could start only after the loop had learnt that the previous one ended and submitted
another, two thread hops that each wait for the GIL and a CPU (0.1-1 ms each on a busy
2-core machine), during which the disk sat idle. Here the hop back to the loop overlaps
with the next sync.

After a failed fdatasync the thread reports the error and stops: the kernel may already
have dropped the dirty pages, so a later sync that "succeeds" proves nothing (the
fsyncgate lesson); the loop fences the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable

__all__ = ["SyncThread"]


class SyncThread:
    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        on_synced: Callable[[int], None],
        on_failed: Callable[[OSError], None],
    ) -> None:
        """`on_synced(target)` and `on_failed(error)` run on `loop`, in sync order."""
        self._loop = loop
        self._on_synced = on_synced
        self._on_failed = on_failed
        self._cond = threading.Condition()
        self._pending: tuple[int, Callable[[], None]] | None = None
        self._stopping = False
        self._error: OSError | None = None
        self._thread = threading.Thread(target=self._run, name="tidemq-fsync", daemon=True)
        self._thread.start()

    def request(self, target: int, sync: Callable[[], None]) -> None:
        """Make everything up to `target` durable by calling `sync` (on the thread). A
        newer request replaces one that has not started yet."""
        with self._cond:
            self._pending = (target, sync)
            self._cond.notify()

    def stop(self) -> OSError | None:
        """Run the pending sync, if any, then end the thread (blocks until it has).
        Returns the error of the sync that failed, if one did: its report to the loop may
        not have run yet."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()
        return self._error

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._pending is None and not self._stopping:
                    self._cond.wait()
                if self._pending is None:
                    return
                target, sync = self._pending
                self._pending = None
            try:
                sync()
            except OSError as exc:
                self._error = exc
                self._post(self._on_failed, exc)
                return
            self._post(self._on_synced, target)

    def _post(self, callback: Callable[..., None], arg: object) -> None:
        # The loop may be closed already when a shutdown raced this sync; nobody is left
        # to tell.
        with contextlib.suppress(RuntimeError):
            self._loop.call_soon_threadsafe(callback, arg)
