"""`GET /metrics`: the broker's counters and gauges in Prometheus text format, with
RocketMQ's metric names and labels where they exist (`rocketmq_messages_in_total`,
`topic`, `consumer_group`) and `tidemq_...` for the rest.

Everything is read at scrape time from one `Broker.metrics()` snapshot (the data path
only adds to plain integers, `tidemq.broker.metrics`); series are per topic and per
(group, topic), never per queue.

A replica group member adds its replication series (`tidemq_replica_...`) in either
role: a leader beside its broker's series, a follower (no broker runs) with only them and
its commit log's and disk's gauges (`tidemq.broker.replica_metrics`).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tidemq.broker.metrics import Durations, MetricsSnapshot
from tidemq.broker.replica_metrics import ReplicaMetrics, ReplicaRole

__all__ = ["CONTENT_TYPE", "Snapshot", "metrics_routes"]

#: Prometheus text exposition format 0.0.4.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


#: What `/metrics` reports: a broker's snapshot, or a following member's figures.
Snapshot = MetricsSnapshot | ReplicaMetrics


class _BrokerCollector(Collector):
    def __init__(self, snapshot: Callable[[], Snapshot]) -> None:
        self._snapshot = snapshot

    def collect(self) -> Iterator[Metric]:
        s = self._snapshot()
        if isinstance(s, ReplicaMetrics):
            yield from _replica(s)
            yield from _storage(s.log_bytes, s.disk)
            return
        if s.replica is not None:
            yield from _replica(s.replica)
        yield from _traffic(s)
        yield GaugeMetricFamily("rocketmq_topic_number", "Topics on this broker.", s.topic_number)
        yield GaugeMetricFamily(
            "rocketmq_consumer_group_number", "Consumer groups known here.", len(s.groups)
        )
        yield from _lag(s)
        yield from _latency(s)
        yield GaugeMetricFamily(
            "rocketmq_half_messages", "Messages of open transactions.", s.half_messages
        )
        yield from _transactions(s)
        yield CounterMetricFamily(
            "tidemq_transactions_committed", "Transactions committed.", s.transactions_committed
        )
        yield CounterMetricFamily(
            "tidemq_transactions_rolled_back",
            "Transactions rolled back (by the producer or after failed check-backs).",
            s.transactions_rolled_back,
        )
        yield _labeled(
            GaugeMetricFamily,
            "tidemq_timer_pending_messages",
            "Delayed messages not yet due.",
            ["topic"],
            s.timer_pending,
        )
        yield from _storage(s.log_bytes, s.disk)
        yield from _durations(s)
        yield from _pop(s)
        yield from _tier(s)


def _storage(log_bytes: int | None, disk: tuple[int, int] | None) -> Iterator[Metric]:
    if log_bytes is not None:
        yield GaugeMetricFamily(
            "tidemq_commit_log_bytes", "Bytes of the commit log kept on disk.", log_bytes
        )
    if disk is not None:
        total, free = disk
        yield GaugeMetricFamily(
            "tidemq_disk_total_bytes", "Size of the data directory's file system.", total
        )
        yield GaugeMetricFamily(
            "tidemq_disk_free_bytes", "Free bytes on the data directory's file system.", free
        )


def _replica(r: ReplicaMetrics) -> Iterator[Metric]:
    role = GaugeMetricFamily(
        "tidemq_replica_role",
        "This replica group member's role: 1 for the one it has (none: between two roles, "
        "its broker starting or stopping).",
        labels=["group", "member", "role"],
    )
    for each in ReplicaRole:
        role.add_metric([r.group, r.member, each.value], 1 if each is r.role else 0)
    yield role
    yield GaugeMetricFamily(
        "tidemq_replica_epoch",
        "The epoch this member leads under, or of the leader it follows (0: none known).",
        r.epoch,
    )
    positions = (
        ("log_end", "This member's log end (a byte position of the group's log).", r.log_end),
        ("durable", "This member's durable (flushed) log position.", r.durable),
        (
            "committed",
            "The group's committed position as this member knows it: every in-sync member "
            "holds the log before it.",
            r.committed,
        ),
        (
            "lag",
            "Bytes this member's log is behind the leader's end (a follower: the end at the "
            "leader's last answer; 0 on the leader).",
            r.lag_bytes,
        ),
    )
    for name, help_text, value in positions:
        if value is not None:
            yield GaugeMetricFamily(f"tidemq_replica_{name}_bytes", help_text, value)
    if r.role is ReplicaRole.FOLLOWER:
        yield from _following(r)
    elif r.role is ReplicaRole.LEADER:
        yield GaugeMetricFamily(
            "tidemq_replica_in_sync_members", "Members in the group's in-sync set.", len(r.in_sync)
        )
        yield GaugeMetricFamily(
            "tidemq_replica_min_insync_replicas",
            "Members that must hold a record before it is acknowledged.",
            r.min_insync_replicas,
        )
        yield _labeled(
            GaugeMetricFamily,
            "tidemq_replica_follower_lag_bytes",
            "Bytes each follower's log is behind the leader's end (followers that fetched "
            "in this term).",
            ["follower"],
            r.follower_lag,
        )


def _following(r: ReplicaMetrics) -> Iterator[Metric]:
    if r.fetch_age_s is not None:
        yield GaugeMetricFamily(
            "tidemq_replica_fetch_age_seconds",
            "Seconds since a leader last answered this follower's fetch.",
            r.fetch_age_s,
        )
    yield CounterMetricFamily(
        "tidemq_replica_fetch_rounds",
        "Fetches the leader answered since this member began following.",
        r.fetch_rounds,
    )
    yield CounterMetricFamily(
        "tidemq_replica_truncations",
        "Cuts of this member's log (records the group never committed) since it began following.",
        r.truncations,
    )


def _labeled(
    kind: type[GaugeMetricFamily] | type[CounterMetricFamily],
    name: str,
    help_text: str,
    labels: list[str],
    values: Mapping[Any, float],
) -> Metric:
    """A family with one sample per entry of `values`, whose key holds the label values
    (one value, or a tuple in `labels`' order), in key order."""
    family = kind(name, help_text, labels=labels)
    for key, value in sorted(values.items()):
        parts = key if isinstance(key, tuple) else (key,)
        family.add_metric([str(p) for p in parts], value)
    return family


_GROUP_TOPIC = ["consumer_group", "topic"]


def _lag(s: MetricsSnapshot) -> Iterator[Metric]:
    name = "rocketmq_consumer_lag_messages"
    help_text = (
        "Messages not yet consumed (committed) by the group, over the topic's queues "
        "stored on this broker."
    )
    if s.queue_lag is None:
        yield _labeled(GaugeMetricFamily, name, help_text, _GROUP_TOPIC, s.lag)
        return
    # Opted in (http.metrics_per_queue): one label set per family, so the per-queue
    # series replace the per-topic ones (sum by topic gives those back).
    yield _labeled(GaugeMetricFamily, name, help_text, [*_GROUP_TOPIC, "queue_id"], s.queue_lag)
    yield _labeled(
        GaugeMetricFamily,
        "tidemq_queue_end_offset",
        "The offset the queue's next message will get (its rate is the queue's rate in).",
        ["topic", "queue_id"],
        s.queue_end or {},
    )
    yield GaugeMetricFamily(
        "tidemq_metrics_queues_omitted",
        "Queues left out of the per-queue series (over the limit of one scrape).",
        s.queues_omitted,
    )


def _latency(s: MetricsSnapshot) -> Iterator[Metric]:
    yield _labeled(
        GaugeMetricFamily,
        "rocketmq_consumer_lag_latency",
        "Milliseconds since the oldest message the group has not consumed was stored "
        "(0: caught up), over the topic's queues stored on this broker.",
        _GROUP_TOPIC,
        s.lag_latency_ms,
    )
    yield GaugeMetricFamily(
        "rocketmq_storage_message_reserve_time",
        "Milliseconds since the oldest message the commit log keeps was stored.",
        s.reserve_time_ms,
    )


def _pop(s: MetricsSnapshot) -> Iterator[Metric]:
    yield _labeled(
        GaugeMetricFamily,
        "rocketmq_consumer_inflight_messages",
        "Messages leased to pop consumers and not yet acknowledged.",
        _GROUP_TOPIC,
        s.pop_in_flight,
    )
    yield _labeled(
        CounterMetricFamily,
        "rocketmq_send_to_dlq_messages",
        "Messages moved to the group's dead-letter topic after their attempts.",
        _GROUP_TOPIC,
        s.pop_dead_lettered,
    )
    yield _labeled(
        GaugeMetricFamily,
        "tidemq_pop_leases",
        "Pop leases by state: invisible (delivered, not acked), held (FIFO, behind an "
        "earlier message of its group), suspended (attempts used up, awaiting resume).",
        [*_GROUP_TOPIC, "state"],
        s.pop_leases,
    )
    yield _labeled(
        CounterMetricFamily,
        "tidemq_pop_retried_messages",
        "Messages a nack moved to the group's retry topic.",
        _GROUP_TOPIC,
        s.pop_retried,
    )


def _transactions(s: MetricsSnapshot) -> Iterator[Metric]:
    yield _labeled(
        CounterMetricFamily,
        "rocketmq_commit_messages",
        "Messages of committed transactions, published to their topic.",
        ["topic"],
        s.txn_messages_committed,
    )
    yield _labeled(
        CounterMetricFamily,
        "rocketmq_rollback_messages",
        "Messages of rolled-back transactions, discarded.",
        ["topic"],
        s.txn_messages_rolled_back,
    )


def _tier(s: MetricsSnapshot) -> Iterator[Metric]:
    if s.tier_backlog is None:
        return  # tiered storage is not configured: no series rather than zeros
    yield _labeled(
        GaugeMetricFamily,
        "tidemq_tier_backlog_messages",
        "Messages on this broker's disk not yet in the object store, per tiered topic.",
        ["topic"],
        s.tier_backlog,
    )
    yield CounterMetricFamily(
        "tidemq_tier_uploaded_bytes", "Bytes uploaded to the object store.", s.tier_uploaded_bytes
    )
    yield CounterMetricFamily(
        "tidemq_tier_errors", "Failed tier operations (each retried).", s.tier_errors
    )


def _buckets(d: Durations) -> list[tuple[str, float]]:
    # As prometheus_client writes its own bucket bounds (1024 -> "1024.0", 0.0001 ->
    # "0.0001"): queries match `le` as a string.
    bounds = [*(repr(float(b)) for b in d.bounds), "+Inf"]
    return list(zip(bounds, itertools.accumulate(d.counts), strict=True))


def _durations(s: MetricsSnapshot) -> Iterator[Metric]:
    family = HistogramMetricFamily(
        "tidemq_request_duration_seconds",
        "Server-side time per request kind, from decode to answer (a fetch includes its "
        "long-poll wait).",
        labels=["kind"],
    )
    for kind, d in sorted(s.request_times.items()):
        family.add_metric([kind], _buckets(d), d.total_s)
    yield family
    yield HistogramMetricFamily(
        "tidemq_fsync_duration_seconds",
        "Time of each fdatasync of the commit log (a group commit).",
        buckets=_buckets(s.fsync),
        sum_value=s.fsync.total_s,
    )
    sizes = HistogramMetricFamily(
        "rocketmq_message_size",
        "Sizes of the messages stored, in bytes, by kind (normal, fifo, delay, "
        "transaction); each message counts at its batch's mean size.",
        labels=["message_type"],
    )
    for kind, d in sorted(s.message_sizes.items()):
        sizes.add_metric([kind], _buckets(d), d.total_s)
    yield sizes
    yield HistogramMetricFamily(
        "tidemq_group_commit_bytes",
        "Bytes of the commit log each fdatasync made durable.",
        buckets=_buckets(s.group_commit),
        sum_value=s.group_commit.total_s,
    )


def _traffic(s: MetricsSnapshot) -> Iterator[Metric]:
    families = {
        "messages_in": CounterMetricFamily(
            "rocketmq_messages_in", "Messages stored by produce requests.", labels=["topic"]
        ),
        "messages_out": CounterMetricFamily(
            "rocketmq_messages_out", "Messages sent to consumers.", labels=["topic"]
        ),
        "bytes_in": CounterMetricFamily(
            "rocketmq_throughput_in", "Bytes of produce requests stored.", labels=["topic"]
        ),
        "bytes_out": CounterMetricFamily(
            "rocketmq_throughput_out", "Bytes of records sent to consumers.", labels=["topic"]
        ),
    }
    for topic, t in sorted(s.traffic.items()):
        for attr, family in families.items():
            family.add_metric([topic], getattr(t, attr))
    yield from families.values()


def metrics_routes(snapshot: Callable[[], Snapshot]) -> list[Route]:
    """The `/metrics` route, reading `snapshot()` at each scrape."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_BrokerCollector(snapshot))

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(registry), media_type=CONTENT_TYPE)

    return [Route("/metrics", metrics, methods=["GET"])]
