"""Producer ids' owners as records of a compact internal topic (`PRODUCERS_TOPIC`), so
that they are in the commit log and replicate with it: a replica group's new leader
knows which user each id its predecessor issued belongs to, and a PRODUCE with another
user's id is refused there too (issue 16's binding, issue 23's failover).

One message per binding, in a batch of its own::

    key   = the producer id, 8 bytes big-endian (signed: ids are int64)
    value = the principal, UTF-8

The topic is compact, so a key keeps its newest value. It is created on the first
binding (a broker without logins never writes it). INIT_PRODUCER is answered once the
binding is durable and (in a replica group) committed, as a produce is: an id a client
holds always has its owner in the log. Each binding also removes the one `keep` ids
below it (a tombstone), so the topic holds about `keep` bindings after compaction, as
the metadata table did.

A lookup reads the newest value of the key (`MessageStore.lookup_key`: the compact
queue's dirty-key table, else the compacted log). When it finds nothing while the log
holds records readers cannot see yet (a new leader whose followers have not reported
since it was elected), it waits until they are visible and looks again: such a record may
be the binding, and binding the id to the first user who asks instead would hand
another user's id over. Bindings kept by older versions in the metadata table are read
when the topic has none.
"""

from __future__ import annotations

import struct
from typing import Final

from tidemq.broker.store_gateway import StoreGateway
from tidemq.core.batch import MessageRecord, encode_batch
from tidemq.core.errors import TopicNotFound
from tidemq.core.properties import PRODUCERS_TOPIC
from tidemq.store.message_store import MessageStore
from tidemq.store.metadata import CleanupPolicy

__all__ = ["PRODUCERS_TOPIC", "ProducerOwnerTopic"]

_ID: Final = struct.Struct(">q")


class ProducerOwnerTopic:
    """The durable copy of `ProducerOwners`' bindings. Runs on the loop."""

    def __init__(self, gateway: StoreGateway, *, keep: int) -> None:
        self._gateway = gateway
        self._keep = keep

    @property
    def _store(self) -> MessageStore:
        return self._gateway.store

    async def save(self, producer_id: int, principal: str) -> None:
        """Bind `producer_id` to `principal`; returns once durable and committed."""
        self._ensure_topic()
        messages = [MessageRecord(principal.encode(), _ID.pack(producer_id))]
        forget = producer_id - self._keep
        if forget >= 0:
            messages.append(MessageRecord(None, _ID.pack(forget)))
        await self._gateway.append(PRODUCERS_TOPIC, 0, encode_batch(messages))

    async def load(self, producer_id: int) -> str | None:
        """The principal `producer_id` is bound to, None if it is bound to none."""
        owner = self._lookup(producer_id)
        if owner is None and self._unsettled():
            await self._gateway.settled()
            owner = self._lookup(producer_id)
        if owner is None:
            owner = self._store.metadata.producer_owner(producer_id)  # older versions
        return owner

    def _lookup(self, producer_id: int) -> str | None:
        try:
            found = self._store.lookup_key(PRODUCERS_TOPIC, 0, _ID.pack(producer_id))
        except TopicNotFound:
            return None
        if found is None or found.value is None:
            return None
        return bytes(found.value).decode()

    def _unsettled(self) -> bool:
        store = self._store
        return store.visible_position < store.end_position

    def _ensure_topic(self) -> None:
        store = self._store
        try:
            store.topic(PRODUCERS_TOPIC)
        except TopicNotFound:
            store.create_topic(
                PRODUCERS_TOPIC,
                1,
                cleanup_policy=CleanupPolicy.COMPACT,
                retention_ms=-1,
                retention_bytes=-1,
            )
