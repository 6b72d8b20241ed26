"""Named bounds. Every size, count and wait in tidemq has one, with the reason beside it."""

from __future__ import annotations

__all__ = [
    "MAX_BATCH_BYTES",
    "MAX_BATCH_MESSAGES",
    "MAX_HEADERS_PER_MESSAGE",
    "MAX_HEADER_KEY_BYTES",
    "MAX_HEADER_VALUE_BYTES",
    "MAX_IN_FLIGHT_PER_QUEUE",
    "MAX_KEYS_PER_MESSAGE",
    "MAX_PROPERTIES_BYTES",
    "MAX_QUEUES_PER_TOPIC",
    "MAX_TAG_BYTES",
    "MAX_TOPIC_NAME_BYTES",
    "MIN_SEGMENT_BYTES",
    "TOPIC_NAME_PATTERN",
]

#: Largest encoded batch (one commit-log record payload). The broker's `max_message_bytes`
#: (default 4 MiB) is checked before this; this is the hard ceiling of the format, which
#: stores sizes as u32 and must fit comfortably in one read.
MAX_BATCH_BYTES = 64 << 20
#: Messages in one batch. RocketMQ's and the security model's bound on per-batch work;
#: also keeps the per-message timestamp delta array small.
MAX_BATCH_MESSAGES = 65_536
#: Headers (user properties) per message; the security model says at most 256.
MAX_HEADERS_PER_MESSAGE = 256
#: Header key and value sizes (security model: key <= 256 B, value <= 16 KiB).
MAX_HEADER_KEY_BYTES = 256
MAX_HEADER_VALUE_BYTES = 16 << 10
#: RocketMQ `keys` (business ids used by query-by-key) per message.
MAX_KEYS_PER_MESSAGE = 64
#: A tag is short by nature; RocketMQ caps it well below this.
MAX_TAG_BYTES = 255
#: System properties carried by a record (delay time, transaction id, origin topic, ...).
MAX_PROPERTIES_BYTES = 16 << 10
#: Topic names: printable, safe as a directory name, RocketMQ's character set.
MAX_TOPIC_NAME_BYTES = 127
TOPIC_NAME_PATTERN = r"^[A-Za-z0-9%_.-]{1,127}$"
#: Queues per topic: bounded so that a typo cannot create millions of index directories.
MAX_QUEUES_PER_TOPIC = 4096
#: Batches one producer may have in flight per queue. An idempotent producer keeps at most
#: as many as the broker remembers per (producer, queue) (`store.idempotence_window`, sent
#: in the InitProducer answer), so that a retry is always recognised.
MAX_IN_FLIGHT_PER_QUEUE = 32
#: Smallest commit-log segment; tests use small segments, production 1 GiB.
MIN_SEGMENT_BYTES = 4096
