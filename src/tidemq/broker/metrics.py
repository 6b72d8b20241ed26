"""The broker's traffic counters, kept as plain integers on the data path and read by the
HTTP listener's `/metrics` when Prometheus scrapes (`tidemq.http.metrics_api`).

No Prometheus object is touched per request: a produce adds to two dict entries, a fetch
to two, and the exporter turns them into samples at scrape time. Series are per topic
(bounded by the topic limit); per-queue series are not kept.
"""

from __future__ import annotations

import bisect
import shutil
from collections import defaultdict
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from tidemq.broker.replica_metrics import ReplicaMetrics
from tidemq.store.remote_ranges import tier_settings

if TYPE_CHECKING:
    from tidemq.broker.pop_service import PopService
    from tidemq.broker.static_view import LinkView
    from tidemq.broker.topics import TopicTable
    from tidemq.store.message_store import MessageStore

__all__ = [
    "DURATION_BUCKETS",
    "GROUP_COMMIT_BUCKETS",
    "MAX_QUEUE_SERIES",
    "MESSAGE_SIZE_BUCKETS",
    "Durations",
    "MetricsSnapshot",
    "PopTotals",
    "RequestTimes",
    "TopicTraffic",
    "Traffic",
    "consumer_lag",
    "consumer_lag_latency",
    "disk_usage",
    "pop_totals",
    "queue_ends",
    "queue_lag",
    "reserve_time_ms",
    "tier_backlog",
]


@dataclass(slots=True)
class TopicTraffic:
    messages_in: int = 0
    bytes_in: int = 0
    messages_out: int = 0
    bytes_out: int = 0


@dataclass(slots=True)
class Traffic:
    """Per topic: messages and bytes stored by produce requests (delayed and half
    messages when they are sent) and read by fetches (what left the broker); per kind of
    message (normal, fifo, delay, transaction): the sizes of the messages stored."""

    topics: defaultdict[str, TopicTraffic] = field(
        default_factory=lambda: defaultdict(TopicTraffic)
    )
    sizes: defaultdict[str, Durations] = field(
        default_factory=lambda: defaultdict(lambda: Durations(MESSAGE_SIZE_BUCKETS))
    )

    def stored(self, topic: str, messages: int, size: int, kind: str = "normal") -> None:
        t = self.topics[topic]
        t.messages_in += messages
        t.bytes_in += size
        if messages > 0:
            # Per batch, not per message (the data path never walks the messages): each
            # message counts at its batch's mean size, headers and batch framing included.
            self.sizes[kind].observe_many(size / messages, messages)

    def sent(self, topic: str, messages: int, size: int) -> None:
        t = self.topics[topic]
        t.messages_out += messages
        t.bytes_out += size

    def forget(self, topic: str) -> None:
        """A deleted topic's series end."""
        self.topics.pop(topic, None)


#: Upper bounds (seconds) of the request-duration buckets (Prometheus' `le`); the last
#: bucket, +Inf, is implicit.
DURATION_BUCKETS: tuple[float, ...] = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 5.0, 10.0,
)  # fmt: skip


#: Upper bounds (bytes) of the message-size buckets (RocketMQ's rocketmq_message_size uses
#: 1, 4, 512 KiB, 1, 2 and 4 MiB; the smaller ones here tell 100 B from 1 KiB messages).
MESSAGE_SIZE_BUCKETS: tuple[float, ...] = (
    128, 512, 1024, 4096, 16384, 65536, 524288, 1048576, 2097152, 4194304,
)  # fmt: skip


#: Upper bounds (bytes) of the group-commit size buckets: what one fdatasync made durable.
GROUP_COMMIT_BUCKETS: tuple[float, ...] = (
    1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216,
)  # fmt: skip


@dataclass(slots=True)
class Durations:
    """A histogram (of durations in seconds unless `bounds` says otherwise): per bucket
    counts (the last one +Inf), and the sum of what was observed."""

    bounds: tuple[float, ...] = DURATION_BUCKETS
    counts: list[int] = field(default_factory=list)
    total_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.bounds) + 1)

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total_s += value

    def observe_many(self, value: float, times: int) -> None:
        """`times` observations of `value`."""
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.total_s += value * times

    def copy(self) -> Durations:
        return Durations(self.bounds, list(self.counts), self.total_s)


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """What `/metrics` reports, read from the broker in one step on its loop."""

    #: Per existing user topic that had traffic since the broker started.
    traffic: dict[str, TopicTraffic]
    #: Consumer groups known here (committed offsets or members).
    groups: list[str]
    #: (group, topic) -> messages behind, over the topic's queues stored here.
    lag: dict[tuple[str, str], int]
    #: Messages of open transactions (half messages not yet committed or rolled back).
    half_messages: int
    transactions_committed: int
    transactions_rolled_back: int
    #: Delayed messages waiting for their time, per topic.
    timer_pending: dict[str, int]
    #: Bytes of the commit log from its first segment to its end.
    log_bytes: int
    #: Request kind -> its durations (copied).
    request_times: dict[str, Durations]
    #: Pop consumption, (group, topic) -> messages leased and not yet acked, and
    #: messages moved to the group's dead-letter topic (since the broker started).
    pop_in_flight: dict[tuple[str, str], int] = field(default_factory=dict)
    pop_dead_lettered: dict[tuple[str, str], int] = field(default_factory=dict)
    #: The data directory's file system: (size, free) in bytes; (0, 0) if unknown.
    disk: tuple[int, int] = (0, 0)
    #: With `http.metrics_per_queue` only: (group, topic, queue) -> lag, (topic, queue)
    #: -> end offset, and queues left out past `MAX_QUEUE_SERIES`.
    queue_lag: dict[tuple[str, str, int], int] | None = None
    queue_end: dict[tuple[str, int], int] | None = None
    queues_omitted: int = 0
    #: (group, topic) -> ms since the oldest message the group has not consumed was
    #: stored (0: caught up), over the topic's queues here; static topics left out.
    lag_latency_ms: dict[tuple[str, str], int] = field(default_factory=dict)
    #: ms since the oldest record of the commit log was stored (0: an empty log).
    reserve_time_ms: int = 0
    #: The commit log's fdatasyncs: their durations, and the bytes each made durable.
    fsync: Durations = field(default_factory=Durations)
    group_commit: Durations = field(default_factory=lambda: Durations(GROUP_COMMIT_BUCKETS))
    #: Kind of message -> the sizes of the messages stored (bytes, copied).
    message_sizes: dict[str, Durations] = field(default_factory=dict)
    #: Topic -> messages of committed transactions published, and messages of rolled
    #: back transactions discarded (since the broker started).
    txn_messages_committed: dict[str, int] = field(default_factory=dict)
    txn_messages_rolled_back: dict[str, int] = field(default_factory=dict)
    #: (group, topic, state) -> pop leases: "invisible" (delivered, not acked), "held"
    #: (FIFO, waiting behind an earlier message of its group), "suspended" (attempts used
    #: up, waiting for resume); and (group, topic) -> messages moved to the retry topic.
    pop_leases: dict[tuple[str, str, str], int] = field(default_factory=dict)
    pop_retried: dict[tuple[str, str], int] = field(default_factory=dict)
    #: Tiered storage (None when not configured): per tiered topic, messages on the
    #: broker's disk not yet in the object store; and what was uploaded, with failures.
    tier_backlog: dict[str, int] | None = None
    tier_uploaded_bytes: int = 0
    tier_errors: int = 0
    #: User topics on this broker (with traffic or not).
    topic_number: int = 0
    #: The broker leads a replica group: its replication figures (None: a plain broker).
    replica: ReplicaMetrics | None = None


@dataclass(slots=True)
class RequestTimes:
    """Server-side time per request kind, from decode to answer (a fetch includes its
    long-poll wait)."""

    kinds: defaultdict[str, Durations] = field(default_factory=lambda: defaultdict(Durations))

    def observe(self, kind: str, seconds: float) -> None:
        self.kinds[kind].observe(seconds)


#: Queues reported at most with `http.metrics_per_queue` (the rest are counted in
#: `tidemq_metrics_queues_omitted`): a bound on one scrape's size.
MAX_QUEUE_SERIES = 100_000


def _visible_bounds(
    store: MessageStore,
    topic: str,
    queue: int,
    view_of: Callable[[str, int], LinkView | None],
) -> tuple[int, int] | None:
    """A queue's (start, end) offsets as its consumers see them; None for a static
    queue's older link (its end is where the write end is)."""
    lo, hi = store.queue_bounds(topic, queue)
    view = view_of(topic, queue)
    if view is not None:
        if not view.writable:
            return None
        lo, hi = view.bounds(lo, hi)
    return lo, hi


def queue_lag(
    store: MessageStore,
    topics: TopicTable,
    view_of: Callable[[str, int], LinkView | None],
) -> dict[tuple[str, str, int], int]:
    """(group, topic, queue) -> messages between the committed offset and the queue's
    end, for the queues stored here (a static queue's only where its write end is)."""
    lag: dict[tuple[str, str, int], int] = {}
    for group in store.groups():
        for (topic, queue), committed in store.committed_offsets(group).items():
            if not topics.hosts(topic, queue):
                continue
            bounds = _visible_bounds(store, topic, queue, view_of)
            if bounds is not None:
                lo, hi = bounds
                lag[(group, topic, queue)] = max(0, hi - max(committed, lo))
    return lag


def consumer_lag(
    store: MessageStore,
    topics: TopicTable,
    view_of: Callable[[str, int], LinkView | None],
) -> dict[tuple[str, str], int]:
    """(group, topic) -> messages behind, summed over the topic's queues stored here."""
    lag: dict[tuple[str, str], int] = {}
    for (group, topic, _), behind in queue_lag(store, topics, view_of).items():
        lag[(group, topic)] = lag.get((group, topic), 0) + behind
    return lag


def consumer_lag_latency(
    store: MessageStore,
    topics: TopicTable,
    view_of: Callable[[str, int], LinkView | None],
    now_ms: int,
) -> dict[tuple[str, str], int]:
    """(group, topic) -> ms since the oldest message the group has not consumed was
    stored, the largest over the topic's queues stored here (RocketMQ's
    consumer_lag_latency): one index lookup per lagging queue. Static topics are left
    out (their committed offsets are logical, across links)."""
    out: dict[tuple[str, str], int] = {}
    for group in store.groups():
        for (topic, queue), committed in store.committed_offsets(group).items():
            if not topics.hosts(topic, queue) or view_of(topic, queue) is not None:
                continue
            lo, hi = store.queue_bounds(topic, queue)
            key = (group, topic)
            out.setdefault(key, 0)
            start = max(committed, lo)
            if start >= hi:
                continue
            entries = store.index_of(topic, queue)[1].entries_from(start, 1)
            if entries:
                out[key] = max(out[key], now_ms - entries[0].store_time_ms)
    return out


def reserve_time_ms(store: MessageStore, now_ms: int) -> int:
    """ms since the commit log's oldest record was stored (RocketMQ's
    storage_message_reserve_time): one header read at the log's start."""
    for _, header in store.log.scan_headers(store.log.start_position):
        return max(0, now_ms - header.store_time_ms)
    return 0


def queue_ends(
    store: MessageStore,
    topics: TopicTable,
    view_of: Callable[[str, int], LinkView | None],
    limit: int = MAX_QUEUE_SERIES,
) -> tuple[dict[tuple[str, int], int], int]:
    """(topic, queue) -> end offset of the queues stored here (at most `limit`), and how
    many more were left out."""
    ends: dict[tuple[str, int], int] = {}
    omitted = 0
    for t in topics.all():
        for queue in topics.hosted(t.name):
            bounds = _visible_bounds(store, t.name, queue, view_of)
            if bounds is None:
                continue
            if len(ends) >= limit:
                omitted += 1
                continue
            ends[(t.name, queue)] = bounds[1]
    return ends, omitted


@dataclass(slots=True)
class PopTotals:
    """Pop consumption per (group, topic), summed over the topic's queues here."""

    in_flight: dict[tuple[str, str], int] = field(default_factory=dict)
    dead_lettered: dict[tuple[str, str], int] = field(default_factory=dict)
    retried: dict[tuple[str, str], int] = field(default_factory=dict)
    #: (group, topic, state) -> leases (see `MetricsSnapshot.pop_leases`).
    leases: dict[tuple[str, str, str], int] = field(default_factory=dict)


def pop_totals(pop: PopService, topics: Collection[str]) -> PopTotals:
    """The pop service's counts for the existing topics."""
    out = PopTotals()
    for (group, topic, _), c in pop.counts().items():
        if topic not in topics:
            continue
        key = (group, topic)
        out.in_flight[key] = out.in_flight.get(key, 0) + c.invisible
        out.dead_lettered[key] = out.dead_lettered.get(key, 0) + c.dead_lettered
        out.retried[key] = out.retried.get(key, 0) + c.retried
        for state, n in (("invisible", c.invisible), ("held", c.held), ("suspended", c.suspended)):
            out.leases[(group, topic, state)] = out.leases.get((group, topic, state), 0) + n
    return out


def tier_backlog(store: MessageStore, topics: TopicTable) -> dict[str, int]:
    """Tiered topic -> messages on this broker's disk past what the object store holds:
    O(1) per queue (offsets only, no index read), so a scrape stays cheap."""
    out: dict[str, int] = {}
    for t in topics.all():
        if not tier_settings(t.config).enabled:
            continue
        out[t.name] = sum(store.offload.pending_messages(t.name, q) for q in topics.hosted(t.name))
    return out


def disk_usage(data_dir: Path) -> tuple[int, int]:
    """(size, free bytes) of the file system holding `data_dir`; (0, 0) when it cannot be
    read (the directory removed under a running broker): a gauge, never an error."""
    try:
        usage = shutil.disk_usage(data_dir)
    except OSError:
        return 0, 0
    return usage.total, usage.free
