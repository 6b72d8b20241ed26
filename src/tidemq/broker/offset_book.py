"""Consumer groups' committed offsets as records of a compact internal topic
(`OFFSETS_TOPIC`), so that they are in the commit log and replicate with it: a replica
group's new leader has every offset its old leader acknowledged (issue 23; the design
note docs/design/replication.md, "Consumer offsets").

A commit appends one batch to the topic, one message per queue, and is answered once the
batch is durable and (in a replica group) committed by the group. Each message's key is
the queue of a group, its value where the group goes on there::

    key   = msgpack [group, topic, queue]
    value = msgpack [topic id, next offset, commit time in epoch ms]

The topic is compact, so it keeps the newest value per key however many commits there
were. Lookups read a view of it: the metadata table `consumer_offsets`, with the counter
`offsets_applied`, the topic's offset the view has reached; both change in one SQLite
transaction (`Metadata.apply_offsets`). The view only ever takes records the store lets
readers see (durable, and committed by the replica group), so it never holds an offset
that a failover or a crash takes back, and `catch_up` brings it to the topic's visible end
before every lookup and after every commit. A follower keeps no view while it follows:
when it is elected, its broker starts and catches the view up from where it last stood
(the queue offsets of the topic are the same on every member: they copy the same records
at the same positions). A view ahead of its topic (an unclean election cut records it had
taken) is rebuilt from the topic's start.

The topic id in the value keeps a deleted topic's offsets from coming back: a record for
a topic that is now another topic (deleted, then created again under its name) or gone
is skipped. Id 0 is a topic this broker does not host (a group may read topics of other
brokers); those records always apply.

A data directory from before the book has offsets in the table only (no counter): on the
first start they are written into the topic once.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping
from typing import Final

import msgspec

from tidemq.broker.store_gateway import StoreGateway
from tidemq.core.batch import MessageRecord, decode_columns, decode_messages, encode_batch
from tidemq.core.batch import message_offsets as batch_offsets
from tidemq.core.errors import InvalidBatch, TopicNotFound
from tidemq.core.properties import OFFSETS_TOPIC
from tidemq.core.record import parse_header
from tidemq.store.message_store import MessageStore, ReadStatus
from tidemq.store.metadata import CleanupPolicy

__all__ = ["OFFSETS_TOPIC", "OffsetBook", "ensure_offsets_topic"]

log = logging.getLogger(__name__)

#: Messages per batch of a commit (a commit of more queues appends several batches).
_BATCH_MESSAGES: Final = 4096
#: Bytes per read while the view catches up.
_READ_BYTES: Final = 4 << 20

_encode = msgspec.msgpack.Encoder()
_Key = tuple[str, str, int]
_Value = tuple[int, int, int]
_decode_key = msgspec.msgpack.Decoder(_Key)
_decode_value = msgspec.msgpack.Decoder(_Value)

#: A row of the view: (group, topic, queue, offset or None to remove, commit ms).
Row = tuple[str, str, int, int | None, int]


def ensure_offsets_topic(store: MessageStore) -> None:
    """Create the offsets topic on first start: one queue, compact, kept forever."""
    try:
        store.topic(OFFSETS_TOPIC)
    except TopicNotFound:
        store.create_topic(
            OFFSETS_TOPIC,
            1,
            cleanup_policy=CleanupPolicy.COMPACT,
            retention_ms=-1,
            retention_bytes=-1,
        )


class OffsetBook:
    """The committed offsets of the groups this broker coordinates. Runs on the loop."""

    def __init__(self, gateway: StoreGateway) -> None:
        self._gateway = gateway
        #: (group, topic, queue) of commits appended and not yet answered, with how many.
        self._in_flight: dict[tuple[str, str, int], int] = {}

    @property
    def _store(self) -> MessageStore:
        return self._gateway.store

    async def start(self) -> None:
        """Before serving: the topic exists, a pre-book table is written into it once, and
        the view has caught up with the topic."""
        store = self._store
        ensure_offsets_topic(store)
        meta = store.metadata
        if meta.offsets_applied() is None:
            legacy = meta.all_offsets()
            by_group: dict[str, dict[tuple[str, int], int]] = {}
            for group, topic, queue, offset, _ms in legacy:
                by_group.setdefault(group, {})[(topic, queue)] = offset
            for group, offsets in by_group.items():
                await self.commit(group, offsets)
            if legacy:
                log.info("offset book: %d committed offset(s) moved into the log", len(legacy))
            else:
                meta.apply_offsets((), 0)  # the view starts at the topic's start
        self.catch_up()

    async def commit(self, group: str, offsets: Mapping[tuple[str, int], int]) -> None:
        """Store `offsets` for `group`; returns once they are durable and committed."""
        if not offsets:
            return
        keys = [(group, t, q) for t, q in offsets]
        for key in keys:
            self._in_flight[key] = self._in_flight.get(key, 0) + 1
        try:
            await self._append(group, offsets)
        finally:
            for key in keys:
                left = self._in_flight.pop(key) - 1
                if left:
                    self._in_flight[key] = left

    async def adopt(
        self, group: str, offsets: Mapping[tuple[str, int], int]
    ) -> dict[tuple[str, int], int]:
        """Commit those of `offsets` whose queue the group has no offset for here, not
        even one still being committed (offsets pulled from other brokers must not
        overwrite a commit made here meanwhile). Returns what it committed."""
        await self._settle()
        present = set(self._store.committed_offsets(group))
        present |= {(t, q) for g, t, q in self._in_flight if g == group}
        fresh = {tq: o for tq, o in offsets.items() if tq not in present}
        await self.commit(group, fresh)  # appended before its first wait: no gap
        return fresh

    async def _append(self, group: str, offsets: Mapping[tuple[str, int], int]) -> None:
        store = self._store
        now = store.clock.now_ms()
        messages = [
            MessageRecord(
                _encode.encode((self._topic_id(topic), offset, now)),
                _encode.encode((group, topic, queue)),
            )
            for (topic, queue), offset in sorted(offsets.items())
        ]
        batches: list[tuple[str, int, bytes | memoryview, bytes, int]] = [
            (OFFSETS_TOPIC, 0, encode_batch(messages[i : i + _BATCH_MESSAGES]), b"", 0)
            for i in range(0, len(messages), _BATCH_MESSAGES)
        ]
        _results, error = await self._gateway.append_many(batches)
        if error is not None:
            raise error
        self.catch_up()

    async def committed(self, group: str) -> dict[tuple[str, int], int]:
        """The group's committed offsets (topic, queue) -> next offset."""
        await self._settle()
        return self._store.committed_offsets(group)

    async def committed_with_time(self, group: str) -> dict[tuple[str, int], tuple[int, int]]:
        """The group's committed offsets with their commit times (epoch ms)."""
        await self._settle()
        return self._store.committed_offsets_with_time(group)

    async def groups(self) -> list[str]:
        """Groups with committed offsets here."""
        await self._settle()
        return self._store.groups()

    async def _settle(self) -> None:
        """Catch up; when the topic holds records readers cannot see yet (a new leader
        whose followers have not reported since it was elected: those records may be
        commits its predecessor acknowledged), wait until they are visible and catch up
        again, rather than answer offsets older than a consumer was told are stored."""
        self.catch_up()
        store = self._store
        if (store.metadata.offsets_applied() or 0) < store.queue_bounds(OFFSETS_TOPIC, 0)[1]:
            await self._gateway.settled()
            self.catch_up()

    def catch_up(self) -> int:
        """Apply what the topic holds past the view and readers may see; the count of
        messages applied."""
        store = self._store
        meta = store.metadata
        applied = meta.offsets_applied() or 0
        low, end = store.queue_bounds(OFFSETS_TOPIC, 0)
        if applied > end:
            log.warning(
                "offset book: the view stood at %d, past the topic's end %d (records were "
                "cut by an unclean election); rebuilding it from the topic",
                applied,
                end,
            )
            meta.clear_offsets_view()
            applied = 0
        done = 0
        for rows, next_offset in self._rows_from(max(applied, low), applied):
            meta.apply_offsets(rows, next_offset)
            done += len(rows)
        return done

    def _rows_from(self, offset: int, applied: int) -> Iterator[tuple[list[Row], int]]:
        """The view's rows of each read from `offset` on (messages before `applied`
        skipped: a compacted batch can start before it), with where the read ended."""
        store = self._store
        while True:
            result = store.read(OFFSETS_TOPIC, 0, offset, max_bytes=_READ_BYTES)
            if result.status is not ReadStatus.FOUND or not result.batches:
                return
            rows: list[Row] = []
            for batch in result.batches:
                payload = memoryview(batch.record)[parse_header(batch.record).payload_start :]
                offsets = batch_offsets(decode_columns(payload), batch.base_offset)
                for at, message in zip(offsets, decode_messages(payload), strict=True):
                    if at >= applied:
                        row = self._row(message)
                        if row is not None:
                            rows.append(row)
            yield rows, result.next_offset
            offset = result.next_offset

    def _row(self, message: MessageRecord) -> Row | None:
        if message.key is None:
            raise InvalidBatch("a record of the offsets topic has no key")
        group, topic, queue = _decode_key.decode(message.key)
        if message.value is None:
            return (group, topic, queue, None, 0)
        topic_id, offset, ms = _decode_value.decode(message.value)
        if topic_id and self._topic_id(topic) != topic_id:
            return None  # the topic was deleted (and maybe created again) since
        return (group, topic, queue, offset, ms)

    def _topic_id(self, topic: str) -> int:
        try:
            return self._store.topic(topic).id
        except TopicNotFound:
            return 0
