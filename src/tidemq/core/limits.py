"""Named bounds. Every size, count and wait in tidemq has one, with the reason beside it."""

from __future__ import annotations

__all__ = [
    "AUTH_FAILURE_WINDOW_MS",
    "AUTH_MAX_FAILURES_PER_ADDRESS",
    "AUTH_MAX_TRACKED_ADDRESSES",
    "MAX_ACL_ENTRIES",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_MESSAGES",
    "MAX_GROUP_NAME_BYTES",
    "MAX_HEADERS_PER_MESSAGE",
    "MAX_HEADER_KEY_BYTES",
    "MAX_HEADER_VALUE_BYTES",
    "MAX_IN_FLIGHT_PER_QUEUE",
    "MAX_KEYS_PER_MESSAGE",
    "MAX_KEY_QUERY_BYTES",
    "MAX_KEY_QUERY_CANDIDATES",
    "MAX_KEY_QUERY_MESSAGES",
    "MAX_LINGER_MS",
    "MAX_LIST_TOPICS",
    "MAX_OFFSET",
    "MAX_PROPERTIES_BYTES",
    "MAX_QUEUES_PER_TOPIC",
    "MAX_QUEUE_ID",
    "MAX_RECEIVE_MESSAGES",
    "MAX_ROUTE_TOPICS",
    "MAX_SECURITY_SNAPSHOT_BYTES",
    "MAX_TAG_BYTES",
    "MAX_TIMEOUT_MS",
    "MAX_TOPICS_PER_CREATE",
    "MAX_TOPIC_NAME_BYTES",
    "MAX_USERS",
    "MIN_SEGMENT_BYTES",
    "NET_FRAME_READ_TIMEOUT_MS",
    "NET_IDLE_TIMEOUT_MS",
    "NET_LOGIN_TIMEOUT_MS",
    "NET_LOG_INTERVAL_MS",
    "NET_MAX_CONNECTIONS_PER_ADDRESS",
    "NET_MAX_INBOUND_BYTES",
    "NET_MAX_LINGERING_REFUSALS",
    "NET_MAX_RESPONSE_BYTES",
    "NET_MAX_RESPONSE_BYTES_PER_ADDRESS",
    "NET_MAX_RESPONSE_BYTES_PER_CONNECTION",
    "NET_MIN_RESPONSE_GRANT_BYTES",
    "NET_REFUSAL_LINGER_MS",
    "NET_REQUESTS_PER_TURN",
    "NET_WRITE_BUFFER_HIGH_BYTES",
    "NET_WRITE_STALL_TIMEOUT_MS",
    "REGISTERED_TOPIC_NAME_PATTERN",
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
#: Messages one query by key returns (RocketMQ's queryMessage returns at most 64 by
#: default): a key shared by millions of messages is paged by time range, not by limit.
MAX_KEY_QUERY_MESSAGES = 1_000
#: Key-index entries one broker examines per query (each costs a read of its record, and
#: removed or colliding ones match nothing): bounds the work of a query at ~ a second.
MAX_KEY_QUERY_CANDIDATES = 10_000
#: Record bytes in one answer to a query by key (whole records, as a fetch answers): one
#: default-sized fetch answer.
MAX_KEY_QUERY_BYTES = 16 << 20
#: A tag is short by nature; RocketMQ caps it well below this.
MAX_TAG_BYTES = 255
#: System properties carried by a record (delay time, transaction id, origin topic, ...).
MAX_PROPERTIES_BYTES = 16 << 10
#: Topic and group names that users choose (RocketMQ's topic limit): printable, safe as a
#: directory name and in logs. core/names.py states the whole rule.
MAX_TOPIC_NAME_BYTES = 127
#: Group names are shorter, so that the group's retry topic `%RETRY%<group>` is a valid
#: topic name (RocketMQ's rule for the same reason).
MAX_GROUP_NAME_BYTES = 120
#: Any topic name the store accepts: a user name (not starting with "." or "-", so never
#: "." or ".." as a directory) or one of the broker's internal names, which alone may
#: contain "%" (core/names.py). Text, for the layers that match it themselves; "\Z", not
#: "$", so that a trailing newline never matches.
TOPIC_NAME_PATTERN = (
    r"^(?:[A-Za-z0-9_][A-Za-z0-9_.-]{0,126}"
    r"|%(?:RETRY|DLQ)%[A-Za-z0-9_.-]{1,120}"
    r"|%SYS%[A-Z][A-Z_]{0,31})\Z"
)
#: Any topic name a broker may hold and register with the name servers: the looser
#: character set of the names made before the rule of core/names.py included, so that an
#: upgraded broker never has a registration refused for a topic it already stores.
REGISTERED_TOPIC_NAME_PATTERN = r"^[A-Za-z0-9%_.-]{1,127}\Z"
#: Messages one receive (pop) may ask for: RocketMQ's bound on a pop batch.
MAX_RECEIVE_MESSAGES = 1024
#: Queue ids are i32 on the wire and in the index; offsets are i64.
MAX_QUEUE_ID = (1 << 31) - 1
MAX_OFFSET = (1 << 63) - 1
#: Longest wait a client call takes in milliseconds (poll timeouts): about 24.8 days, the
#: largest i32. Anything longer is a unit mistake, not a wait.
MAX_TIMEOUT_MS = (1 << 31) - 1
#: Queues per topic: bounded so that a typo cannot create millions of index directories.
MAX_QUEUES_PER_TOPIC = 4096
#: Topics one batch create request carries (Admin.create_topics splits larger batches):
#: bounds the request's frame and the time the broker holds its metadata transaction.
MAX_TOPICS_PER_CREATE = 10_000
#: Topics one route query names (a client asks for more in several).
MAX_ROUTE_TOPICS = 10_000
#: Topics in one answer to a topic list (the client pages through more): a page of
#: summaries stays far below the frame limit whatever the topic count.
MAX_LIST_TOPICS = 10_000
#: Batches one producer may have in flight per queue. An idempotent producer keeps at most
#: as many as the broker remembers per (producer, queue) (`store.idempotence_window`, sent
#: in the InitProducer answer), so that a retry is always recognised.
MAX_IN_FLIGHT_PER_QUEUE = 32
#: A producer's linger: batching is worth a few milliseconds of latency, never minutes
#: (a linger in seconds is almost always a unit mistake: `linger_ms=5.0` meant).
MAX_LINGER_MS = 60_000
#: Smallest commit-log segment; tests use small segments, production 1 GiB.
MIN_SEGMENT_BYTES = 4096

# ------------------------------------------------------------------ connections (issue 16)
# Defaults of the broker's connection limits (BrokerConfig fields of the same meaning;
# docs/design/protocol.md, "Connection limits", has the table). Each bounds what one
# client can make the broker hold or do.

#: Connections from one IP address: a quarter of the default total (1024), so that one
#: host (a slowloris, a connection leak) cannot take every slot; a NAT gateway in front of
#: many real clients may need more.
NET_MAX_CONNECTIONS_PER_ADDRESS = 256
#: A frame whose first byte has arrived must be complete within this (the security model
#: asks for at most 30 s): a peer that stops mid-frame pins at most its bytes this long.
#: A 16 MiB frame at 10 Mbit/s takes 13 s.
NET_FRAME_READ_TIMEOUT_MS = 30_000
#: A connection with nothing in flight and no byte received for this long is closed
#: (Kafka's connections.max.idle.ms). Clients reconnect on their next request; a parked
#: long-poll FETCH is in flight, so it never counts as idle.
NET_IDLE_TIMEOUT_MS = 600_000
#: With authentication required, a connection must have logged in this long after it
#: opened (docs/design/security.md: 10 s), else it is closed: an unauthenticated
#: connection holds a slot and little else, but no longer than this.
NET_LOGIN_TIMEOUT_MS = 10_000
#: Failed logins from one IP address within AUTH_FAILURE_WINDOW_MS after which further
#: logins from it are refused at once until the oldest failure leaves the window (with
#: the 1 s delay of each failure, a guesser gets this many tries a minute, not 60 per
#: connection in parallel).
AUTH_MAX_FAILURES_PER_ADDRESS = 10
AUTH_FAILURE_WINDOW_MS = 60_000
#: Addresses whose failures are remembered at once (a flood from many addresses forgets
#: the oldest rather than growing without bound).
AUTH_MAX_TRACKED_ADDRESSES = 10_000
#: Users and ACL entries of a cluster (ADR 15): the whole table travels from the name
#: servers to every broker that is behind, as one frame, and is replaced in one SQLite
#: transaction. A user is about 120 bytes on the wire, an entry about 100: 10,000 users
#: and 50,000 entries are about 6 MiB, under the snapshot's own limit below and far
#: under the 16 MiB name-server frame. Changes past either count are refused.
MAX_USERS = 10_000
MAX_ACL_ENTRIES = 50_000
#: The encoded snapshot (users + ACL entries) at most: checked by the writer before a
#: change, by the name server before it keeps a pushed one, by a broker before it applies
#: a pulled one.
MAX_SECURITY_SNAPSHOT_BYTES = 8 << 20
#: A connection whose write buffer is over its high-water mark and has not shrunk by a
#: byte for this long is closed: its client does not read its answers.
NET_WRITE_STALL_TIMEOUT_MS = 60_000
#: The transport's write buffer: above this the connection stops reading requests (and
#: FETCH answers stay charged to the budget) until it drains below a quarter of it.
NET_WRITE_BUFFER_HIGH_BYTES = 1 << 20
#: Bytes of answers being built or waiting in write buffers, all connections together and
#: per connection: a FETCH gets at most what is free, and waits while less than
#: NET_MIN_RESPONSE_GRANT_BYTES is. Two default-sized (16 MiB) fetch answers per
#: connection; 512 MiB in total keeps a flood of readers-that-never-read well under 1 GiB.
NET_MAX_RESPONSE_BYTES = 512 << 20
NET_MAX_RESPONSE_BYTES_PER_CONNECTION = 32 << 20
#: The connections of one IP address together: a quarter of the total, so that one host
#: with many connections that never read cannot make every other consumer's FETCH wait.
NET_MAX_RESPONSE_BYTES_PER_ADDRESS = 128 << 20
NET_MIN_RESPONSE_GRANT_BYTES = 64 << 10
#: Bytes of requests received and not yet answered (partial frames, frames waiting for a
#: slot, frames in flight), all connections together: above this, connections holding
#: such bytes stop reading until it falls. Partial frames of 500 connections held 8 GB.
NET_MAX_INBOUND_BYTES = 512 << 20
#: Requests one connection starts per event-loop turn: a pipelining client takes turns
#: with the others instead of filling the loop (200,000 pipelined requests raised another
#: client's p99 from 15 ms to 450 ms).
NET_REQUESTS_PER_TURN = 4
#: A refused connection gets an error frame, then is kept (reading and discarding) this
#: long so that the client reads the error before the close, at most this many at once.
NET_REFUSAL_LINGER_MS = 1_000
NET_MAX_LINGERING_REFUSALS = 256
#: Repeated connection events (refusals, timeouts, protocol errors, failed requests) are
#: logged once per kind per interval, with the number left out.
NET_LOG_INTERVAL_MS = 10_000
