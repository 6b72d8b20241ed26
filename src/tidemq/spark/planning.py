"""Input partitions: which offset ranges each Spark task reads. Pure Python: no pyspark.

One partition per queue range, as Kafka's source does, except that by default a range
far larger than the mean (one queue holding most of the data) is cut into pieces about
the mean's size, never below `AUTO_SPLIT_MIN_OFFSETS`: one busy queue would otherwise be
one long task while the others sit idle. With `minPartitions` given, ranges are split in
proportion to their sizes into at least that many pieces as equal as possible (and
`minPartitions=1` keeps one partition per range). The plan depends only on its
arguments, so a replayed micro-batch is planned the same way.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Final

from tidemq.spark.offsets import TopicQueue

__all__ = ["AUTO_SPLIT_MIN_OFFSETS", "OffsetRange", "plan_partitions", "ranges_between"]

#: Pieces the default plan cuts are never smaller than this (a task's start costs more
#: than reading fewer messages).
AUTO_SPLIT_MIN_OFFSETS: Final = 100_000


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """Offsets [start, end) of one queue."""

    topic: str
    queue: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


def ranges_between(
    start: Mapping[TopicQueue, int], end: Mapping[TopicQueue, int]
) -> list[OffsetRange]:
    """The non-empty ranges from `start` to `end`, sorted by (topic, queue). A queue only
    in `end` was just discovered and is read from the next batch on; a queue whose end is
    below its start was reset (data loss handled by the planner) and reads nothing."""
    out = []
    for tq in sorted(end):
        if tq in start and end[tq] > start[tq]:
            out.append(OffsetRange(tq[0], tq[1], start[tq], end[tq]))
    return out


def _split(r: OffsetRange, parts: int) -> list[OffsetRange]:
    base, extra = divmod(r.size, parts)
    out = []
    at = r.start
    for i in range(parts):
        n = base + (1 if i < extra else 0)
        out.append(OffsetRange(r.topic, r.queue, at, at + n))
        at += n
    return out


def plan_partitions(ranges: Iterable[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """One partition per non-empty range, ranges far above the mean cut to about its size
    (`min_partitions` None); or, when `min_partitions` asks for more than one per range,
    the ranges split into about `min_partitions` pieces in proportion to their sizes (at
    least one piece per range, never an empty piece)."""
    live = [r for r in ranges if r.size > 0]
    if min_partitions is None:
        return _balanced(live)
    if len(live) >= min_partitions:
        return live
    total = sum(r.size for r in live)
    parts = [max(1, r.size * min_partitions // total) for r in live]
    # Hand out what flooring left over, largest fractional remainder first (ties: the
    # earlier range), never more pieces than offsets.
    left = min_partitions - sum(parts)
    order = sorted(
        range(len(live)),
        key=lambda i: (-(live[i].size * min_partitions % total), i),
    )
    while left > 0:
        grown = False
        for i in order:
            if left == 0:
                break
            if parts[i] < live[i].size:
                parts[i] += 1
                left -= 1
                grown = True
        if not grown:
            break
    out: list[OffsetRange] = []
    for r, n in zip(live, parts, strict=True):
        out.extend(_split(r, min(n, r.size)))
    return out


def _balanced(live: list[OffsetRange]) -> list[OffsetRange]:
    """Each range in round(size / piece) pieces, piece = the mean range size, at least
    `AUTO_SPLIT_MIN_OFFSETS`: ranges near the mean or small stay whole."""
    if not live:
        return live
    piece = max(sum(r.size for r in live) / len(live), AUTO_SPLIT_MIN_OFFSETS)
    out: list[OffsetRange] = []
    for r in live:
        out.extend(_split(r, max(1, round(r.size / piece))))
    return out
