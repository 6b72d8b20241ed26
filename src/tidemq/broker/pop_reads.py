"""How pop consumption reads messages: the never-delivered ones past a queue's next offset
(filtered; on FIFO topics, a message group's later messages held back), the stored batch
of a redelivery (from tiered storage too), and where a message was first stored (a
retried one's headers say) with the id consumers know it by."""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

from tidemq.broker.filters import matches as record_matches
from tidemq.broker.filters import matches_messages, summary_mask
from tidemq.broker.pop_leases import PopQueue
from tidemq.broker.store_gateway import StoreGateway
from tidemq.core.batch import MessageRecord, decode_messages
from tidemq.core.errors import TierUnavailable
from tidemq.core.filters import Sql92Filter, TagExpression
from tidemq.core.message import message_id, record_offsets
from tidemq.core.properties import decode_properties
from tidemq.core.record import HEADER, RecordFlags, parse_header
from tidemq.core.retry_headers import (
    RETRY_ATTEMPTS_HEADER,
    RETRY_OFFSET_HEADER,
    RETRY_ORIGIN_HEADER,
    RETRY_PREFIX,
    RETRY_QUEUE_HEADER,
    RETRY_TOPIC_HEADER,
    parse_retry_origin,
)
from tidemq.store.message_store import MessageStore, ReadResult, ReadStatus, StoredBatch

if TYPE_CHECKING:
    from tidemq.broker.tier_service import TierService

__all__ = [
    "NO_LIMIT",
    "Origin",
    "PopReader",
    "Taken",
    "earlier_attempts",
    "first_stored_here",
    "message_of",
    "offsets_in",
    "queue_reader",
    "read_message",
    "take_new",
]

#: Bytes read per queue per receive while looking for messages.
_READ_BYTES: Final = 1 << 20
#: FIFO messages one receive may read past and hold back (behind their group's first).
_MAX_HELD_PER_RECEIVE: Final = 10_000
#: `take_new`'s limit when there is none.
NO_LIMIT: Final = 1 << 62


class PopReader:
    """The pop service's reads that need the store or the tier (on the broker's loop)."""

    def __init__(
        self, gateway: StoreGateway, logical_offset: Callable[[str, int, int], int]
    ) -> None:
        self._gateway = gateway
        self._logical_offset = logical_offset
        #: Tiered storage's reads of offloaded offsets (None: not configured).
        self.tier: TierService | None = None

    def first_stored(
        self,
        topic: str,
        queue: int,
        offset: int,
        found: tuple[MessageRecord, tuple[str, int, int] | None],
    ) -> Origin:
        """Where the message was first stored, by the offset clients know it by."""
        origin = first_stored_here(topic, queue, offset, found)
        if topic.startswith(RETRY_PREFIX):
            return origin  # its headers carry the first place, as clients know it
        return dataclasses.replace(origin, offset=self._logical_offset(topic, queue, offset))

    async def read_tier_first(
        self, topic: str, queue: int, offset: int, flt: TagExpression | Sql92Filter
    ) -> ReadResult | None:
        """The first read of a receive, from the object store when `offset` is only
        there (tiered storage); None when the store holds it (or no tier is set)."""
        store = self._gateway.store
        info, index = store.index_of(topic, queue)
        if self.tier is None or offset >= index.min_offset or (info.id, queue) not in store.remote:
            return None  # the usual case, known from the index alone: no read here
        mask = summary_mask(flt)
        result = store.read(topic, queue, offset, max_bytes=1, tag_mask=mask)
        if result.status is not ReadStatus.REMOTE:
            return None
        got = await self.tier.reads.read(store.topic(topic), queue, offset, _READ_BYTES, mask)
        if got is None:  # remote retention removed it meanwhile: the store says so
            return None
        batches, next_offset = got
        status = ReadStatus.FOUND if batches else ReadStatus.NO_NEW_MESSAGE
        return ReadResult(status, batches, next_offset, result.min_offset, result.max_offset)

    async def read_one(self, topic: str, queue: int, offset: int) -> StoredBatch | None:
        """The stored batch holding `offset` (a redelivery), from the tier if need be."""
        store = self._gateway.store
        found = store.read(topic, queue, offset, max_bytes=1)
        if found.status is ReadStatus.REMOTE and self.tier is not None:
            got = await self.tier.reads.read(store.topic(topic), queue, offset, 1, 0)
            return got[0][0] if got and got[0] else None
        return found.batches[0] if found.batches else None

    async def message_at(
        self, topic: str, queue: int, offset: int
    ) -> tuple[MessageRecord, tuple[str, int, int] | None] | None:
        """`read_message`, from the tier too (a message leased from offloaded data)."""
        found = await self.read_one(topic, queue, offset)
        return None if found is None else message_of(found, offset)

    def display_id(self, topic: str, queue: int, offset: int) -> str:
        """The id a consumer knows a message by (for a retried one, its first id)."""
        if topic.startswith(RETRY_PREFIX):
            found = read_message(self._gateway.store, topic, queue, offset)
            if found is not None:
                return self.first_stored(topic, queue, offset, found).message_id
        return message_id(topic, queue, self._logical_offset(topic, queue, offset))


@dataclass(slots=True)
class Taken:
    """What one receive takes from a queue: (offset, attempt) pairs to lease, the message
    group of each (FIFO topics; "" otherwise), and FIFO messages held back."""

    chosen: list[tuple[int, int]]
    groups: list[str] = field(default_factory=list)
    held: list[int] = field(default_factory=list)
    held_groups: list[str] = field(default_factory=list)


def take_new(
    store: MessageStore,
    topic: str,
    queue: int,
    *,
    read: Callable[[int, int], ReadResult],
    flt: TagExpression | Sql92Filter,
    next_offset: int,
    taken: Taken,
    want: int,
    fifo_table: PopQueue | None,
    limit: int = NO_LIMIT,
) -> tuple[dict[int, bytes], int]:
    """Add never-delivered messages that pass the filter to `taken` (up to `want`);
    returns the records read (by base offset) and the new next offset. With `fifo_table`
    (a FIFO topic), a message whose group (its key) has an earlier unfinished message is
    held back instead, and at most one message per group is taken. Nothing at or past
    `limit` is read. `read(offset, tag_mask)` reads the queue (`queue_reader`)."""
    records: dict[int, bytes] = {}
    chosen = taken.chosen
    end = min(store.queue_bounds(topic, queue)[1], limit)
    while len(chosen) < want and next_offset < end and len(taken.held) < _MAX_HELD_PER_RECEIVE:
        result = read(next_offset, summary_mask(flt))
        if result.status is ReadStatus.OFFSET_OUT_OF_RANGE:
            if next_offset >= result.min_offset:
                break
            next_offset = result.min_offset  # retention removed the ones before
            continue
        if result.status is not ReadStatus.FOUND:
            return records, max(next_offset, result.next_offset)
        for batch in result.batches:
            if fifo_table is None:
                matches, keys = record_matches(batch.record, flt), None
            else:  # decode once for both the keys and the filter
                header = parse_header(batch.record)
                decoded = decode_messages(memoryview(batch.record)[header.payload_start :])
                matches = matches_messages(decoded, flt)
                keys = [m.key.hex() if m.key else "" for m in decoded]
            offsets = record_offsets(batch.record)  # a compacted batch may skip offsets
            for i in range(bisect.bisect_left(offsets, next_offset), batch.count):
                if len(chosen) >= want or offsets[i] >= limit:
                    return records, next_offset
                offset = offsets[i]
                next_offset = offset + 1
                if matches is not None and not matches[i]:
                    continue
                group = keys[i] if keys is not None else ""
                if group and fifo_table is not None and fifo_table.busy(group):
                    taken.held.append(offset)
                    taken.held_groups.append(group)
                    continue
                chosen.append((offset, 1))
                taken.groups.append(group)
                records[batch.base_offset] = batch.record
                if group and fifo_table is not None:
                    fifo_table.join_group(offset, group)  # busy from here on
        next_offset = max(next_offset, result.next_offset)
    return records, next_offset


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a message was first stored (a retried one: before its first retry) and the id
    a consumer knows it by; `id_origin` when that id comes from an internal topic (a
    delayed or transactional message)."""

    topic: str
    queue: int
    offset: int
    id_origin: tuple[str, int, int] | None

    @property
    def message_id(self) -> str:
        if self.id_origin is not None:
            return message_id(*self.id_origin)
        return message_id(self.topic, self.queue, self.offset)


def queue_reader(
    store: MessageStore, topic: str, queue: int, first: ReadResult | None, *, tiered: bool
) -> Callable[[int, int], ReadResult]:
    """`take_new`'s reads of a queue: `first` (read from the tier by the caller) for the
    first call, then the store. An offset that is only in the tier ends the receive's
    scan (the next receive reads it from the tier first); without a tier it is an error."""
    pending = [] if first is None else [first]

    def read(offset: int, tag_mask: int) -> ReadResult:
        if pending:
            return pending.pop()
        result = store.read(topic, queue, offset, max_bytes=_READ_BYTES, tag_mask=tag_mask)
        if result.status is not ReadStatus.REMOTE:
            return result
        if not tiered:
            raise TierUnavailable(
                f"offset {offset} of {topic}/{queue} is in the object store, and tiered "
                "storage (tiered.url) is not set on this broker"
            )
        return ReadResult(
            ReadStatus.NO_NEW_MESSAGE, [], offset, result.min_offset, result.max_offset
        )

    return read


def read_message(
    store: MessageStore, topic: str, queue: int, offset: int
) -> tuple[MessageRecord, tuple[str, int, int] | None] | None:
    """The message at `offset`, and the id origin its record names (delivered by the
    timer, published by a transaction), or None if it is no longer stored locally."""
    found = store.read(topic, queue, offset, max_bytes=1)
    return message_of(found.batches[0], offset) if found.batches else None


def message_of(
    b: StoredBatch, offset: int
) -> tuple[MessageRecord, tuple[str, int, int] | None] | None:
    """The message at `offset` of stored batch `b`, and its id origin (see above)."""
    offsets = record_offsets(b.record)
    i = bisect.bisect_left(offsets, offset)
    if i == len(offsets) or offsets[i] != offset:
        return None  # no longer stored (retention, or compaction removed it)
    header = parse_header(b.record)
    props = decode_properties(memoryview(b.record)[HEADER.size : header.payload_start])
    messages = decode_messages(memoryview(b.record)[header.payload_start :])
    origin = props.origin
    return messages[i], None if origin is None else (origin[0], origin[1], origin[2] + i)


def first_stored_here(
    topic: str,
    queue: int,
    offset: int,
    found: tuple[MessageRecord, tuple[str, int, int] | None],
) -> Origin:
    message, id_origin = found
    first_topic = _header(message, RETRY_TOPIC_HEADER)
    if not topic.startswith(RETRY_PREFIX) or first_topic is None:
        return Origin(topic, queue, offset, id_origin)
    first_queue = _header(message, RETRY_QUEUE_HEADER) or ""
    first_offset = _header(message, RETRY_OFFSET_HEADER) or ""
    if not first_queue.isdigit() or not first_offset.isdigit():
        return Origin(topic, queue, offset, id_origin)
    return Origin(
        first_topic,
        int(first_queue),
        int(first_offset),
        parse_retry_origin(_header(message, RETRY_ORIGIN_HEADER)),
    )


def earlier_attempts(records: dict[int, bytes], offset: int) -> int:
    """Deliveries a message of a retry topic had before it was retried (its header)."""
    message = _message_in(records, offset)
    if message is None:
        return 0
    value = _header(message, RETRY_ATTEMPTS_HEADER)
    return int(value) if value is not None and value.isdigit() else 0


def _message_in(records: dict[int, bytes], offset: int) -> MessageRecord | None:
    for base, record in records.items():
        header = parse_header(record)
        if base <= offset < base + header.count:
            return decode_messages(memoryview(record)[header.payload_start :])[offset - base]
    return None


def _header(message: MessageRecord, name: str) -> str | None:
    for key, value in message.headers:
        if key == name:
            return bytes(value).decode(errors="replace")
    return None


def offsets_in(record: bytes) -> range | set[int]:
    """The offsets a record holds, for membership tests."""
    header = parse_header(record)
    if not header.flags & RecordFlags.COMPACTED:
        return range(header.base_offset, header.base_offset + header.count)
    return set(record_offsets(record))
