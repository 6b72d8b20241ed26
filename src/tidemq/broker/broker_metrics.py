"""The broker's /metrics snapshot: counters and gauges read from each of its parts in one
step on its loop (`metrics.py` holds the snapshot's type and the per-part readers)."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Mapping
from typing import TYPE_CHECKING, Any

from tidemq.broker.broker_parts import BrokerParts
from tidemq.broker.metrics import (
    MetricsSnapshot,
    RequestTimes,
    Traffic,
    consumer_lag,
    consumer_lag_latency,
    disk_usage,
    pop_totals,
    queue_ends,
    queue_lag,
    reserve_time_ms,
    tier_backlog,
)

if TYPE_CHECKING:
    from tidemq.broker.tier_service import TierService

__all__ = ["BrokerMetrics"]


class BrokerMetrics:
    """Reads a `MetricsSnapshot` from the broker's parts (it reads every one of them; it
    changes none)."""

    def __init__(
        self,
        parts: BrokerParts,
        *,
        traffic: Traffic,
        request_times: RequestTimes,
        tier: TierService | None,
    ) -> None:
        self._data_dir = parts.config.store.data_dir
        self._clock = parts.clock
        self._gateway = parts.gateway
        self._topics = parts.topics
        self._coordinator = parts.coordinator
        self._transactions = parts.transactions
        self._timers = parts.timers
        self._pop = parts.pop
        self._static = parts.static
        self._traffic = traffic
        self._request_times = request_times
        self._replica = parts.replica
        self._tier = tier

    def snapshot(self, *, per_queue: bool = False) -> MetricsSnapshot:
        """Counters and gauges for the HTTP listener's /metrics (on the broker's loop);
        `per_queue` (`http.metrics_per_queue`): also lag and end offset per queue."""
        store = self._gateway.store
        topics = self._topics.names()
        groups = sorted(set(store.groups()) | set(self._coordinator.groups()))
        txns = self._transactions.status()
        traffic = self._traffic
        pop = pop_totals(self._pop, topics)
        by_queue: dict[tuple[str, str, int], int] | None = None
        ends: dict[tuple[str, int], int] | None = None
        omitted = 0
        if per_queue:
            by_queue = queue_lag(store, self._topics, self._static.view)
            ends, omitted = queue_ends(store, self._topics, self._static.view)
        now_ms = self._clock.now_ms()
        return MetricsSnapshot(
            traffic={
                name: dataclasses.replace(counts)
                for name, counts in traffic.topics.items()
                if name in topics
            },
            groups=groups,
            lag=consumer_lag(store, self._topics, self._static.view),
            half_messages=sum(t.messages for t in txns.open),
            transactions_committed=txns.committed,
            transactions_rolled_back=txns.rolled_back,
            timer_pending={t.topic: t.pending_messages for t in self._timers.status().topics},
            log_bytes=store.end_position - store.log.start_position,
            request_times={kind: d.copy() for kind, d in self._request_times.kinds.items()},
            pop_in_flight=pop.in_flight,
            pop_dead_lettered=pop.dead_lettered,
            disk=disk_usage(self._data_dir),
            queue_lag=by_queue,
            queue_end=ends,
            queues_omitted=omitted,
            lag_latency_ms=consumer_lag_latency(store, self._topics, self._static.view, now_ms),
            reserve_time_ms=reserve_time_ms(store, now_ms),
            fsync=self._gateway.fsync_times().copy(),
            group_commit=self._gateway.group_commit_bytes.copy(),
            message_sizes={kind: d.copy() for kind, d in traffic.sizes.items()},
            txn_messages_committed=_existing(self._transactions.messages_committed, topics),
            txn_messages_rolled_back=_existing(self._transactions.messages_rolled_back, topics),
            pop_leases=pop.leases,
            pop_retried=pop.retried,
            topic_number=len(topics),
            replica=None if self._replica is None else self._replica.metrics(),
            **self._tier_metrics(),
        )

    def _tier_metrics(self) -> dict[str, Any]:
        tier = self._tier
        if tier is None:
            return {}
        return {
            "tier_backlog": tier_backlog(self._gateway.store, self._topics),
            "tier_uploaded_bytes": tier.stats.uploaded_bytes,
            "tier_errors": tier.stats.errors,
        }


def _existing(counts: Mapping[str, int], topics: Collection[str]) -> dict[str, int]:
    """The counts of the topics that still exist (a deleted topic's series end)."""
    return {topic: n for topic, n in counts.items() if topic in topics}
