"""Replication requests (codes 130-139, docs/design/replication.md). Appended to
`commands.REQUESTS`; fields only ever added at the end.

REPLICA_FETCH: a follower asks its group's leader for the records of the leader's commit
log from `position` on. The answer's body is those records, whole, back to back, exactly
as they are in the leader's log (`store/replica_log.py`); the follower appends them at
the same positions. The request doubles as the follower's report: `position` (its log's
end) and `durable` (its flushed position) tell the leader how far it is, which is what
the leader's committed position and its in-sync set are computed from.

When `position` is below the leader's log start (retention deleted what the follower
needs next), the answer carries `start_over` instead of records: the leader's log start,
each queue's first offset at or after it, and its compact queues' compacted log files,
which the follower fetches with REPLICA_FILE (body: bytes of one file from `offset`)
before it starts its store over at that position (`store/start_over.py`).
"""

from __future__ import annotations

from typing import Final

import msgspec

from tidemq.protocol.codes import RequestCode

__all__ = [
    "REPLICA_REQUESTS",
    "ElectLeaderRequest",
    "ElectLeaderResponse",
    "EpochStart",
    "ReplicaCompactedFile",
    "ReplicaFetchRequest",
    "ReplicaFetchResponse",
    "ReplicaFileRequest",
    "ReplicaFileResponse",
    "ReplicaProducerWindow",
    "ReplicaQueueStart",
    "ReplicaServiceState",
    "ReplicaStartOver",
    "ReplicaTopic",
]


class _Msg(msgspec.Struct, kw_only=True, omit_defaults=True):
    pass


class ReplicaFetchRequest(_Msg):
    group: str
    #: The follower's member id (its broker name).
    member: str
    #: The leader epoch the follower follows (from etcd); another epoch is refused.
    epoch: int
    #: The follower's log end: the first byte it wants.
    position: int
    #: The follower's flushed position: everything before it survives a power loss there.
    durable: int
    #: The newest epoch in the follower's epoch history (-1: none), so the leader can say
    #: where the two logs stop agreeing.
    last_epoch: int = -1
    max_bytes: int = 1 << 20
    #: How long the leader may hold the request while it has nothing new.
    max_wait_ms: int = 0
    #: The leader's topics version the follower has mirrored (-1: none): when the
    #: leader's differs, the answer carries its whole topic table.
    topics_version: int = -1
    #: The version of the leader's saved service state the follower holds (-1: none).
    state_version: int = -1


class EpochStart(_Msg, array_like=True):
    epoch: int
    start_position: int


class ReplicaTopic(_Msg, array_like=True):
    """A topic as the leader's store has it (`store.metadata.TopicInfo`)."""

    id: int
    name: str
    queues: int
    message_type: str
    cleanup_policy: str
    retention_ms: int | None
    retention_bytes: int | None
    config: dict[str, str]
    created_ms: int


class ReplicaServiceState(_Msg):
    """What the leader's broker saved of its services (timers, transactions, pop), with
    the trims of their internal queues it made then: a follower that becomes leader
    resumes the services from it instead of from its whole log."""

    version: int
    #: The leader's flushed position when it saved: the state holds for the log up to
    #: here (a follower applies it once its log and the committed position reach it).
    position: int
    #: Where the services rescan the log from on a start (kept from retention).
    scan_position: int
    states: dict[str, bytes]
    #: [topic, queue, min offset] of the internal queues trimmed.
    trims: list[tuple[str, int, int]] = msgspec.field(default_factory=list)


class ReplicaQueueStart(_Msg, array_like=True):
    """Where a queue continues at the leader's log start: the offset of its first record
    at or after it (its next offset when it has none there)."""

    topic_id: int
    queue_id: int
    next_offset: int


class ReplicaCompactedFile(_Msg, array_like=True):
    """One compact queue's compacted log as the leader has it: a whole generation, one
    self-contained file (records, entries, key index, footer; `format.compacted`)."""

    topic_id: int
    queue_id: int
    generation: int
    #: The queue's offsets it serves, [start, end).
    start: int
    end: int
    #: The file's length in bytes.
    size: int


class ReplicaProducerWindow(_Msg, array_like=True):
    """A producer's last batches on a queue that end before the leader's log start
    (`ProducerStates.rows_before`): the follower keeps them, so a retry of one is
    answered from them and not stored again."""

    topic_id: int
    queue_id: int
    producer_id: int
    epoch: int
    #: [base sequence, count, base offset, end position] per batch, oldest first.
    window: list[list[int]]


class ReplicaStartOver(_Msg):
    """The follower's log ends below the leader's log start: start over there."""

    #: The leader's log start: the follower's log starts here, empty.
    position: int
    queues: list[ReplicaQueueStart] = msgspec.field(default_factory=list)
    compacted: list[ReplicaCompactedFile] = msgspec.field(default_factory=list)
    producers: list[ReplicaProducerWindow] = msgspec.field(default_factory=list)


class ReplicaFetchResponse(_Msg):
    epoch: int
    #: Where the body's records start (the request's position), and how many there are.
    position: int
    records: int = 0
    #: The leader's log end and start when it answered.
    leader_end: int = 0
    log_start: int = 0
    #: The group's committed position: the records before it are on every in-sync member.
    committed: int = 0
    #: >= 0: the follower's log and the leader's differ from this position on; the
    #: follower cuts its log there and asks again. The body is then empty.
    diverged_at: int = -1
    #: The leader's epoch history (small: one entry per election).
    epochs: list[EpochStart] = msgspec.field(default_factory=list)
    #: The leader's topics version, and (when the request's differs) its whole topic
    #: table, the highest topic id it ever gave and the last producer id it issued.
    topics_version: int = 0
    topics: list[ReplicaTopic] | None = None
    max_topic_id: int = 0
    last_producer_id: int = 0
    #: The leader's newest saved service state, when the request's version differs.
    state: ReplicaServiceState | None = None
    #: The follower asked below the leader's log start: it starts over (body empty).
    #: Such an answer always carries the topic table.
    start_over: ReplicaStartOver | None = None


class ReplicaFileRequest(_Msg):
    """Bytes of one of the leader's compacted log files (`ReplicaCompactedFile`), from
    `offset` on, at most `max_bytes`; the answer's body."""

    group: str
    member: str
    epoch: int
    topic_id: int
    queue_id: int
    generation: int
    offset: int
    max_bytes: int = 1 << 20


class ReplicaFileResponse(_Msg):
    #: The file's whole length (the follower asks until it has all of it).
    size: int
    #: Where the body starts in the file (the request's offset).
    offset: int


class ElectLeaderRequest(_Msg):
    """To a replica group's leader (its client listener): hand leadership over to
    `member`, an in-sync follower, without losing an acknowledged message."""

    group: str
    member: str
    #: Longest the leader waits for the member to hold its whole log.
    timeout_ms: int = 10_000


class ElectLeaderResponse(_Msg):
    #: The leader that handed over, and its epoch (the next leader's is higher).
    previous: str
    epoch: int
    #: How long new writes were refused while the member caught up (ms).
    paused_ms: float


REPLICA_REQUESTS: Final = {
    RequestCode.REPLICA_FETCH: (ReplicaFetchRequest, ReplicaFetchResponse),
    RequestCode.ELECT_LEADER: (ElectLeaderRequest, ElectLeaderResponse),
    RequestCode.REPLICA_FILE: (ReplicaFileRequest, ReplicaFileResponse),
}
