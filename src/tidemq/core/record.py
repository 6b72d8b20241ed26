"""Commit-log record: one batch of one (topic, queue), as appended by the store.

Little-endian. A 64-byte header, the system properties, then the batch payload exactly as
the producer encoded it (`tidemq.core.batch`), whose own CRC32C covers the payload::

    0        4          8     9       10      12        16        20      24             32
    +--------+----------+-----+-------+-------+---------+---------+-------+--------------+
    |size    |header_crc|magic|version|flags  |topic_id |queue_id |count  |base_offset   |
    |u32     |u32       |u8   |u8     |u16    |u32      |u32      |u32    |u64           |
    +--------+----------+-----+-------+-------+---------+---------+-------+--------------+
    32               40               48          52      54          56          60      64
    +----------------+----------------+-----------+-------+-----------+-----------+-------+
    |store_time_ms   |producer_id     |base_seq   |epoch  |props_size |payload_crc|reserved
    |i64             |i64 (-1: none)  |i32        |i16    |u16        |u32        |u32    |
    +----------------+----------------+-----------+-------+-----------+-----------+-------+
    64: properties (props_size bytes), then payload (size - 64 - props_size bytes)

* ``size`` counts the whole record, header included. A size of 0 marks the end of the log
  (a zero-filled tail after a crash is the end, never a record).
* ``header_crc`` is CRC32C of bytes 8..64 and the properties. ``payload_crc`` repeats the
  batch's own CRC so that recovery can check both without decoding the batch.
* A record never spans two segments.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Final

import crc32c

from tidemq.core.batch import ENVELOPE, Envelope, parse_envelope
from tidemq.core.errors import BatchTooLarge, CorruptRecordError, InvalidBatch

__all__ = [
    "HEADER",
    "MAGIC",
    "RecordFlags",
    "RecordHeader",
    "encode_header",
    "parse_header",
    "rebase_record",
    "verify_payload",
]

MAGIC: Final = 0xC7
VERSION: Final = 1
HEADER: Final = struct.Struct("<IIBBHIIIQqqihHII")
assert HEADER.size == 64
_CRC_FROM: Final = 8


class RecordFlags:
    """Bits of the record's `flags` field (set by the broker; the store keeps them)."""

    #: A transactional half message, in the internal half topic (never read by consumers).
    TRANSACTION_HALF = 1 << 0
    #: A scheduled (delay/timer) batch, in the internal timer topic.
    DELAYED = 1 << 1
    #: A control record of an internal topic: timer cancel, transaction decision.
    CONTROL = 1 << 2
    #: A batch the timer service delivered to its topic (properties name its origin).
    FROM_TIMER = 1 << 3
    #: A batch a committed transaction published to its topic (properties name its origin).
    FROM_TRANSACTION = 1 << 4
    #: A batch that finishes a pop lease by moving its message on: a consumer retry
    #: scheduled in the timer topic (with DELAYED) or a dead letter. The properties name the
    #: lease (group, topic, queue, offset), so the record is its own "done" mark.
    FROM_POP = 1 << 5
    #: The topic's `message.timestamp.type` is LogAppendTime: every message of the record
    #: takes the record's `store_time_ms` as its timestamp (readers substitute it; the
    #: producer's own timestamps stay in the payload, which is never rewritten).
    LOG_APPEND_TIME = 1 << 6
    #: Written by compaction to a queue's compacted log: a version-2 batch whose messages
    #: may skip offsets (`count` is how many it holds, not how many offsets it spans).
    COMPACTED = 1 << 7


@dataclass(frozen=True, slots=True)
class RecordHeader:
    size: int
    flags: int
    topic_id: int
    queue_id: int
    count: int
    base_offset: int
    store_time_ms: int
    producer_id: int
    base_sequence: int
    producer_epoch: int
    properties_size: int
    payload_crc: int

    @property
    def payload_start(self) -> int:
        return HEADER.size + self.properties_size


def encode_header(
    *,
    payload_size: int,
    properties: bytes,
    flags: int,
    topic_id: int,
    queue_id: int,
    count: int,
    base_offset: int,
    store_time_ms: int,
    producer_id: int,
    base_sequence: int,
    producer_epoch: int,
    payload_crc: int,
) -> bytes:
    """The 64 header bytes for a record whose properties and payload follow."""
    size = HEADER.size + len(properties) + payload_size
    raw = HEADER.pack(
        size,
        0,
        MAGIC,
        VERSION,
        flags,
        topic_id,
        queue_id,
        count,
        base_offset,
        store_time_ms,
        producer_id,
        base_sequence,
        producer_epoch,
        len(properties),
        payload_crc,
        0,
    )
    crc = crc32c.crc32c(properties, crc32c.crc32c(memoryview(raw)[_CRC_FROM:]))
    return raw[:4] + crc.to_bytes(4, "little") + raw[_CRC_FROM:]


def parse_header(buf: bytes | memoryview, offset: int = 0) -> RecordHeader:
    """Parse and check a header whose properties are in `buf` after it.

    Raises CorruptRecordError on a bad magic, impossible size or header CRC mismatch.
    The caller checks the size against what remains of the segment.
    """
    if len(buf) - offset < HEADER.size:
        raise CorruptRecordError("record header truncated")
    fields = HEADER.unpack_from(buf, offset)
    size, hcrc, magic, version = fields[:4]
    props_size = fields[13]
    if magic != MAGIC or version != VERSION:
        raise CorruptRecordError(f"bad record magic/version {magic:#x}/{version}")
    if size < HEADER.size + props_size + ENVELOPE.size:
        raise CorruptRecordError(f"record size {size} is too small")
    props_end = offset + HEADER.size + props_size
    if props_end > len(buf):
        raise CorruptRecordError("record properties truncated")
    view = memoryview(buf)
    actual = crc32c.crc32c(
        view[offset + HEADER.size : props_end],
        crc32c.crc32c(view[offset + _CRC_FROM : offset + HEADER.size]),
    )
    if actual != hcrc:
        raise CorruptRecordError(f"record header CRC mismatch ({hcrc:#010x} != {actual:#010x})")
    # Every field but the CRC, magic, version and reserved word, in header order.
    return RecordHeader(size, *fields[4:15])


def verify_payload(header: RecordHeader, record: bytes | memoryview) -> Envelope:
    """Check the payload of a whole record against its CRC and the header's count."""
    payload = memoryview(record)[header.payload_start : header.size]
    try:
        env = parse_envelope(payload)
    except (InvalidBatch, BatchTooLarge) as exc:
        # A torn payload can hold any envelope, a body size over the format's limit too.
        raise CorruptRecordError(f"record payload: {exc}") from None
    if env.crc != header.payload_crc or env.count != header.count:
        raise CorruptRecordError("record payload does not match its header")
    return env


def rebase_record(record: bytes | memoryview, base_offset: int) -> bytes:
    """A copy of a whole record with another `base_offset` and its header CRC redone.

    A static topic's link serves its physical queue's records under logical offsets
    (`tidemq.core.static_chain`): the broker rewrites the header, never the payload, so
    the payload CRC and every reader stay as they are."""
    header = parse_header(record)
    out = bytearray(record)
    struct.pack_into("<Q", out, 24, base_offset)
    crc = crc32c.crc32c(
        memoryview(out)[HEADER.size : header.payload_start],
        crc32c.crc32c(memoryview(out)[_CRC_FROM : HEADER.size]),
    )
    struct.pack_into("<I", out, 4, crc)
    return bytes(out)
