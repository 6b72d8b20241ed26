"""Compaction of the broker's compact topics, and their key lookups (KV_GET, COMPACT).

Every `compaction_check_interval_ms` the service asks the store which queues are due
(`MessageStore.compaction_due`: dirty ratio, max lag, expired tombstones) and compacts
them one at a time. A run is planned and switched on the event loop, and done in a worker
process: it only reads records that can no longer change and writes a new file, so
produce and fetch go on meanwhile (`store/compaction.py`). A process, not a thread: a run
is Python work, and on a thread it held the GIL so often that the loop's p99 produce
latency went from 0.9 ms to 12.5 ms during a run (`benchmarks/bench_compaction.py`).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

from tidemq.broker.store_gateway import StoreGateway
from tidemq.broker.topics import TopicTable
from tidemq.core.errors import ConfigError, DiskFull
from tidemq.protocol.kv_messages import (
    CompactionRun,
    CompactRequest,
    CompactResponse,
    KvGetRequest,
    KvGetResponse,
)
from tidemq.store.compaction import CompactionResult, run_compaction
from tidemq.store.config import FlushMode
from tidemq.store.metadata import CleanupPolicy

__all__ = ["CompactionService"]

log = logging.getLogger(__name__)


class CompactionService:
    def __init__(self, gateway: StoreGateway, topics: TopicTable, interval_ms: int) -> None:
        self._gateway = gateway
        self._topics = topics
        self._interval_s = interval_ms / 1000
        #: One run at a time: runs on demand and in the background never overlap.
        self._lock = asyncio.Lock()
        self._pool: ProcessPoolExecutor | None = None

    def _executor(self) -> ProcessPoolExecutor:
        """The worker process, started on the first run ("spawn": never a fork of a
        broker with threads and open sockets)."""
        if self._pool is None:
            self._pool = ProcessPoolExecutor(
                max_workers=1, mp_context=multiprocessing.get_context("spawn")
            )
        return self._pool

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    async def run_forever(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.run_due()
            except DiskFull:
                pass  # the store logs a full disk once; the next round tries again
            except Exception:
                log.exception("compaction failed")

    async def run_due(self) -> list[CompactionResult]:
        due = await self._gateway.call(lambda s: s.compaction_due())
        results = []
        for item in due:
            results.append(await self.compact_queue(item.topic, item.queue_id))
        return results

    async def compact_queue(self, topic: str, queue: int) -> CompactionResult:
        async with self._lock:
            job = await self._gateway.call(lambda s: s.plan_compaction(topic, queue))
            loop = asyncio.get_running_loop()
            try:
                result = await loop.run_in_executor(self._executor(), run_compaction, job)
            except BrokenProcessPool:
                self._pool = None  # the worker died (killed?): a new one next time
                await self._gateway.call(lambda s: s.abandon_compaction(job))
                raise
            except BaseException:
                await self._gateway.call(lambda s: s.abandon_compaction(job))
                raise
            await self._gateway.call(lambda s: s.install_compaction(result))
        log.info(
            "compacted %s/%d: %d -> %d messages, %d -> %d bytes (offsets below %d compacted)",
            topic,
            queue,
            result.messages_in,
            result.messages_out,
            result.bytes_in,
            result.bytes_out,
            result.end,
        )
        return result

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
