"""The broker's offloaded topics in the bucket (`tidemq.tiered.catalog`), and the restore
of a broker whose disk was lost from them.

`publish` writes each offloaded topic's entry when it is new or its configs (or a static
topic's chains) changed; `forget` removes it with the topic. `restore` runs once, at the
tier service's first pass: on a broker with no topic of its own (a new, empty data
directory) it creates every topic of the bucket's catalog as it was (creation time
included, so that the manifests match) and lets each queue continue where its offloaded
data ends. A static topic gets its chains back as the entry has them, read-only: the
links of this broker serve their offloaded offsets again, and a write end that was here
stays closed until a remap opens it on another broker (the entry may be older than the
brokers' chains, and the queue's local tail is gone). A broker that already
has topics restores nothing: a catalog entry of a topic it does not have is left alone
(deleting remote data because it is missing locally would turn a wrong data directory
into data loss).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from tidemq.broker.store_gateway import StoreGateway
from tidemq.broker.topics import TopicTable
from tidemq.core.static_chain import STATIC_KEY, QueueChain
from tidemq.store.message_store import MessageStore
from tidemq.store.metadata import CleanupPolicy, MessageType, TopicInfo
from tidemq.tiered.catalog import (
    TopicEntry,
    catalog_path,
    catalog_prefix,
    decode_entry,
    encode_entry,
)
from tidemq.tiered.manifest import decode_manifest, manifest_path
from tidemq.tiered.object_store import ObjectMissing, ObjectStore

__all__ = ["TierCatalog"]

log = logging.getLogger(__name__)


def _entry(info: TopicInfo, chains: list[QueueChain]) -> TopicEntry:
    return TopicEntry(
        name=info.name,
        queues=info.queues,
        message_type=info.message_type.value,
        cleanup_policy=info.cleanup_policy.value,
        retention_ms=info.retention_ms,
        retention_bytes=info.retention_bytes,
        config=dict(info.config),
        created_ms=info.created_ms,
        chains=chains,
    )


class TierCatalog:
    def __init__(
        self, store: ObjectStore, broker: str, gateway: StoreGateway, topics: TopicTable
    ) -> None:
        self._store = store
        self._broker = broker
        self._gateway = gateway
        self._topics = topics
        #: Topic name -> the entry last written (what this process knows is there).
        self._written: dict[str, bytes] = {}
        self.restore_checked = False
        self._restoring = asyncio.Lock()
        #: Topics rebuilt from the bucket by this broker's start.
        self.restored: list[str] = []

    async def _io(self, fn: Callable[..., Any], *args: object) -> Any:
        return await asyncio.to_thread(fn, *args)

    async def publish(self, topics: list[TopicInfo]) -> None:
        for info in topics:
            held = self._gateway.store.static.of_topic(info.id)
            data = encode_entry(_entry(info, [held[q] for q in sorted(held)]))
            if self._written.get(info.name) != data:
                await self._io(self._store.put, catalog_path(self._broker, info.name), data)
                self._written[info.name] = data

    def known(self) -> list[str]:
        """The topics whose entries this process wrote (or restored)."""
        return list(self._written)

    async def forget(self, name: str) -> None:
        await self._io(self._store.delete, catalog_path(self._broker, name))
        self._written.pop(name, None)

    async def restore(self) -> None:
        """Rebuild the bucket's topics on a broker that has none (once)."""
        async with self._restoring:  # the start's attempt and a pass's never overlap
            await self._restore_once()

    async def _restore_once(self) -> None:
        if self.restore_checked:
            return
        if self._topics.all():
            self.restore_checked = True
            return
        listed = await self._io(self._store.list, catalog_prefix(self._broker))
        for obj in listed:
            entry = decode_entry(await self._io(self._store.get, obj.path))
            await self._restore_topic(entry)
        self.restore_checked = True
        if self.restored:
            await self._topics.refresh()

    async def _restore_topic(self, entry: TopicEntry) -> None:
        ends: dict[int, tuple[int, int]] = {}
        for q in range(entry.queues):
            try:
                raw = await self._io(self._store.get, manifest_path(self._broker, entry.name, q))
            except ObjectMissing:
                continue  # nothing of this queue was offloaded: it starts empty
            manifest = decode_manifest(raw)
            if manifest.topic_created_ms == entry.created_ms:
                ends[q] = (manifest.log_start, manifest.end)

        def create(store: MessageStore) -> None:
            store.create_topic(
                entry.name,
                entry.queues,
                message_type=MessageType(entry.message_type),
                cleanup_policy=CleanupPolicy(entry.cleanup_policy),
                retention_ms=entry.retention_ms,
                retention_bytes=entry.retention_bytes,
                config=entry.config,
                created_ms=entry.created_ms,
            )
            for q, (start, end) in ends.items():
                store.offload.restore_queue(entry.name, q, start, end)
            for chain in entry.chains if entry.config.get(STATIC_KEY) == "true" else ():
                # Read-only: the chain may be older than the brokers' (a remap after the
                # entry was written), and the write end's tail was lost with the disk.
                store.set_static_chain(entry.name, chain.queue, chain, writable=False)

        await self._gateway.call(create)
        self._written[entry.name] = encode_entry(entry)
        self.restored.append(entry.name)
        log.warning(
            "tiered storage: restored topic %s from %s (%d queues, offsets up to %s)",
            entry.name,
            self._store.url,
            entry.queues,
            {q: end for q, (_, end) in ends.items()},
        )
        ends_here = [
            c.queue for c in entry.chains if (w := c.write_end) and w.broker == self._broker
        ]
        if ends_here and entry.config.get(STATIC_KEY) == "true":
            log.warning(
                "tiered storage: static topic %s: queues %s had their write end here; they "
                "are read-only now: `tidemq topic remap %s --queue Q --to BROKER` opens them "
                "on another broker",
                entry.name,
                ends_here,
                entry.name,
            )
