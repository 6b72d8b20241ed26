"""Rows and micro-batches of a pipeline's queries, counted from every progress event.

A query's `recentProgress` keeps only the last `spark.sql.streaming.numRecentProgressUpdates`
(100 by default) progress reports, so totals summed from it undercount any run longer than
that ("archived 79,200 messages in 99 micro-batches" for 100,000 in 125: issue 21). A
listener registered before the queries start sees every report instead.

Spark delivers listener events on its own thread, after the fact: `totals` waits (at most
`TERMINATION_WAIT_S`) for the query's termination event, which Spark posts after its last
progress event, so the totals of a finished query are complete. `close` waits the same way
for the queries it is given before it removes the listener: removed any earlier, the
listener misses the last batch's progress (an analytics run counted 1,200 of 1,500 rows
for its last query when the listener went before the event came).

This module imports pyspark: the pipelines import it when they run, not when imported.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from pyspark.sql.streaming.listener import StreamingQueryListener

if TYPE_CHECKING:
    from pyspark.sql import SparkSession
    from pyspark.sql.streaming.query import StreamingQuery

__all__ = ["TERMINATION_WAIT_S", "ProgressTotals", "QueryTotals"]

#: How long `totals` waits for a stopped query's last events.
TERMINATION_WAIT_S: Final = 30.0


@dataclass(slots=True)
class QueryTotals:
    #: Input rows of every micro-batch.
    rows: int = 0
    #: Micro-batches that read at least one row.
    batches: int = 0


class _Listener(StreamingQueryListener):
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.counts: dict[str, QueryTotals] = {}
        self.ended: dict[str, threading.Event] = {}

    def _ended(self, query_id: str) -> threading.Event:
        with self.lock:
            return self.ended.setdefault(query_id, threading.Event())

    def onQueryStarted(self, event: Any) -> None:  # noqa: N802 - Spark's name
        self._ended(str(event.id))

    def onQueryProgress(self, event: Any) -> None:  # noqa: N802
        progress = event.progress
        rows = int(progress.numInputRows)
        with self.lock:
            totals = self.counts.setdefault(str(progress.id), QueryTotals())
            totals.rows += rows
            totals.batches += rows > 0

    def onQueryIdle(self, event: Any) -> None:  # noqa: N802
        pass

    def onQueryTerminated(self, event: Any) -> None:  # noqa: N802
        self._ended(str(event.id)).set()


class ProgressTotals:
    """Counts the progress of every query `spark` starts while it is open (a context
    manager: register it before starting the queries it is to count)."""

    def __init__(self, spark: SparkSession) -> None:
        self._spark = spark
        self._listener = _Listener()
        spark.streams.addListener(self._listener)
        self._open = True

    def totals(self, query: StreamingQuery, *, wait_s: float = TERMINATION_WAIT_S) -> QueryTotals:
        """`query`'s totals so far; for a query that has stopped, once its last events are
        in (waiting at most `wait_s`)."""
        query_id = str(query.id)
        if not query.isActive:
            self._listener._ended(query_id).wait(wait_s)
        with self._listener.lock:
            counted = self._listener.counts.get(query_id, QueryTotals())
            return QueryTotals(counted.rows, counted.batches)

    def close(
        self, queries: Iterable[StreamingQuery] = (), *, wait_s: float = TERMINATION_WAIT_S
    ) -> None:
        """Stop counting. The totals of `queries` that have stopped are complete first
        (waiting at most `wait_s` in all for their last events); the counts stay readable."""
        if not self._open:
            return
        deadline = time.monotonic() + wait_s
        for query in queries:
            if not query.isActive:
                left = max(0.0, deadline - time.monotonic())
                self._listener._ended(str(query.id)).wait(left)
        self._open = False
        self._spark.streams.removeListener(self._listener)

    def __enter__(self) -> ProgressTotals:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
