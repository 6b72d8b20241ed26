"""A broker's tier ranges and static-topic chains as records of a compact internal topic
(`TABLES_TOPIC`), so that they are in the commit log and replicate with it: a replica
group's promoted member serves the offloaded history and the static links its
predecessor recorded, and a member that started over gets them with the compacted log
(issue 23, ADR 23; the design note docs/design/replication.md, "Tier ranges and static
chains").

The store keeps both tables in its metadata (`store/remote_ranges.py`,
`store/static_queues.py`) and notes each key it sets (`changed`). `publish` writes the
current row of every noted key into the topic, one message per key, in one batch, and
returns once it is durable and committed by the group::

    key   = msgpack [kind, topic id, queue]      kind "range" or "chain"
    value = msgpack [log start, remote end]      a range
            msgpack [writable, chain bytes]      a chain (`core.static_chain` encoding)
            none                                 the row is gone (its topic was deleted)

Topic ids are the same on every member (followers mirror the leader's table under its
ids). The broker publishes after each tier pass and before each static change is
answered (its registration with the name servers, which every chain change awaits): an
acknowledged seal, open or update is in the group's log.

`catch_up` applies the topic to the tables from where they last stood (the counter
`tables_applied`): a follower after each fetch round, up to the committed position (what
no election takes back), so that its retention of offloaded topics follows the leader's
remote ends; a broker once at its start, up to its log's end (elected, its log is the
group's). A leader never applies its own records while it leads: a record is older than
the table it was taken from. A record of a topic id the member has not mirrored yet stops
the catch-up there (the next round goes on); a record of a deleted topic is skipped.

At each start a broker writes every row again (after applying the topic): a change
made just before a crash reaches the log then, and a data directory from before the topic
gets its rows into it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

import msgspec

from tidemq.broker.store_gateway import StoreGateway
from tidemq.core.batch import MessageRecord, decode_columns, decode_messages, encode_batch
from tidemq.core.batch import message_offsets as batch_offsets
from tidemq.core.errors import InvalidBatch, TopicNotFound
from tidemq.core.properties import TABLES_TOPIC
from tidemq.core.record import parse_header
from tidemq.core.static_chain import decode_chain, encode_chain
from tidemq.store.message_store import MessageStore, ReadStatus
from tidemq.store.metadata import CleanupPolicy

__all__ = ["TABLES_TOPIC", "MemberTables", "catch_up", "ensure_tables_topic"]

log = logging.getLogger(__name__)

RANGE: Final = "range"
CHAIN: Final = "chain"
#: Bytes per read while catching up.
_READ_BYTES: Final = 4 << 20
#: Rows per batch of a publish.
_BATCH_ROWS: Final = 4096

_encode = msgspec.msgpack.Encoder()
_decode_key = msgspec.msgpack.Decoder(tuple[str, int, int])
_decode_range = msgspec.msgpack.Decoder(tuple[int, int])
_decode_chain = msgspec.msgpack.Decoder(tuple[bool, bytes])


def ensure_tables_topic(store: MessageStore) -> None:
    """Create the topic on first use (the first publish with a row: a broker without
    tiered or static topics never has it): one queue, compact, kept forever."""
    try:
        store.topic(TABLES_TOPIC)
    except TopicNotFound:
        store.create_topic(
            TABLES_TOPIC,
            1,
            cleanup_policy=CleanupPolicy.COMPACT,
            retention_ms=-1,
            retention_bytes=-1,
        )


def _rows(store: MessageStore) -> list[MessageRecord]:
    """The current row of every key the store set since the last publish."""
    out: list[MessageRecord] = []
    for key in sorted(store.remote.changed):
        r = store.remote.get(key)
        value = None if r is None else _encode.encode((r.log_start, r.remote_end))
        out.append(MessageRecord(value, _encode.encode((RANGE, *key))))
    for key in sorted(store.static.changed):
        chain = store.static.get(*key)
        value = (
            None
            if chain is None
            else _encode.encode((store.static.is_writable(*key), encode_chain(chain)))
        )
        out.append(MessageRecord(value, _encode.encode((CHAIN, *key))))
    _forget_changes(store)
    return out


def _forget_changes(store: MessageStore) -> None:
    store.remote.changed.clear()
    store.static.changed.clear()


class MemberTables:
    """Publishes a broker's table changes into the log. Runs on the loop."""

    def __init__(self, gateway: StoreGateway, *, replicated: bool) -> None:
        """`replicated`: the broker leads a replica group. A lone broker's own metadata
        is the only copy anyone reads: it writes no rows (a static remap then writes
        nothing to its commit log, and costs no extra sync)."""
        self._gateway = gateway
        self._replicated = replicated
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Before serving: apply what the log holds (all of it: this broker's log is
        the group's), then write every row once more. The tables may hold a change
        made just before a crash that never reached the log (published after it, never
        acknowledged: a repeated request finds it done and changes nothing), and a data
        directory from before the topic has rows only there."""
        store = self._gateway.store
        if not self._replicated:
            _forget_changes(store)
            return
        catch_up(store, whole=True)
        store.remote.changed.update(store.remote.keys())
        store.static.changed.update(store.static.keys())
        await self.publish()

    async def publish(self) -> None:
        """Write the rows changed since the last publish; returns once committed."""
        async with self._lock:
            store = self._gateway.store
            if not self._replicated:
                _forget_changes(store)
                return
            rows = _rows(store)
            if not rows:
                return
            ensure_tables_topic(store)
            meta = store.metadata
            end = store.queue_bounds(TABLES_TOPIC, 0)[1]
            batches: list[tuple[str, int, bytes | memoryview, bytes, int]] = [
                (TABLES_TOPIC, 0, encode_batch(rows[i : i + _BATCH_ROWS]), b"", 0)
                for i in range(0, len(rows), _BATCH_ROWS)
            ]
            try:
                _results, error = await self._gateway.append_many(batches)
            except BaseException:
                _renote(store, rows)
                raise
            if error is not None:
                _renote(store, rows)
                raise error
            if (meta.tables_applied() or 0) == end:
                # Nothing but these rows since the tables last stood: they stand past them.
                meta.set_tables_applied(store.queue_bounds(TABLES_TOPIC, 0)[1])


def _end(store: MessageStore) -> int:
    """The topic's next offset; 0 before it exists (created by the first publish)."""
    try:
        return store.queue_bounds(TABLES_TOPIC, 0)[1]
    except TopicNotFound:
        return 0


def _renote(store: MessageStore, rows: list[MessageRecord]) -> None:
    """A publish failed: its keys are noted again for the next one."""
    for row in rows:
        assert row.key is not None
        kind, topic_id, queue = _decode_key.decode(row.key)
        (store.remote.changed if kind == RANGE else store.static.changed).add((topic_id, queue))


def catch_up(store: MessageStore, *, whole: bool = False) -> int:
    """Apply the topic's records past where the tables stand, up to what readers may see
    (`whole`: up to the log's end); the count applied. No topic: nothing to do."""
    try:
        low, end = store.queue_bounds(TABLES_TOPIC, 0)
    except TopicNotFound:
        return 0
    meta = store.metadata
    applied = meta.tables_applied() or 0
    if applied > end:
        log.warning(
            "member tables: stood at %d, past their topic's end %d (records were cut): "
            "applying the topic again from its start",
            applied,
            end,
        )
        applied = 0
    if applied >= end:
        return 0
    limit = store.commit_limit
    if whole:
        store.commit_limit = None  # this member's log is the group's now
    try:
        return _apply_from(store, max(applied, low), applied)
    finally:
        store.commit_limit = limit
        # What was applied came from the log: nothing of it to publish again.
        store.remote.changed.clear()
        store.static.changed.clear()


def _apply_from(store: MessageStore, offset: int, applied: int) -> int:
    meta = store.metadata
    live = {t.id for t in store.topics()}
    mirrored = meta.max_topic_id()
    done = 0
    while True:
        result = store.read(TABLES_TOPIC, 0, offset, max_bytes=_READ_BYTES)
        if result.status is not ReadStatus.FOUND or not result.batches:
            return done
        for batch in result.batches:
            payload = memoryview(batch.record)[parse_header(batch.record).payload_start :]
            offsets = batch_offsets(decode_columns(payload), batch.base_offset)
            for at, message in zip(offsets, decode_messages(payload), strict=True):
                if at < applied:
                    continue  # a compacted batch can start before where the tables stand
                if message.key is None:
                    raise InvalidBatch(f"a record of {TABLES_TOPIC} has no key")
                kind, topic_id, queue = _decode_key.decode(message.key)
                if topic_id > mirrored:
                    meta.set_tables_applied(at)  # the next round, with the topic table
                    return done
                if topic_id in live and message.value is not None:
                    _apply(store, kind, (topic_id, queue), bytes(message.value))
                    done += 1
        meta.set_tables_applied(result.next_offset)
        offset = result.next_offset


def _apply(store: MessageStore, kind: str, key: tuple[int, int], value: bytes) -> None:
    if kind == RANGE:
        log_start, remote_end = _decode_range.decode(value)
        store.remote.set(key, log_start, remote_end)
    elif kind == CHAIN:
        writable, raw = _decode_chain.decode(value)
        store.static.set(key[0], key[1], decode_chain(raw), writable=writable)
    else:
        raise InvalidBatch(f"a record of {TABLES_TOPIC} of unknown kind {kind!r}")
