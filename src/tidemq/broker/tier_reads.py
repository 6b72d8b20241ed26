"""Reads of offloaded offsets for the broker's handlers: fetches, lookups by time, and the
list of a topic's remote files. The files' bytes come through `tidemq.tiered.reader`
on worker threads; the manifests from the tier service (`TierService.loaded`)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from tidemq.broker.tier_state import QueueTier, TierStats
from tidemq.broker.topics import TopicTable
from tidemq.core.errors import CorruptRecordError, DataLost, TidemqError
from tidemq.core.record import parse_header
from tidemq.protocol.tier_messages import TierFile, TierFilesRequest, TierFilesResponse
from tidemq.store.message_store import StoredBatch
from tidemq.store.metadata import TopicInfo
from tidemq.store.remote_ranges import tier_settings
from tidemq.tiered.manifest import QueueManifest
from tidemq.tiered.object_store import ObjectMissing
from tidemq.tiered.reader import TierReader

__all__ = ["TierReads", "tag_summary"]


class TierReads:
    def __init__(
        self,
        reader: TierReader,
        stats: TierStats,
        topics: TopicTable,
        loaded: Callable[[TopicInfo, int], Awaitable[QueueTier]],
        url: str,
    ) -> None:
        self._reader = reader
        self._stats = stats
        self._topics = topics
        self._loaded = loaded
        self._url = url.rstrip("/")
        self._warming: set[asyncio.Task[None]] = set()

    async def read(
        self, info: TopicInfo, queue: int, offset: int, max_bytes: int, tag_mask: int
    ) -> tuple[list[StoredBatch], int] | None:
        """The stored batches from the one holding the offloaded `offset`, up to
        `max_bytes` (at least one, unless `tag_mask` skips them all), and the offset to
        read next; None when remote retention removed `offset` meanwhile (the caller
        asks the store again). DataLost when the object store no longer holds them;
        TierUnavailable when it cannot be read now."""
        qt = await self._loaded(info, queue)
        manifest = qt.loaded()
        if offset < manifest.log_start and qt.lost is None:
            return None
        file = manifest.file_for(offset)
        if file is None:
            raise DataLost(
                f"{info.name}/{queue}: offset {offset} was offloaded, but the tier's manifest "
                f"holds no file for it (remote offsets {manifest.log_start}..{manifest.end})"
            )
        try:
            records = await asyncio.to_thread(
                self._reader.read, manifest, info.id, offset, max_bytes
            )
        except (ObjectMissing, CorruptRecordError) as exc:
            current = qt.loaded()
            if offset < current.log_start or file not in current.files:
                return None  # remote retention deleted it meanwhile: out of range now
            self._stats.errors += 1
            raise DataLost(
                f"{info.name}/{queue}: offloaded offsets {file.start}..{file.end} cannot be "
                f"read back: {exc}"
            ) from None
        self._stats.remote_reads += 1
        batches = []
        for record in records:
            header = parse_header(record)
            if tag_mask and not tag_summary(record, header.payload_start) & tag_mask:
                continue
            batches.append(
                StoredBatch(header.base_offset, header.count, header.store_time_ms, record)
            )
        if not records:
            return batches, offset
        last = parse_header(records[-1])
        following = last.base_offset + last.count
        self._warm_next(manifest, info.id, following)
        return batches, following

    async def offset_for_time(self, info: TopicInfo, queue: int, timestamp_ms: int) -> int | None:
        """The first offloaded offset whose message is stored at or after `timestamp_ms`
        with a timestamp at or after it (as the store answers for local data); None when
        no offloaded message is."""
        manifest = (await self._loaded(info, queue)).loaded()
        try:
            return await asyncio.to_thread(self._reader.offset_for_time, manifest, timestamp_ms)
        except (ObjectMissing, CorruptRecordError) as exc:
            raise DataLost(f"{info.name}/{queue}: offloaded data cannot be read: {exc}") from None

    def _warm_next(self, manifest: QueueManifest, topic_id: int, following: int) -> None:
        """A sequential reader's next row group, fetched ahead (one at a time per broker)."""
        if self._warming or manifest.file_for(following) is None:
            return

        async def warm() -> None:
            with contextlib.suppress(TidemqError):  # the read itself will report it
                await asyncio.to_thread(self._reader.warm, manifest, topic_id, following)

        task = asyncio.get_running_loop().create_task(warm())
        self._warming.add(task)
        task.add_done_callback(self._warming.discard)

    async def files(self, req: TierFilesRequest) -> TierFilesResponse:
        """The remote files of a topic holding offsets in [start, end), by queue."""
        info = self._topics.get(req.topic)
        if not tier_settings(info.config).enabled:
            # Never offloaded: no files (and no remote range or manifest made for it).
            return TierFilesResponse(files=[])
        queues = self._topics.hosted(info.name) if req.queue < 0 else [req.queue]
        end = req.end if req.end >= 0 else None
        out: list[TierFile] = []
        for q in queues:
            manifest = (await self._loaded(info, q)).loaded()
            out.extend(
                TierFile(
                    queue=q,
                    url=f"{self._url}/{f.path}",
                    start=f.start,
                    end=f.end,
                    messages=f.messages,
                    size=f.size,
                    min_store_time_ms=f.min_store_time_ms,
                    max_store_time_ms=f.max_store_time_ms,
                )
                for f in manifest.files
                if f.end > req.start and (end is None or f.start < end)
            )
        return TierFilesResponse(files=out)

    async def close(self) -> None:
        for task in list(self._warming):
            task.cancel()
        await asyncio.gather(*self._warming, return_exceptions=True)


def tag_summary(record: bytes, payload_start: int) -> int:
    """The batch envelope's tag summary (bytes 16..24 of the payload, `core.batch`)."""
    return int.from_bytes(record[payload_start + 16 : payload_start + 24], "little")
