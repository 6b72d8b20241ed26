"""Other brokers' links of static topics, read from the object store.

A static queue's sealed link on broker X keeps its data in X's physical queue, and, once
offloaded, in X's files in the bucket (`topic=<t>/broker=<X>/queue=<q>/`, listed by X's
manifest). Any broker of the same tier can serve those offsets from there: readers of a
link whose broker is down, or has left the cluster (`tidemq cluster remove-broker`, which
marks its offloaded links `tiered`), come to a broker that holds another link of the
queue. Offsets are X's physical ones; the caller maps them to logical offsets.

Manifests of other brokers are cached for `FOREIGN_MANIFEST_TTL_MS` (their owner may
still be expiring files) and loaded again at once when an offset is past the cached one.
The broker holding a queue's write end expires the links marked `tiered` (whose broker is
gone) with `drop_through`.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from dataclasses import dataclass
from typing import Final

import msgspec

from tidemq.broker.tier_reads import tag_summary
from tidemq.broker.tier_state import TierStats
from tidemq.core.clock import Clock
from tidemq.core.errors import CorruptRecordError, DataLost
from tidemq.core.record import parse_header
from tidemq.core.static_chain import Link
from tidemq.store.message_store import StoredBatch
from tidemq.tiered.manifest import (
    QueueManifest,
    decode_manifest,
    encode_manifest,
    manifest_path,
    queue_data_prefix,
)
from tidemq.tiered.object_store import ObjectMissing, ObjectStore
from tidemq.tiered.reader import TierReader

__all__ = ["FOREIGN_MANIFEST_TTL_MS", "LinkRead", "TierLinks"]

#: How long another broker's manifest is used before it is loaded again.
FOREIGN_MANIFEST_TTL_MS: Final = 10_000
#: Other brokers' manifests kept (least recently used go first).
MAX_FOREIGN_MANIFESTS: Final = 4096

_Key = tuple[str, str, int]  # broker, topic, queue


@dataclass(frozen=True, slots=True)
class LinkRead:
    """Records of another broker's link: `next_offset` is the physical offset to read
    next; `log_start` the broker's first offset still in the bucket."""

    batches: list[StoredBatch]
    next_offset: int
    log_start: int


class TierLinks:
    def __init__(
        self,
        store: ObjectStore,
        reader: TierReader,
        stats: TierStats,
        clock: Clock,
    ) -> None:
        self._store = store
        self._reader = reader
        self._stats = stats
        self._clock = clock
        self._manifests: OrderedDict[_Key, tuple[QueueManifest | None, int]] = OrderedDict()

    async def manifest(
        self, broker: str, topic: str, queue: int, *, fresh: bool = False
    ) -> QueueManifest | None:
        """`broker`'s manifest of the queue (None: it never offloaded it)."""
        key = (broker, topic, queue)
        now = self._clock.now_ms()
        cached = self._manifests.get(key)
        if cached is not None and not fresh and now - cached[1] < FOREIGN_MANIFEST_TTL_MS:
            self._manifests.move_to_end(key)
            return cached[0]
        path = manifest_path(broker, topic, queue)
        try:
            found: QueueManifest | None = decode_manifest(
                await asyncio.to_thread(self._store.get, path)
            )
        except ObjectMissing:
            found = None
        self._manifests[key] = (found, now)
        self._manifests.move_to_end(key)
        while len(self._manifests) > MAX_FOREIGN_MANIFESTS:
            self._manifests.popitem(last=False)
        return found

    async def read(
        self,
        topic: str,
        *,
        topic_id: int,
        queue: int,
        link: Link,
        physical: int,
        max_bytes: int,
        tag_mask: int,
    ) -> LinkRead | None:
        """Records of `link` (another broker's, sealed) from physical offset `physical`,
        up to `max_bytes` (at least one unless `tag_mask` skips them); None when the
        bucket does not hold that offset (not offloaded: only its broker has it). An
        offset its broker expired answers no records and the log start."""
        manifest = await self.manifest(link.broker, topic, queue)
        if manifest is None or physical >= manifest.end:
            manifest = await self.manifest(link.broker, topic, queue, fresh=True)
        if manifest is None or physical >= manifest.end:
            return None
        if physical < manifest.log_start:
            return LinkRead([], manifest.log_start, manifest.log_start)
        try:
            records = await asyncio.to_thread(
                self._reader.read, manifest, topic_id, physical, max_bytes
            )
        except (ObjectMissing, CorruptRecordError) as exc:
            current = await self.manifest(link.broker, topic, queue, fresh=True)
            if current is not None and physical < current.log_start:
                return LinkRead([], current.log_start, current.log_start)
            self._stats.errors += 1
            raise DataLost(
                f"{topic}/{queue}: offsets of broker {link.broker}'s link from physical "
                f"offset {physical} cannot be read back from the object store: {exc}"
            ) from None
        self._stats.remote_reads += 1
        batches: list[StoredBatch] = []
        following = physical
        for record in records:
            header = parse_header(record)
            following = header.base_offset + header.count
            if tag_mask and not tag_summary(record, header.payload_start) & tag_mask:
                continue
            batches.append(
                StoredBatch(header.base_offset, header.count, header.store_time_ms, record)
            )
        return LinkRead(batches, following, manifest.log_start)

    async def covered(self, topic: str, queue: int, link: Link) -> QueueManifest | None:
        """The manifest of `link`'s broker when the bucket holds all of the link that
        its broker has not expired (so a lookup there sees what the broker would)."""
        manifest = await self.manifest(link.broker, topic, queue)
        if manifest is None or manifest.end < link.physical_end:
            return None
        return manifest

    async def offset_for_time(
        self, topic: str, queue: int, link: Link, timestamp_ms: int
    ) -> int | None:
        """The first physical offset of `link` whose message is stored at or after
        `timestamp_ms` with a timestamp at or after it (None: none, or the link is not
        all in the bucket)."""
        manifest = await self.covered(topic, queue, link)
        if manifest is None:
            return None
        try:
            found = await asyncio.to_thread(self._reader.offset_for_time, manifest, timestamp_ms)
        except (ObjectMissing, CorruptRecordError) as exc:
            raise DataLost(
                f"{topic}/{queue}: broker {link.broker}'s offloaded data cannot be read: {exc}"
            ) from None
        if found is None or found >= link.physical_end:
            return None
        return max(found, link.physical_start)

    async def drop_through(self, topic: str, queue: int, broker: str, below: int | None) -> int:
        """Delete `broker`'s files of the queue that end at or before physical offset
        `below` (None: all of them, and then its manifest), for links about to leave the
        chain. The manifest drops them first (readers see those offsets expired, never a
        listed file that is gone); repeating a cut-short call finishes it. Returns the
        files deleted."""
        manifest = await self.manifest(broker, topic, queue, fresh=True)
        path = manifest_path(broker, topic, queue)
        if below is None:
            listed = await asyncio.to_thread(
                self._store.list, queue_data_prefix(topic, broker, queue)
            )
            gone = [o.path for o in listed]
            if manifest is not None and manifest.files:
                await self._put(path, manifest, len(manifest.files))
        elif manifest is None:
            return 0
        else:
            n = sum(1 for f in manifest.files if f.end <= below)
            gone = [f.path for f in manifest.files[:n]]
            if n:
                await self._put(path, manifest, n)
        for p in gone:
            await asyncio.to_thread(self._store.delete, p)
            self._reader.drop(p)
        if below is None and manifest is not None:
            await asyncio.to_thread(self._store.delete, path)
        self._manifests.pop((broker, topic, queue), None)
        self._stats.deleted_files += len(gone)
        return len(gone)

    async def _put(self, path: str, manifest: QueueManifest, drop: int) -> None:
        """`manifest` without its first `drop` files, its start where they ended."""
        kept = msgspec.structs.replace(
            manifest, files=manifest.files[drop:], log_start=manifest.files[drop - 1].end
        )
        await asyncio.to_thread(self._store.put, path, encode_manifest(kept))
