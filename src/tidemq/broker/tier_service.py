"""Tiered storage on a broker: offload, remote retention, and reads of offloaded offsets.

Every `tiered.check_interval_ms` (and on `run_once`) each hosted queue of each topic with
`remote.storage.enable=true` gets one pass, at most `tiered.upload_concurrency` at once:

1. **Load** its manifest (once): reconcile it with the store's remote range (a crash may
   fall between the manifest write and the store's record of it) and delete orphan files
   (uploads a crash cut off before their manifest listed them).
2. **Offload**: the durable batches past the remote end form a file once they reach
   `tiered.file_bytes` or their oldest is `tiered.file_max_age_ms` old. Upload, verify
   (`verify_upload`), write the manifest, then record the new remote end in the store:
   only then may local retention drop those batches (reliability rule 8).
3. **Expire**: whole files past the topic's `retention.ms`/`retention.bytes` (counting the
   local tail too) go: the store's log start first (readers stop), then the manifest, then
   the objects.

A failure (store down, slow, refusing) is kept as the queue's error, shown by `tidemq
tier status`, and the queue backs off (`retry_backoff_ms` doubling to the max); produce and
fetch never wait for the store. Reads of offloaded offsets (`read`) come from the fetch
handler when the store answers REMOTE.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final, TypeVar

import msgspec

from tidemq.broker.store_gateway import StoreGateway
from tidemq.broker.tier_catalog import TierCatalog
from tidemq.broker.tier_links import TierLinks
from tidemq.broker.tier_reads import TierReads
from tidemq.broker.tier_state import QueueTier, TierStats, queue_status
from tidemq.broker.topics import TopicTable
from tidemq.core.clock import Clock
from tidemq.core.errors import (
    ConfigError,
    CorruptRecordError,
    TidemqError,
    TierUnavailable,
)
from tidemq.protocol.tier_messages import (
    TierQueueStatus,
    TierStatusRequest,
    TierStatusResponse,
)
from tidemq.store.message_store import MessageStore, StoredBatch
from tidemq.store.metadata import TopicInfo
from tidemq.store.offload import QueueTierState
from tidemq.store.remote_ranges import tier_settings
from tidemq.tiered.config import TieredConfig
from tidemq.tiered.manifest import (
    QueueManifest,
    RemoteFile,
    data_file_path,
    decode_manifest,
    encode_manifest,
    manifest_path,
    queue_data_prefix,
)
from tidemq.tiered.object_store import ObjectMissing, ObjectStore, verify_upload
from tidemq.tiered.parquet_rows import encode_file
from tidemq.tiered.reader import TierReader

__all__ = ["TierService"]

log = logging.getLogger(__name__)

#: Files one queue uploads in one pass (the other queues get their turn).
_MAX_FILES_PER_PASS: Final = 8
#: Passes `offload_now` runs at most (each uploads up to _MAX_FILES_PER_PASS per queue).
_MAX_FORCED_PASSES: Final = 1000
_T = TypeVar("_T")


@dataclass
class _Pass:
    info: TopicInfo
    queue: int
    manifest: QueueManifest
    #: Offload what is durable now, whatever its size and age (`offload_now`).
    force: bool = False


class TierService:
    def __init__(
        self,
        config: TieredConfig,
        broker_name: str,
        gateway: StoreGateway,
        topics: TopicTable,
        clock: Clock,
    ) -> None:
        self.config = config
        self._broker = broker_name
        self._gateway = gateway
        self._topics = topics
        self._clock = clock
        self.store = ObjectStore(config)
        self.reader = TierReader(self.store, config.cache_bytes)
        self._queues: dict[tuple[str, int], QueueTier] = {}
        self._uploads = asyncio.Semaphore(config.upload_concurrency)
        self.stats = TierStats()
        self.catalog = TierCatalog(self.store, broker_name, gateway, topics)
        #: What the fetch, lookup-by-time and file-list handlers call.
        self.reads = TierReads(self.reader, self.stats, topics, self.loaded, config.url)
        #: Static topics: other brokers' offloaded links.
        self.links = TierLinks(self.store, self.reader, self.stats, clock)
        #: Writes the ranges a pass changed into the replicated log (`member_tables`).
        self.publish_tables: Callable[[], Awaitable[None]] | None = None

    async def _io(self, fn: Callable[..., _T], *args: object) -> _T:
        """A blocking object-store or Parquet call, on a worker thread."""
        return await asyncio.to_thread(fn, *args)

    def _queue(self, info: TopicInfo, queue: int) -> QueueTier:
        qt = self._queues.get((info.name, queue))
        if qt is None or qt.topic_created_ms != info.created_ms:
            qt = QueueTier(info.name, queue, info.created_ms)
            self._queues[(info.name, queue)] = qt
        return qt

    # ------------------------------------------------------------------ passes

    async def run_forever(self) -> None:
        # A broker on an empty disk restores its topics at once, not a pass later.
        with contextlib.suppress(TierUnavailable, CorruptRecordError):
            await self.catalog.restore()  # (on failure, each pass tries again)
        while True:
            await asyncio.sleep(self.config.check_interval_ms / 1000)
            try:
                await self.run_once()
            except Exception:
                log.exception("tiered storage pass failed")

    async def run_once(self, topic: str = "", *, force: bool = False) -> None:
        """One pass over every offloaded queue (what the background loop runs), or over
        `topic`'s; `force`: upload what is durable whatever its size and age, and now
        even if the queue is backing off after a failure."""
        try:
            await self.catalog.restore()  # a broker rebuilt on an empty disk: once
        except (TierUnavailable, CorruptRecordError) as exc:
            self.stats.errors += 1
            log.warning("tiered storage: restoring topics from the bucket: %s", exc)
            return  # no topic here yet: the next pass tries again
        topics = [t for t in self._topics.all() if tier_settings(t.config).enabled]
        try:
            await self.catalog.publish(topics)
        except (TierUnavailable, CorruptRecordError) as exc:
            # Each queue's pass will fail (and show) the same way; the entries go later.
            self.stats.errors += 1
            log.warning("tiered storage: writing the topic catalog: %s", exc)
        await self._forget_deleted({t.name: t for t in topics})
        topics = [t for t in topics if topic in ("", t.name)]
        uploaded = self.stats.uploaded_files
        await asyncio.gather(
            *(
                self._queue_pass(t, q, force=force)
                for t in topics
                for q in self._topics.hosted(t.name)
            )
        )
        if self.stats.uploaded_files != uploaded or self._gateway.store.watermark.full:
            # Local copies past local.retention.* may go now rather than at the next
            # retention run: a disk filled while the store was down empties as it catches
            # up (and, while appends are refused, at every pass: what else holds the
            # segments, such as the services' scan position, moves on its own schedule).
            await self._gateway.call(lambda s: s.enforce_retention())
        if self.publish_tables is not None:
            # The group's other members learn the new ranges (their retention, and a
            # promoted member's reads, follow them). A failure (appends refused: a full
            # disk, too few members in sync) keeps them for the next pass.
            try:
                await self.publish_tables()
            except TidemqError as exc:
                log.warning("tiered storage: recording the ranges in the log: %s", exc)

    async def offload_now(self, topic: str) -> None:
        """Upload every durable batch of `topic` (an operator before maintenance, or a
        demo); raises TierUnavailable naming a queue that failed."""
        info = self._topics.get(topic)
        if not tier_settings(info.config).enabled:
            raise ConfigError(f"topic {topic!r} does not have remote.storage.enable=true")
        for _ in range(_MAX_FORCED_PASSES):
            before = self.stats.uploaded_files
            await self.run_once(topic, force=True)
            failed = [qt for qt in self._queues.values() if qt.topic == topic and qt.error]
            if failed:
                raise TierUnavailable(f"{topic}/{failed[0].queue}: {failed[0].error}")
            if self.stats.uploaded_files == before:
                return

    async def _queue_pass(self, info: TopicInfo, queue: int, *, force: bool = False) -> None:
        qt = self._queue(info, queue)
        if not force and int(self._clock.monotonic_ms()) < qt.retry_at_ms:
            return
        async with self._uploads, qt.lock:
            try:
                manifest = await self._load(qt, info)
                for _ in range(_MAX_FILES_PER_PASS):
                    if not await self._offload_one(qt, _Pass(info, queue, manifest, force)):
                        break
                    manifest = qt.loaded()
                await self._expire(qt, info)
            except (TierUnavailable, CorruptRecordError) as exc:
                qt.failed(str(exc), int(self._clock.monotonic_ms()), self.config)
                self.stats.errors += 1
                log.warning("tiered storage, %s/%d: %s", info.name, queue, exc)
                return
            qt.succeeded()

    # ------------------------------------------------------------------ load, reconcile

    async def _load(self, qt: QueueTier, info: TopicInfo) -> QueueManifest:
        if qt.manifest is not None:
            return qt.manifest
        path = manifest_path(self._broker, info.name, qt.queue)
        try:
            manifest: QueueManifest | None = decode_manifest(await self._io(self.store.get, path))
        except ObjectMissing:
            manifest = None
        if manifest is not None and manifest.topic_created_ms != info.created_ms:
            manifest = None  # an earlier topic of the same name: its files are orphans
        view = await self._gateway.call(lambda s: s.offload.open_range(info.name, qt.queue))
        found = manifest is not None
        if manifest is None:
            manifest = QueueManifest(
                broker=self._broker,
                topic=info.name,
                queue=qt.queue,
                topic_created_ms=info.created_ms,
                log_start=view.remote_end,
            )
            if view.remote_end > view.log_start:
                qt.lost = (view.log_start, view.remote_end)
            await self._io(self.store.put, path, encode_manifest(manifest))
        elif manifest.end > view.remote_end:
            state = await self._gateway.call(
                functools.partial(_state, topic=info.name, queue=qt.queue)
            )
            if manifest.end > state.next_offset:
                raise CorruptRecordError(
                    f"the tier's manifest of {info.name}/{qt.queue} ends at offset "
                    f"{manifest.end}, past this broker's end {state.next_offset}: another "
                    f"broker named {self._broker!r} uses this bucket, or the local data was "
                    "lost"
                )
            # The manifest was written, the store's record of it was not (a crash).
            end = manifest.end
            await self._gateway.call(lambda s: s.offload.set_remote_end(info.name, qt.queue, end))
        elif manifest.end < view.remote_end:
            qt.lost = (manifest.end, view.remote_end)
            raise CorruptRecordError(
                f"the tier's manifest of {info.name}/{qt.queue} ends at {manifest.end}, the "
                f"broker recorded {view.remote_end}: offsets in between are lost"
            )
        if found and manifest.log_start > view.log_start:
            # Remote retention went on without this store's record of it (a crash, or a
            # replica group's leader lost before the group committed it).
            start = manifest.log_start
            await self._gateway.call(lambda s: s.offload.set_log_start(info.name, qt.queue, start))
        listed = {f.path for f in manifest.files}
        prefix = queue_data_prefix(info.name, self._broker, qt.queue)
        for orphan in await self._io(self.store.list, prefix):
            if orphan.path not in listed:
                await self._io(self.store.delete, orphan.path)
                self.stats.orphans_deleted += 1
        qt.manifest = manifest
        return manifest

    async def _forget_deleted(self, live: dict[str, TopicInfo]) -> None:
        """Delete the remote data of topics deleted (or created again) since it was
        offloaded."""
        for key, qt in list(self._queues.items()):
            info = live.get(qt.topic)
            if info is not None and info.created_ms == qt.topic_created_ms:
                continue
            manifest = qt.manifest
            del self._queues[key]
            if manifest is None:
                continue
            try:
                for f in manifest.files:
                    await self._io(self.store.delete, f.path)
                    self.reader.drop(f.path)
                if info is None:
                    path = manifest_path(self._broker, qt.topic, qt.queue)
                    await self._io(self.store.delete, path)
            except TierUnavailable as exc:
                log.warning("tiered storage: deleting %s/%d: %s", qt.topic, qt.queue, exc)
        for name in self.catalog.known():
            if name not in live:
                try:
                    await self.catalog.forget(name)
                except TierUnavailable as exc:
                    log.warning("tiered storage: deleting the entry of %s: %s", name, exc)

    # ------------------------------------------------------------------ offload

    async def _durable_batches(self, p: _Pass, start: int) -> tuple[list[StoredBatch], bool]:
        """The durable batches from `start`, up to `file_bytes`, read in row-group-sized
        calls (each call blocks the loop for one small read); and whether they fill a file."""
        out: list[StoredBatch] = []
        total = 0
        limit = self.config.file_bytes
        topic, queue = p.info.name, p.queue
        while total < limit:
            step = min(self.config.row_group_bytes, limit - total)
            at = start if not out else out[-1].base_offset + out[-1].count
            got = await self._gateway.call(
                functools.partial(_batches, topic=topic, queue=queue, offset=at, max_bytes=step)
            )
            if not got:
                return out, False
            out.extend(got)
            total += sum(len(b.record) for b in got)
        return out, True

    async def _offload_one(self, qt: QueueTier, p: _Pass) -> bool:
        batches, full = await self._durable_batches(p, p.manifest.end)
        if not batches:
            return False
        age = self._clock.now_ms() - batches[0].store_time_ms
        if not (full or p.force) and age < self.config.file_max_age_ms:
            return False
        records = [b.record for b in batches]
        encoded = await self._io(
            lambda: encode_file(
                records,
                topic=p.info.name,
                queue=p.queue,
                broker=self._broker,
                row_group_bytes=self.config.row_group_bytes,
            )
        )
        path = data_file_path(
            p.info.name,
            self._broker,
            p.queue,
            start=encoded.start,
            end=encoded.end,
            store_time_ms=encoded.min_store_time_ms,
        )
        etag = await self._io(self.store.put, path, encoded.data)
        await self._io(verify_upload, self.store, path, encoded.data, etag)
        remote = RemoteFile(
            path=path,
            start=encoded.start,
            end=encoded.end,
            messages=encoded.messages,
            size=len(encoded.data),
            record_bytes=sum(len(r) for r in records),
            md5=hashlib.md5(encoded.data, usedforsecurity=False).hexdigest(),
            sha256=hashlib.sha256(encoded.data).hexdigest(),
            min_store_time_ms=encoded.min_store_time_ms,
            max_store_time_ms=encoded.max_store_time_ms,
            row_groups=encoded.row_groups,
            uploaded_ms=self._clock.now_ms(),
        )
        manifest = msgspec.structs.replace(p.manifest, files=[*p.manifest.files, remote])
        await self._put_manifest(qt, manifest)
        end = encoded.end
        await self._gateway.call(lambda s: s.offload.set_remote_end(p.info.name, p.queue, end))
        self.stats.uploaded(len(encoded.data), self._clock.now_ms())
        qt.last_upload_ms = self._clock.now_ms()
        return True

    async def _put_manifest(self, qt: QueueTier, manifest: QueueManifest) -> None:
        path = manifest_path(self._broker, manifest.topic, manifest.queue)
        await self._io(self.store.put, path, encode_manifest(manifest))
        qt.manifest = manifest

    # ------------------------------------------------------------------ remote retention

    async def _expire(self, qt: QueueTier, info: TopicInfo) -> None:
        manifest = qt.loaded()
        files = manifest.files
        store_config = self._gateway.store.config
        retention_ms = store_config.retention_ms if info.retention_ms is None else info.retention_ms
        retention_bytes = (
            store_config.retention_bytes if info.retention_bytes is None else info.retention_bytes
        )
        drop = 0
        if retention_ms >= 0:
            cutoff = self._clock.now_ms() - retention_ms
            while drop < len(files) and files[drop].max_store_time_ms < cutoff:
                drop += 1
        if retention_bytes >= 0:
            state = await self._gateway.call(lambda s: s.offload.state(info.name, qt.queue))
            total = state.local_bytes + sum(f.record_bytes for f in files[drop:])
            while drop < len(files) and total > retention_bytes:
                total -= files[drop].record_bytes
                drop += 1
        if drop == 0:
            return
        start = files[drop - 1].end
        await self._gateway.call(lambda s: s.offload.set_log_start(info.name, qt.queue, start))
        kept = msgspec.structs.replace(manifest, files=files[drop:], log_start=start)
        await self._put_manifest(qt, kept)
        for f in files[:drop]:
            await self._io(self.store.delete, f.path)
            self.reader.drop(f.path)
            self.stats.deleted_files += 1

    # ------------------------------------------------------------------ status

    async def status(self, req: TierStatusRequest) -> TierStatusResponse:
        out: list[TierQueueStatus] = []
        now = int(self._clock.monotonic_ms())
        for info in self._topics.all():
            if not tier_settings(info.config).enabled or req.topic not in ("", info.name):
                continue
            for q in self._topics.hosted(info.name):
                state = await self._gateway.call(
                    functools.partial(_state, topic=info.name, queue=q)
                )
                out.append(queue_status(info.name, q, state, self._queue(info, q), now))
        response = self.stats.response(self.config.url, out, self.reader)
        response.broker = self._broker
        return response

    async def loaded(self, info: TopicInfo, queue: int) -> QueueTier:
        """A queue's bookkeeping with its manifest loaded (for reads)."""
        qt = self._queue(info, queue)
        if qt.manifest is None:
            # Only the first load waits for the queue's pass: once loaded, a manifest is
            # replaced whole, never changed, so a read never waits behind an upload.
            async with qt.lock:
                await self._load(qt, info)
        return qt

    async def close(self) -> None:
        await self.reads.close()


def _batches(
    store: MessageStore, *, topic: str, queue: int, offset: int, max_bytes: int
) -> list[StoredBatch]:
    return store.offload.batches(topic, queue, offset, max_bytes)


def _state(store: MessageStore, *, topic: str, queue: int) -> QueueTierState:
    return store.offload.state(topic, queue)
