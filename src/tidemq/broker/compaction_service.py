"""Compaction of the broker's compact topics, and their key lookups (KV_GET, COMPACT).

Every `compaction_check_interval_ms` the service compacts the queues that are due, one at
a time, in a worker process (`compaction_runner.py`); COMPACT runs it on demand.
"""

from __future__ import annotations

from tidemq.broker.compaction_runner import CompactionRunner
from tidemq.broker.store_gateway import StoreGateway
from tidemq.broker.topics import TopicTable
from tidemq.core.errors import ConfigError, StoreClosed
from tidemq.protocol.kv_messages import (
    CompactionRun,
    CompactRequest,
    CompactResponse,
    KvGetRequest,
    KvGetResponse,
)
from tidemq.store.config import FlushMode
from tidemq.store.message_store import MessageStore
from tidemq.store.metadata import CleanupPolicy

__all__ = ["CompactionService"]


class CompactionService:
    def __init__(self, gateway: StoreGateway, topics: TopicTable, interval_ms: int) -> None:
        self._gateway = gateway
        self._topics = topics
        self._runner = CompactionRunner(self._store, interval_ms)
        self.run_forever = self._runner.run_forever
        self.run_due = self._runner.run_due
        self.compact_queue = self._runner.compact_queue
        self.close = self._runner.close

    def _store(self) -> MessageStore:
        if self._gateway.closed:
            raise StoreClosed("the broker is shutting down")
        return self._gateway.store

    # ------------------------------------------------------------------ requests

    async def kv_get(self, req: KvGetRequest) -> KvGetResponse:
        await self._topics.check_queue(req.topic, req.queue)
        found = await self._gateway.call(lambda s: s.lookup_key(req.topic, req.queue, req.key))
        if found is None:
            return KvGetResponse()
        return KvGetResponse(
            found=True, offset=found.offset, value=found.value, timestamp_ms=found.timestamp_ms
        )

    async def compact(self, req: CompactRequest) -> CompactResponse:
        info = self._topics.get(req.topic)
        if info.cleanup_policy is CleanupPolicy.DELETE:
            raise ConfigError(
                f"topic {req.topic!r} has cleanup.policy delete: only compact topics are "
                "compacted (alter it to compact or compact,delete first)"
            )
        if req.queue >= 0:
            await self._topics.check_queue(req.topic, req.queue)
            queues = [req.queue]
        else:
            queues = self._topics.hosted(req.topic)
        if self._gateway.store.config.flush_mode is FlushMode.ASYNC:
            # Compaction takes only flushed data (a power loss could take the rest back
            # and hand its offsets out again); on demand, it means what was sent so far.
            await self._gateway.call(lambda s: s.flush())
        runs = []
        for q in queues:
            r = await self.compact_queue(req.topic, q)
            runs.append(
                CompactionRun(
                    queue=q,
                    messages_in=r.messages_in,
                    messages_out=r.messages_out,
                    bytes_in=r.bytes_in,
                    bytes_out=r.bytes_out,
                    compacted_end=r.end,
                )
            )
        return CompactResponse(runs=runs)
