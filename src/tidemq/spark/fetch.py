"""The connector's I/O, on the client: which queues a subscription covers, their bounds
and the positions they resolve to (driver side), and the reading of one offset range as
Arrow record batches (executors). No pyspark here.

`read_range` runs on executors. It keeps one fetch in flight ahead of the decoding (the
next request leaves as soon as the previous answer says where it ends), and hands each
answer to `records_to_arrow`, which builds the rows without a Python loop per message.
Results equal `StreamConsumer`'s for the same range: same records, same messages, same
order.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

from tidemq.client.cluster import ClusterClient
from tidemq.core.arrow import records_to_arrow
from tidemq.core.errors import (
    OffsetOutOfRange,
    QueueNotFound,
    RequestTimeout,
    TidemqError,
    TopicNotFound,
)
from tidemq.protocol.commands import FetchRequest, FetchResponse
from tidemq.spark._runtime import runtime
from tidemq.spark.offsets import Bounds, Positions, TopicQueue, resolve_positions
from tidemq.spark.options import (
    Assign,
    OffsetSpec,
    OptionError,
    ReadOptions,
    Subscribe,
    Subscription,
)
from tidemq.spark.planning import OffsetRange, ranges_between
from tidemq.spark.retry import retrying
from tidemq.spark.tier_files import offloaded_files, read_offloaded

__all__ = [
    "batch_ranges",
    "initial_positions",
    "offsets_for_time",
    "queue_bounds",
    "read_range",
    "stream_bounds",
    "subscribed_queues",
]

#: Long-poll wait of a fetch that finds nothing yet (the data exists but is not yet
#: readable: async flush); short, because the range's end is known to exist.
_FETCH_WAIT_MS: Final = 200


async def subscribed_queues(
    cluster: ClusterClient, subscription: Subscription, *, strict: bool
) -> list[TopicQueue]:
    """The (topic, queue) pairs the subscription covers now, sorted. `strict` (batch
    reads): a subscribed or assigned topic or queue that does not exist is an error;
    otherwise (streams) it is simply not there yet."""
    routes = await cluster.refresh_routes(force=True)
    out: list[TopicQueue] = []
    if isinstance(subscription, Assign):
        for topic, queues in subscription.queues:
            if topic not in routes:
                if strict:
                    raise TopicNotFound(f"assigned topic {topic!r} does not exist")
                continue
            count = routes.queue_count(topic)
            missing = [q for q in queues if q >= count]
            if missing and strict:
                raise QueueNotFound(
                    f"topic {topic!r} has {count} queues; assigned queues {missing} do not exist"
                )
            out.extend((topic, q) for q in queues if q < count)
        return sorted(out)
    if isinstance(subscription, Subscribe):
        topics = list(subscription.topics)
        missing_topics = [t for t in topics if t not in routes]
        if missing_topics and strict:
            raise TopicNotFound(f"subscribed topics {missing_topics} do not exist")
        topics = [t for t in topics if t in routes]
    else:
        topics = [t for t in routes.topics() if subscription.matches(t)]
    for topic in topics:
        out.extend((topic, q) for q in range(routes.queue_count(topic)))
    return sorted(out)


async def queue_bounds(
    cluster: ClusterClient, queues: Iterable[TopicQueue], *, strict: bool
) -> dict[TopicQueue, Bounds]:
    """Each queue's [min_offset, max_offset), asked of their brokers concurrently. With
    `strict` False a queue whose broker cannot answer now (retriable error) is left out."""
    tqs = list(queues)
    answers = await asyncio.gather(
        *(cluster.list_offsets(t, q) for t, q in tqs), return_exceptions=True
    )
    out: dict[TopicQueue, Bounds] = {}
    for tq, answer in zip(tqs, answers, strict=True):
        if isinstance(answer, BaseException):
            if isinstance(answer, TidemqError):
                cluster.invalidate(answer)
                if not strict and answer.retriable:
                    continue
            raise answer
        out[tq] = Bounds(answer.min_offset, answer.max_offset)
    return out


async def offsets_for_time(
    cluster: ClusterClient, queues: Iterable[TopicQueue], timestamp_ms: int
) -> dict[TopicQueue, int]:
    """Each queue's first message at or after `timestamp_ms` (its end if none)."""
    return await offsets_for_times(cluster, dict.fromkeys(queues, timestamp_ms))


async def offsets_for_times(
    cluster: ClusterClient, times: Mapping[TopicQueue, int]
) -> dict[TopicQueue, int]:
    """Each queue's first message at or after its own time (its end if none)."""
    tqs = list(times)
    answers = await asyncio.gather(*(cluster.list_offsets(t, q, times[(t, q)]) for t, q in tqs))
    out: dict[TopicQueue, int] = {}
    for tq, answer in zip(tqs, answers, strict=True):
        found = answer.offset_for_time
        out[tq] = answer.max_offset if found is None else found
    return out


async def spec_times(
    cluster: ClusterClient, spec: OffsetSpec, queues: Iterable[TopicQueue]
) -> dict[TopicQueue, int] | None:
    """The offsets a timestamp spec resolves to, for the queues it covers (None for a spec
    of offsets)."""
    if spec.kind == "timestamp":
        return await offsets_for_time(cluster, queues, spec.timestamp_ms)
    if spec.kind == "timestamps":
        given = spec.as_dict()
        return await offsets_for_times(cluster, {tq: given[tq] for tq in queues if tq in given})
    return None


async def _fetch(cluster: ClusterClient, request: FetchRequest) -> tuple[FetchResponse, bytes]:
    """One fetch, retried (with the client's backoff) while the failure is retriable."""
    timeout = cluster.config.request_timeout_ms + request.max_wait_ms

    async def once() -> tuple[FetchResponse, bytes]:
        address = await cluster.broker_for(request.topic, request.queue, request.offset)
        return await cluster.request(address, request, FetchResponse, timeout_ms=timeout)

    return await retrying(cluster, once)


def _data_loss(r: OffsetRange, position: int, response: FetchResponse) -> OffsetOutOfRange:
    where = f"topic {r.topic!r} queue {r.queue}"
    if position < response.min_offset:
        lost_to = min(response.min_offset, r.end)
        what = (
            f"offsets {position}..{lost_to - 1} of {where} were removed (retention) before "
            f"they were read; the queue now starts at offset {response.min_offset}"
        )
    else:
        what = (
            f"{where} now ends at offset {response.max_offset}, but offsets up to {r.end - 1} "
            "were planned for this read (the topic was deleted and re-created?)"
        )
    return OffsetOutOfRange(
        f"tidemq: data loss: {what}. Set the option failOnDataLoss=false to skip lost offsets."
    )


class _RangeReader:
    """The state of one `read_range`: a position and at most one fetch in flight."""

    def __init__(self, options: ReadOptions, r: OffsetRange, stall_timeout_s: float) -> None:
        self.options = options
        self.range = r
        self.rt = runtime()
        self.cluster = self.rt.cluster(options.bootstrap, options.client)
        self.position = r.start
        self.pending: concurrent.futures.Future[tuple[FetchResponse, bytes]] | None = None
        self.stall_timeout_s = stall_timeout_s
        self.stalled_since: float | None = None

    def fetch(self, offset: int, wait_ms: int = 0) -> None:
        r = self.range
        request = FetchRequest(
            topic=r.topic,
            queue=r.queue,
            offset=offset,
            max_bytes=self.options.fetch_max_bytes,
            max_wait_ms=wait_ms,
        )
        self.pending = self.rt.submit(_fetch(self.cluster, request))

    def answer(self) -> tuple[FetchResponse, bytes]:
        assert self.pending is not None
        try:
            return self.pending.result()
        finally:
            self.pending = None

    def out_of_range(self, response: FetchResponse) -> bool:
        """Handle an out-of-range answer; True when the read goes on."""
        if self.options.fail_on_data_loss:
            raise _data_loss(self.range, self.position, response)
        if self.position > response.max_offset:
            return False  # the queue shrank below the range: nothing left to read
        self.position = response.min_offset
        if self.position >= self.range.end:
            return False
        self.fetch(self.position)
        return True

    def nothing_yet(self, response: FetchResponse) -> bool:
        """Handle an answer without records; True when the read goes on."""
        if response.max_offset <= self.position:
            # Planned offsets that are not there (and never will be).
            if self.options.fail_on_data_loss:
                raise _data_loss(self.range, self.position, response)
            return False
        # Stored but not yet readable (the broker's flush): wait on the broker.
        now = time.monotonic()
        self.stalled_since = self.stalled_since or now
        if now - self.stalled_since > self.stall_timeout_s:
            r = self.range
            raise RequestTimeout(
                f"tidemq: offset {self.position} of {r.topic}/{r.queue} stayed unreadable "
                f"for {self.stall_timeout_s:.0f} s"
            )
        self.fetch(self.position, _FETCH_WAIT_MS)
        return True

    def batches(self) -> Iterator[Any]:
        r = self.range
        if self.position < r.end and self.options.read_from_tier:
            files = self.rt.submit(offloaded_files(self.cluster, r, self.position)).result()
            for batches, after in read_offloaded(files, self.options, r, self.position):
                yield from batches
                self.position = after
        if self.position < r.end:
            yield from self.from_broker()

    def from_broker(self) -> Iterator[Any]:
        r = self.range
        self.fetch(self.position)
        try:
            while True:
                response, body = self.answer()
                if response.status == "offset_out_of_range":
                    if not self.out_of_range(response):
                        return
                    continue
                next_position = max(response.next_offset, self.position)
                if response.status != "found" or next_position == self.position:
                    if not self.nothing_yet(response):
                        return
                    continue
                self.stalled_since = None
                if next_position < r.end:
                    self.fetch(next_position)  # in flight while this answer is decoded
                batch = records_to_arrow(
                    r.topic,
                    r.queue,
                    body,
                    response.record_sizes,
                    start=self.position,
                    end=r.end,
                    include_headers=self.options.include_headers,
                )
                if batch is not None:
                    yield batch
                self.position = next_position
                if self.position >= r.end:
                    return
        finally:
            if self.pending is not None:
                self.pending.cancel()


def read_range(
    options: ReadOptions, r: OffsetRange, *, stall_timeout_s: float = 60.0
) -> Iterator[Any]:
    """The messages at offsets [r.start, r.end) of one queue, as `pa.RecordBatch`es of
    `source_schema(options.include_headers)`, in offset order (one per fetch answer).

    Offsets removed by retention (or a queue that shrank) fail with OffsetOutOfRange, or
    with `failOnDataLoss` false are skipped. Offsets that stay unreadable for
    `stall_timeout_s` fail with RequestTimeout.
    """
    return _RangeReader(options, r, stall_timeout_s).batches()


# --------------------------------------------------------------------------- driver side


async def batch_ranges(options: ReadOptions) -> list[OffsetRange]:
    """The ranges a batch read covers: the subscription's queues from `startingOffsets`
    (or `startingTimestamp`) to `endingOffsets`, resolved against the queues' bounds now."""
    assert options.ending is not None, "a batch read has an end"
    cluster = runtime().cluster(options.bootstrap, options.client)
    queues = await subscribed_queues(cluster, options.subscription, strict=True)
    bounds = await queue_bounds(cluster, queues, strict=True)
    times = await spec_times(cluster, options.starting, bounds)
    start = resolve_positions(
        options.starting, bounds, option="startingOffsets", default="earliest", times=times
    )
    end_times = await spec_times(cluster, options.ending, bounds)
    end = resolve_positions(
        options.ending, bounds, option="endingOffsets", default="latest", times=end_times
    )
    for tq in sorted(start):
        if end[tq] < start[tq]:
            raise OptionError(
                f"option 'endingOffsets': {tq[0]}/{tq[1]} ends at {end[tq]}, before its "
                f"starting offset {start[tq]}"
            )
    return ranges_between(start, end)


async def stream_bounds(options: ReadOptions) -> dict[TopicQueue, Bounds]:
    """The bounds of the queues the stream's subscription covers now (queues whose broker
    does not answer are left out: they keep their position until it does)."""
    cluster = runtime().cluster(options.bootstrap, options.client)
    queues = await subscribed_queues(cluster, options.subscription, strict=False)
    return await queue_bounds(cluster, queues, strict=False)


async def initial_positions(options: ReadOptions) -> Positions:
    """Where a new stream starts: `startingOffsets` (default latest) or
    `startingTimestamp`, for the queues that exist now."""
    cluster = runtime().cluster(options.bootstrap, options.client)
    queues = await subscribed_queues(cluster, options.subscription, strict=False)
    bounds = await queue_bounds(cluster, queues, strict=True)
    times = await spec_times(cluster, options.starting, bounds)
    return resolve_positions(
        options.starting, bounds, option="startingOffsets", default="latest", times=times
    )
