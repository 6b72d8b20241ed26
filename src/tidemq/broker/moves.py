"""Where the moves a service is still writing started in the commit log.

A delivered (timer), published (transaction), retried or dead-lettered (pop) record is
its own "done" mark (ADR 4): the service marks its origin done once the record is
durable, and a restart scans the log from the position in the service's saved state for
the records whose marks it never saved. That position must therefore be at or before
every move whose mark is not in the saved state yet, including one that is durable
already but whose writer has not run again to mark it (the flusher completes the write,
the writer resumes a loop turn later, and a checkpoint can save in between).
`InFlightMoves` keeps the start of every move from before its write until after its
mark, and `scan_position` gives the saved state a position that respects them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Iterator

from tidemq.store.message_store import MessageStore

__all__ = ["InFlightMoves"]


class InFlightMoves:
    def __init__(self) -> None:
        self._starts: dict[int, int] = {}
        self._ids = itertools.count()

    @contextlib.contextmanager
    def writing(self, store: MessageStore) -> Iterator[None]:
        """Around a move's write and its mark: the log is not past its start meanwhile.

        A move cancelled while its write waits for the flush (the broker is stopping) keeps
        its start: its records may be durable without their marks, so the state saved at
        the stop must scan them again (without this, a timer delivered just before a clean
        stop was delivered again after the restart)."""
        token = next(self._ids)
        self._starts[token] = store.end_position
        try:
            yield
        except asyncio.CancelledError:
            raise
        except BaseException:
            del self._starts[token]
            raise
        del self._starts[token]

    def scan_position(self, flushed_position: int) -> int:
        """Where a restart must scan from, for a state saved now."""
        return min([flushed_position, *self._starts.values()])

    def __len__(self) -> int:
        return len(self._starts)
