"""Internal topics of the broker's services, and the reads their recovery needs.

Delayed messages and transactional half messages are records in internal topics, so they
share the commit log's durability and recovery; the services keep only indexes of them in
memory and rebuild those on start (docs/design/timers-and-transactions.md):

* `TIMER_TOPIC` holds scheduled batches and cancel records;
* `HALF_TOPIC` holds transactional half batches;
* `OP_TOPIC` holds transaction decisions (commit or rollback, with the sink marker);
* `POP_TOPIC` holds pop-consumption operations (leases, acks, changes, nacks).

(Consumer groups' committed offsets are in `OFFSETS_TOPIC`, a compact internal topic of
the offset book, `offset_book.py`; producer ids' owners in `PRODUCERS_TOPIC`, another,
`producer_owner_topic.py`.)

Each has one queue, infinite time and size retention, and is trimmed by its service as
entries finish. Clients can neither write nor read them, and they are not in routes.

A restart rebuilds a service from three things: the state it last saved in SQLite (a low
watermark and the finished offsets above it, and a commit-log position P), its internal
queues read from that watermark, and a scan of the commit log from P for the records it
wrote into user topics (delivered and published batches carry their origin in their
properties, so they are their own "done" markers: no separate marker write can be lost
between the two). Pop consumption's retries and dead letters work the same way: the
record that moves a message out of a lease names the lease (flag FROM_POP).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from tidemq.core.batch import MessageRecord, encode_batch
from tidemq.core.properties import (
    HALF_TOPIC,
    INTERNAL_PREFIX,
    OP_TOPIC,
    POP_TOPIC,
    TIMER_TOPIC,
    SystemProperties,
    decode_properties,
)
from tidemq.core.record import HEADER, RecordFlags, RecordHeader, parse_header
from tidemq.store.message_store import MessageStore, ReadStatus

__all__ = [
    "HALF_TOPIC",
    "INTERNAL_PREFIX",
    "OP_TOPIC",
    "POP_TOPIC",
    "TIMER_TOPIC",
    "InternalRecord",
    "MovedRecord",
    "control_payload",
    "ensure_internal_topics",
    "is_internal",
    "read_internal",
    "scan_moved",
]

_ALL: Final = (TIMER_TOPIC, HALF_TOPIC, OP_TOPIC, POP_TOPIC)
#: Reads of an internal queue during recovery take this much per call.
_READ_BYTES: Final = 4 << 20


def is_internal(topic: str) -> bool:
    return topic.startswith(INTERNAL_PREFIX)


def ensure_internal_topics(store: MessageStore) -> None:
    """Create the internal topics on first start (one queue, kept until trimmed)."""
    existing = {t.name for t in store.topics()}
    for name in _ALL:
        if name not in existing:
            store.create_topic(name, 1, retention_ms=-1, retention_bytes=-1)


_CONTROL_PAYLOAD: bytes | None = None


def control_payload() -> bytes:
    """The payload of a control record (cancel, decision): one empty message. Control
    records need a valid batch like any record; what they say is in their properties."""
    global _CONTROL_PAYLOAD  # noqa: PLW0603 - built once, immutable
    if _CONTROL_PAYLOAD is None:
        _CONTROL_PAYLOAD = encode_batch([MessageRecord(b"", None, None, (), (), 0)])
    return _CONTROL_PAYLOAD


@dataclass(frozen=True, slots=True)
class InternalRecord:
    offset: int
    count: int
    store_time_ms: int
    header: RecordHeader
    props: SystemProperties
    record: bytes

    @property
    def payload(self) -> memoryview:
        return memoryview(self.record)[self.header.payload_start :]


def read_internal(
    store: MessageStore, topic: str, from_offset: int, *, max_bytes: int = _READ_BYTES
) -> Iterator[InternalRecord]:
    """Every record of an internal topic's queue 0 from the batch holding `from_offset`
    (or its first kept offset) to its end, read `max_bytes` at a time (at least a record)."""
    low, _ = store.queue_bounds(topic, 0)
    offset = max(from_offset, low)
    while True:
        result = store.read(topic, 0, offset, max_bytes=max_bytes)
        if result.status is not ReadStatus.FOUND:
            return
        for batch in result.batches:
            header = parse_header(batch.record)
            props = decode_properties(memoryview(batch.record)[HEADER.size : header.payload_start])
            yield InternalRecord(
                batch.base_offset, batch.count, batch.store_time_ms, header, props, batch.record
            )
        offset = result.next_offset


@dataclass(frozen=True, slots=True)
class MovedRecord:
    """A batch a service wrote into a user topic: where from, and how many messages."""

    flags: int
    props: SystemProperties
    count: int


def scan_moved(store: MessageStore, from_position: int) -> Iterator[MovedRecord]:
    """The delivered (timer), published (transaction) and pop-finishing (retry, dead
    letter) records in the commit log from `from_position` on."""
    moved = RecordFlags.FROM_TIMER | RecordFlags.FROM_TRANSACTION | RecordFlags.FROM_POP
    log = store.log
    # Headers only: the store's recovery has checked every record's payload already.
    for position, header in log.scan_headers(from_position):
        if not header.flags & moved or not header.properties_size:
            continue
        head = log.read(position, HEADER.size + header.properties_size)
        props = decode_properties(memoryview(head)[HEADER.size :])
        yield MovedRecord(header.flags, props, header.count)
