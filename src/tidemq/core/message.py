"""Messages as clients see them, and the decoding of fetched records into them."""

from __future__ import annotations

import dataclasses
import functools
import operator
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Generic, NamedTuple, overload

import crc32c
import numpy as np
import numpy.typing as npt
from typing_extensions import TypeVar

from tidemq.core.batch import (
    BatchColumns,
    BinaryColumn,
    columns_to_records,
    decode_columns,
    first_index_at,
    message_offsets,
)
from tidemq.core.errors import CorruptRecordError
from tidemq.core.properties import decode_properties
from tidemq.core.record import HEADER, RecordFlags, RecordHeader, parse_header

__all__ = [
    "BatchReceipts",
    "Message",
    "MessageBatch",
    "Receipt",
    "iter_records",
    "message_id",
    "messages_from_records",
    "parse_message_id",
    "topic_hash",
    "with_append_time",
]

#: Records whose messages keep the id they had where they were first stored.
_MOVED = RecordFlags.FROM_TIMER | RecordFlags.FROM_TRANSACTION


@functools.lru_cache(maxsize=4096)
def _topic_hash(topic: str) -> int:
    # Cached: a batch of 256 receipts would otherwise hash its topic 256 times.
    return int(crc32c.crc32c(topic.encode()))


def message_id(topic: str, queue: int, offset: int) -> str:
    """A message's id: 28 hex digits from (topic, queue, offset), the same for every reader.

    Unique within a topic's life on a broker; RocketMQ ids are opaque strings too.
    """
    return f"{_topic_hash(topic):08X}{queue:04X}{offset:016X}"


def parse_message_id(text: str) -> tuple[int, int, int]:
    """(topic hash, queue, offset) of an id made by `message_id`; ValueError if it is not
    one."""
    if len(text) != 28:
        raise ValueError(f"a message id has 28 hex digits, got {text[:40]!r}")
    try:
        return int(text[:8], 16), int(text[8:12], 16), int(text[12:], 16)
    except ValueError:
        raise ValueError(f"a message id has 28 hex digits, got {text[:40]!r}") from None


def topic_hash(topic: str) -> int:
    return _topic_hash(topic)


class Receipt(NamedTuple):
    """What a producer gets back for one message: where it was stored.

    A named tuple, not a dataclass: a batch of 256 sends builds 256 of these, and a tuple
    is several times cheaper to build. The id is computed when asked for."""

    topic: str
    queue: int
    #: -1 while not yet known: a delayed message before delivery, a transactional one
    #: before commit.
    offset: int
    #: Where the message was first stored when that is not (topic, queue, offset): the timer
    #: topic for a delayed message, the half topic for a transactional one. Its id is
    #: computed from there, and stays the same after delivery or commit.
    origin: tuple[str, int, int] | None = None

    @property
    def message_id(self) -> str:
        if self.origin is not None:
            return message_id(*self.origin)
        return message_id(self.topic, self.queue, self.offset)


class BatchReceipts(Sequence[Receipt]):
    """The receipts of one batch stored at consecutive offsets: a read-only sequence that
    builds each Receipt when it is read. A batch of 256 messages answers with one of
    these instead of 256 tuples (the producer's hot path, issue #4); it compares equal to
    a list of the same receipts."""

    __slots__ = ("_base", "_count", "_queue", "_topic")

    def __init__(self, topic: str, queue: int, base_offset: int, count: int) -> None:
        if count < 0:
            raise ValueError(f"count must be >= 0, got {count}")
        self._topic, self._queue, self._base, self._count = topic, queue, base_offset, count

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> Receipt: ...

    @overload
    def __getitem__(self, index: slice) -> list[Receipt]: ...

    def __getitem__(self, index: int | slice) -> Receipt | list[Receipt]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        i = operator.index(index)
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError("receipt index out of range")
        return Receipt(self._topic, self._queue, self._base + i)

    def __iter__(self) -> Iterator[Receipt]:
        topic, queue = self._topic, self._queue
        for offset in range(self._base, self._base + self._count):
            yield Receipt(topic, queue, offset)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, BatchReceipts):
            return (self._topic, self._queue, self._base, self._count) == (
                other._topic,
                other._queue,
                other._base,
                other._count,
            ) or (self._count == other._count == 0)
        if isinstance(other, (list, tuple)):
            return len(other) == self._count and all(
                a == b for a, b in zip(self, other, strict=True)
            )
        return NotImplemented

    __hash__ = None  # type: ignore[assignment] # equal to lists, so unhashable like them

    def __repr__(self) -> str:
        return f"BatchReceipts({list(self)!r})"


#: A message's value type: bytes (None for a tombstone) as stored, or what a consumer's
#: `value_deserializer` made of them.
V = TypeVar("V", default=bytes | None)


@dataclass(frozen=True, slots=True)
class Message(Generic[V]):
    topic: str
    queue: int
    offset: int
    value: V
    key: bytes | None = None
    tag: str | None = None
    keys: tuple[str, ...] = ()
    headers: Mapping[str, bytes] = field(default_factory=dict)
    #: Producer's timestamp, milliseconds since the epoch.
    timestamp_ms: int = 0
    #: Where it was first stored, for delayed and transactional messages (see Receipt).
    origin: tuple[str, int, int] | None = None
    #: For a delayed message, the time it was scheduled for (epoch ms); 0 for others.
    deliver_at_ms: int = 0

    @property
    def timestamp(self) -> datetime:
        return datetime.fromtimestamp(self.timestamp_ms / 1000, tz=UTC)

    @property
    def message_id(self) -> str:
        if self.origin is not None:
            return message_id(*self.origin)
        return message_id(self.topic, self.queue, self.offset)


def iter_records(body: bytes | memoryview, sizes: list[int]) -> Iterator[memoryview]:
    """Split a fetch response body into its records."""
    view = memoryview(body)
    pos = 0
    for size in sizes:
        if size <= 0 or pos + size > len(view):
            raise CorruptRecordError("fetch response record sizes do not match its body")
        yield view[pos : pos + size]
        pos += size


@dataclass(frozen=True, slots=True)
class MessageBatch:
    """The messages of one fetched batch, column by column: what
    `StreamConsumer.poll_batches` gives instead of one `Message` per message.

    `columns` is the whole stored batch (`tidemq.core.batch.BatchColumns`, Arrow layouts
    over the received bytes: numpy offsets and memoryview data, no copy); `indices` are
    the positions in it that this poll delivers (those at or after the read position
    that passed the subscription's filter), in order. Message `indices[j]` is at offset
    `base_offset + indices[j]` (for a compacted batch, which may skip offsets,
    `base_offset + columns.offset_deltas[indices[j]]`)."""

    topic: str
    queue: int
    base_offset: int
    columns: BatchColumns
    indices: npt.NDArray[np.int64]
    #: For delayed and transactional messages: where the first message was first stored
    #: (the others follow it), and the time a delayed batch was scheduled for.
    origin: tuple[str, int, int] | None = None
    deliver_at_ms: int = 0

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def offsets(self) -> npt.NDArray[np.int64]:
        deltas = self.columns.offset_deltas
        return (self.indices if deltas is None else deltas[self.indices]) + self.base_offset

    def values(self) -> list[bytes | None]:
        """The delivered values as bytes (None for a tombstone): one slice each."""
        return _slices(self.columns.value, self.indices)

    def keys(self) -> list[bytes | None]:
        """The delivered keys (None: no key)."""
        return _slices(self.columns.key, self.indices)

    def tags(self) -> list[str | None]:
        """The delivered tags (None: no tag)."""
        return [None if t is None else t.decode() for t in _slices(self.columns.tag, self.indices)]

    def messages(self) -> list[Message]:
        """The same messages as `Message` objects, as `poll` gives them."""
        decoded = columns_to_records(self.columns)
        origin = self.origin
        return [
            Message(
                self.topic,
                self.queue,
                offset,
                decoded[i].value,
                decoded[i].key,
                decoded[i].tag,
                decoded[i].keys,
                dict(decoded[i].headers),
                decoded[i].timestamp_ms,
                None if origin is None else (origin[0], origin[1], origin[2] + i),
                self.deliver_at_ms,
            )
            for i, offset in zip(self.indices.tolist(), self.offsets.tolist(), strict=True)
        ]


def _slices(column: BinaryColumn, indices: npt.NDArray[np.int64]) -> list[bytes | None]:
    data, bounds = column.data, column.offsets.tolist()
    validity = column.validity
    if validity is None:
        return [bytes(data[bounds[i] : bounds[i + 1]]) for i in indices.tolist()]
    present = validity.tolist()
    return [
        bytes(data[bounds[i] : bounds[i + 1]]) if present[i] else None for i in indices.tolist()
    ]


def record_offsets(record: bytes | memoryview) -> list[int]:
    """The offset of each message of a stored record (a compacted record, flag COMPACTED,
    may skip offsets: its payload says which; any other holds consecutive ones)."""
    header = parse_header(record)
    if not header.flags & RecordFlags.COMPACTED:
        return list(range(header.base_offset, header.base_offset + header.count))
    columns = decode_columns(memoryview(record)[header.payload_start :], verify_crc=False)
    offsets: list[int] = message_offsets(columns, header.base_offset).tolist()
    return offsets


def with_append_time(header: RecordHeader, columns: BatchColumns) -> BatchColumns:
    """`columns` with the record's store time as every timestamp when its topic uses
    LogAppendTime (the record's LOG_APPEND_TIME flag), else unchanged."""
    if not header.flags & RecordFlags.LOG_APPEND_TIME:
        return columns
    stamps = np.full(columns.count, header.store_time_ms, dtype=np.int64)
    return dataclasses.replace(columns, timestamps_ms=stamps)


def batches_from_records(
    topic: str,
    queue: int,
    body: bytes,
    sizes: list[int],
    from_offset: int,
    *,
    masks: list[bytes] | None = None,
) -> list[MessageBatch]:
    """`messages_from_records`, column by column: one MessageBatch per fetched record,
    without a Python object per message (batches with nothing to deliver are left out)."""
    out: list[MessageBatch] = []
    view = memoryview(body)
    for n, record in enumerate(iter_records(view, sizes)):
        header = parse_header(record)
        if header.size != len(record):
            raise CorruptRecordError("record size does not match its header")
        columns = with_append_time(header, decode_columns(record[header.payload_start :]))
        base = header.base_offset
        first = first_index_at(columns, base, from_offset)
        indices = np.arange(first, columns.count, dtype=np.int64)
        mask = masks[n] if masks else b""
        if mask:  # a filtered fetch: bit i set when message i matched on the broker
            bits = np.unpackbits(np.frombuffer(mask, dtype=np.uint8), bitorder="little")
            indices = indices[bits[indices].astype(bool)]
        if not len(indices):
            continue
        origin, due = None, 0
        if header.flags & _MOVED:
            props = decode_properties(record[HEADER.size : header.payload_start])
            origin, due = props.origin, props.due
        out.append(MessageBatch(topic, queue, base, columns, indices, origin, due))
    return out


def messages_from_records(
    topic: str,
    queue: int,
    body: bytes,
    sizes: list[int],
    from_offset: int,
    *,
    masks: list[bytes] | None = None,
) -> list[Message]:
    """Decode fetched records into messages at offsets >= `from_offset` (a fetch starts at
    the batch holding the requested offset, so its first messages may be older). `masks`
    (a filtered fetch): per record, the bitmap of its messages that matched (b"": all)."""
    out: list[Message] = []
    for n, record in enumerate(iter_records(body, sizes)):
        mask = masks[n] if masks else b""
        header = parse_header(record)
        if header.size != len(record):
            raise CorruptRecordError("record size does not match its header")
        columns = decode_columns(record[header.payload_start :])
        records = columns_to_records(columns)
        if header.flags & RecordFlags.LOG_APPEND_TIME:
            records = [m._replace(timestamp_ms=header.store_time_ms) for m in records]
        base = header.base_offset
        skip = first_index_at(columns, base, from_offset)
        offsets = message_offsets(columns, base).tolist()
        origin = None
        due = 0
        if header.flags & _MOVED:
            props = decode_properties(record[HEADER.size : header.payload_start])
            origin, due = props.origin, props.due
        for i in range(skip, len(records)):
            if mask and not mask[i >> 3] >> (i & 7) & 1:
                continue  # filtered out on the broker
            m = records[i]
            out.append(
                Message(
                    topic,
                    queue,
                    offsets[i],
                    m.value,
                    m.key,
                    m.tag,
                    m.keys,
                    dict(m.headers),
                    m.timestamp_ms,
                    None if origin is None else (origin[0], origin[1], origin[2] + i),
                    due,
                )
            )
    return out
