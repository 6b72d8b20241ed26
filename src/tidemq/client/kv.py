"""Key-value access to compact topics: a key's latest value (`Admin.get`) and compaction
on demand (`Admin.compact`). The key goes to the queue a producer sends it to
(`tidemq.cluster.route.queue_for_key`), and the broker serving that queue answers from its
key index (docs/guide/compact-topics.md)."""

from __future__ import annotations

from dataclasses import dataclass

from tidemq.client import checks
from tidemq.client.cluster import ClusterClient
from tidemq.protocol.kv_messages import (
    CompactRequest,
    CompactResponse,
    KvGetRequest,
    KvGetResponse,
)

__all__ = ["CompactionReport", "KeyLookup", "compact", "lookup"]


@dataclass(frozen=True, slots=True)
class KeyLookup:
    """Where a key's latest message is: its queue and offset, value (None: a tombstone)."""

    queue: int
    offset: int
    value: bytes | None
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class CompactionReport:
    """One queue's compaction run."""

    queue: int
    messages_in: int
    messages_out: int
    bytes_in: int
    bytes_out: int
    #: Offsets below this are served from the queue's compacted log.
    compacted_end: int


async def lookup(cluster: ClusterClient, topic: str, key: object) -> KeyLookup | None:
    """The latest message of `key` (bytes, as producers send keys) in compact topic
    `topic`; None when the key has none (never written, or its tombstone compacted away)."""
    topic = checks.check_readable_topic(topic)
    raw = checks.check_key(key)
    if raw is None:
        raise TypeError("key must be bytes, got None")
    routes = await cluster.refresh_routes()
    if topic not in routes:
        routes = await cluster.topic_routes(topic)
    queue = routes.select_queue(topic, raw, 0)  # where a producer sends this key
    address = await cluster.broker_for(topic, queue)
    answer = await cluster.call(
        address, KvGetRequest(topic=topic, queue=queue, key=raw), KvGetResponse
    )
    if not answer.found:
        return None
    return KeyLookup(queue, answer.offset, answer.value, answer.timestamp_ms)


async def compact(
    cluster: ClusterClient, topic: str, hosts: dict[str, list[int]]
) -> list[CompactionReport]:
    """Run compaction now on every queue of `topic` (`hosts`: broker -> its queues)."""
    reports: list[CompactionReport] = []
    for address in sorted(hosts):
        answer = await cluster.call(address, CompactRequest(topic=topic), CompactResponse)
        reports += [
            CompactionReport(
                r.queue, r.messages_in, r.messages_out, r.bytes_in, r.bytes_out, r.compacted_end
            )
            for r in answer.runs
        ]
    return sorted(reports, key=lambda r: r.queue)
