"""The tier service's bookkeeping: per queue (manifest, errors, backoff) and per broker
(counters), and how they read in `tidemq tier status`."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from tidemq.protocol.tier_messages import TierQueueStatus, TierStatusResponse
from tidemq.store.offload import QueueTierState
from tidemq.tiered.config import TieredConfig
from tidemq.tiered.manifest import QueueManifest
from tidemq.tiered.reader import TierReader

__all__ = ["QueueTier", "TierStats", "queue_status"]


@dataclass
class QueueTier:
    topic: str
    queue: int
    topic_created_ms: int
    #: None until loaded from the object store (the first pass or read).
    manifest: QueueManifest | None = None
    error: str = ""
    failures: int = 0
    #: The queue's next pass waits until then (monotonic ms) after a failure.
    retry_at_ms: int = 0
    last_upload_ms: int = 0
    #: Offsets that were offloaded and are gone from the store (start, end).
    lost: tuple[int, int] | None = None
    #: One pass or read of the manifest at a time.
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    def loaded(self) -> QueueManifest:
        assert self.manifest is not None, "manifest not loaded"
        return self.manifest

    def failed(self, error: str, now_ms: int, config: TieredConfig) -> None:
        self.error = error
        backoff = min(
            config.retry_backoff_ms * 2 ** min(self.failures, 30), config.retry_backoff_max_ms
        )
        self.failures += 1
        self.retry_at_ms = now_ms + backoff

    def succeeded(self) -> None:
        self.error, self.failures, self.retry_at_ms = "", 0, 0


@dataclass
class TierStats:
    uploaded_files: int = 0
    uploaded_bytes: int = 0
    deleted_files: int = 0
    orphans_deleted: int = 0
    errors: int = 0
    remote_reads: int = 0
    last_upload_ms: int = 0

    def uploaded(self, size: int, now_ms: int) -> None:
        self.uploaded_files += 1
        self.uploaded_bytes += size
        self.last_upload_ms = now_ms

    def response(
        self, url: str, queues: list[TierQueueStatus], reader: TierReader
    ) -> TierStatusResponse:
        return TierStatusResponse(
            enabled=True,
            url=url,
            uploaded_files=self.uploaded_files,
            uploaded_bytes=self.uploaded_bytes,
            deleted_files=self.deleted_files,
            orphans_deleted=self.orphans_deleted,
            errors=self.errors,
            remote_reads=self.remote_reads,
            cache_bytes=reader.cached_bytes,
            queues=queues,
        )


def queue_status(
    topic: str, queue: int, state: QueueTierState, qt: QueueTier, now_ms: int
) -> TierQueueStatus:
    manifest = qt.manifest
    remote = state.remote
    lost = qt.lost or (0, 0)
    return TierQueueStatus(
        topic=topic,
        queue=queue,
        log_start=state.local_min if remote is None else remote.log_start,
        remote_end=state.local_min if remote is None else remote.remote_end,
        local_min=state.local_min,
        next_offset=state.next_offset,
        files=0 if manifest is None else len(manifest.files),
        remote_bytes=0 if manifest is None else sum(f.size for f in manifest.files),
        pending_bytes=state.local_bytes,
        last_upload_ms=qt.last_upload_ms,
        error=qt.error,
        retry_in_ms=max(0, qt.retry_at_ms - now_ms) if qt.error else 0,
        lost_from=lost[0],
        lost_to=lost[1],
    )
