"""What the client's admin and status calls return: plain, frozen values named for users.

The public API (`tidemq`, `tidemq.aio`) never returns a `tidemq.protocol.commands`
struct: a change of the wire format must not change what users see. Each type here is
built from its wire message in one place, the `<type>_from_wire` function next to it
(functions, not classmethods, so that no public signature names a wire type); the client
builds them with nothing else.

Offsets are queue offsets (the n-th message of a queue); times ending in `_ms` are epoch
milliseconds unless the name says otherwise (`_ms_ago`, `uptime_ms`, `*_delay_ms`,
`*_interval_ms`: durations). Sequences are tuples, so a value is immutable throughout
(except `TopicInfo.config` and the `BrokerStatus` counters, read-only mappings by
contract, which makes those types unhashable).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from tidemq.core.static_chain import QueueChain
from tidemq.protocol import commands as wire
from tidemq.protocol import tier_messages

__all__ = [
    "BrokerInfo",
    "BrokerStatus",
    "CancelResult",
    "CommittedOffset",
    "DiscardedTransaction",
    "GroupDescription",
    "LeaderHandover",
    "MemberInfo",
    "NewTopic",
    "OpenTransaction",
    "PopStatus",
    "QueueInfo",
    "QueueLag",
    "ReplicaFollower",
    "Replication",
    "ResumeResult",
    "SuspendedMessage",
    "TierFile",
    "TierQueueStatus",
    "TierStatus",
    "TimerStatus",
    "TimerTopicStatus",
    "TopicInfo",
    "TransactionStatus",
    "UserInfo",
    "broker_info_from_wire",
    "broker_status_from_wire",
    "cancel_result_from_wire",
    "committed_offset_from_wire",
    "discarded_transaction_from_wire",
    "group_description_from_wire",
    "member_info_from_wire",
    "open_transaction_from_wire",
    "pop_status_from_wire",
    "queue_info_from_wire",
    "queue_lag_from_wire",
    "resume_result_from_wire",
    "suspended_message_from_wire",
    "tier_status_from_wire",
    "timer_status_from_wire",
    "timer_topic_status_from_wire",
    "topic_info_from_wire",
    "transaction_status_from_wire",
    "user_info_from_wire",
]


# ------------------------------------------------------------------ topics


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueInfo:
    """One queue of a topic: the offsets it retains and the broker serving it."""

    queue: int
    #: The first offset the queue still retains.
    min_offset: int
    #: The offset the next message will get (the queue's end).
    max_offset: int
    #: The serving broker's address, "host:port".
    broker: str
    #: Compact topics: offsets below this have been compacted (they may have holes);
    #: 0 when nothing has been.
    compacted_end: int = 0


def queue_info_from_wire(msg: wire.QueueInfo) -> QueueInfo:
    return QueueInfo(
        queue=msg.queue,
        min_offset=msg.min_offset,
        max_offset=msg.max_offset,
        broker=msg.broker,
        compacted_end=msg.compacted_end,
    )


@dataclass(frozen=True, slots=True)
class NewTopic:
    """A topic to create with `Admin.create_topics` (many at once)."""

    name: str
    queues: int = 8
    #: "MIXED", "NORMAL", "FIFO", "DELAY" or "TRANSACTION".
    message_type: str = "MIXED"
    #: Topic configs by their Kafka names (cleanup.policy, retention.ms, ...).
    config: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class TopicInfo:
    """A topic: its queue count, message type, configs, and (when described) its queues."""

    name: str
    #: How many queues the topic has.
    queues: int
    #: "MIXED", "NORMAL", "FIFO", "DELAY" or "TRANSACTION".
    message_type: str
    #: The topic's configs by their Kafka names: `cleanup.policy` always,
    #: `retention.ms` and `retention.bytes` when set, and any others set explicitly.
    config: Mapping[str, str]
    #: Per queue, in queue order; empty in `list_topics`.
    queue_info: tuple[QueueInfo, ...] = ()
    #: A static topic (docs/guide/static-topics.md): each queue's chain of links, in
    #: queue order, when described; empty for an ordinary topic.
    chains: tuple[QueueChain, ...] = ()

    @property
    def static(self) -> bool:
        return bool(self.chains)


def topic_info_from_wire(msg: wire.TopicInfoMsg) -> TopicInfo:
    return TopicInfo(
        name=msg.name,
        queues=msg.queues,
        message_type=msg.message_type,
        config=dict(msg.config),
        queue_info=tuple(queue_info_from_wire(q) for q in msg.queue_info),
        chains=tuple(msg.chains),
    )


# ------------------------------------------------------------------ groups


@dataclass(frozen=True, slots=True, kw_only=True)
class MemberInfo:
    """A member of a consumer group and the queues assigned to it."""

    member_id: str
    client_id: str
    #: (topic, queue) pairs, in the order the coordinator assigned them.
    assignment: tuple[tuple[str, int], ...]


def member_info_from_wire(msg: wire.GroupMember) -> MemberInfo:
    return MemberInfo(
        member_id=msg.member_id,
        client_id=msg.client_id,
        assignment=tuple((topic, queue) for topic, queue in msg.assignment),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class QueueLag:
    """A group's progress on one queue."""

    topic: str
    queue: int
    #: The group's committed offset (the next message to read); -1: nothing committed.
    committed: int
    #: The queue's end offset.
    max_offset: int
    #: Messages not consumed yet: `max_offset - max(committed, 0)`.
    lag: int


def queue_lag_from_wire(msg: wire.GroupOffset) -> QueueLag:
    return QueueLag(
        topic=msg.topic,
        queue=msg.queue,
        committed=msg.committed,
        max_offset=msg.max_offset,
        lag=msg.lag,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupDescription:
    """A consumer group: its members, generation, and per queue its committed offset and
    lag (sorted by topic and queue)."""

    group: str
    #: Bumped at every rebalance; commits from an older generation are refused.
    generation: int
    members: tuple[MemberInfo, ...]
    offsets: tuple[QueueLag, ...]


def group_description_from_wire(msg: wire.DescribeGroupResponse) -> GroupDescription:
    return GroupDescription(
        group=msg.group,
        generation=msg.generation,
        members=tuple(member_info_from_wire(m) for m in msg.members),
        offsets=tuple(queue_lag_from_wire(o) for o in msg.offsets),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class CommittedOffset:
    """A group's committed offset on one queue (as `reset_offsets` plans or applies it)."""

    topic: str
    queue: int
    #: The next offset the group reads from this queue.
    offset: int


def committed_offset_from_wire(msg: wire.QueueOffset) -> CommittedOffset:
    return CommittedOffset(topic=msg.topic, queue=msg.queue, offset=msg.offset)


# ------------------------------------------------------------------ cluster


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerInfo:
    """A live broker as the name server knows it."""

    name: str
    #: "host:port".
    address: str
    #: How long ago the name server last heard from it.
    last_heartbeat_ms_ago: int
    #: How many topics it serves.
    topics: int
    #: The version of its users and ACL entries (ADR 15): brokers showing the same
    #: version and digest have the same tables. 0: never changed cluster-wide.
    security_counter: int = 0
    #: The tables' digest, 16 hex digits.
    security_digest: str = ""
    #: The security writer's term if this broker holds the role (0: it does not, or
    #: the name server is too new to grant it; docs/adr/0020).
    writer_term: int = 0


def broker_info_from_wire(msg: wire.BrokerStatus) -> BrokerInfo:
    return BrokerInfo(
        name=msg.name,
        address=msg.address,
        last_heartbeat_ms_ago=msg.last_heartbeat_ms_ago,
        topics=msg.topics,
        security_counter=msg.security_counter,
        security_digest=f"{msg.security_digest:016x}",
        writer_term=msg.writer_term,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class LeaderHandover:
    """A replica group's leadership moved by hand (`Admin.elect_leader`)."""

    group: str
    #: The member that led, and the one that leads now, serving at `address`.
    previous: str
    member: str
    address: str
    #: How long the previous leader refused new writes while `member` caught up, and
    #: the whole handover until the name server routed the group to `member` (ms).
    paused_ms: float
    took_ms: float


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaFollower:
    """A replica group follower as its leader sees it."""

    member: str
    #: Its log end and flushed position at its last fetch (0: not heard from this term).
    position: int
    durable: int
    in_sync: bool


@dataclass(frozen=True, slots=True, kw_only=True)
class Replication:
    """A replica group leader's report (docs/guide/replication.md)."""

    group: str
    #: The member leading, under which epoch.
    member: str
    epoch: int
    #: The group's committed position (readers see up to here) and the leader's log end.
    committed: int
    log_end: int
    min_insync_replicas: int
    in_sync: tuple[str, ...]
    followers: tuple[ReplicaFollower, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class BrokerStatus:
    """One broker's own report: version, flush mode, log positions, connections."""

    broker_name: str
    version: str
    #: "sync" or "async".
    flush_mode: str
    #: How many topics it serves.
    topics: int
    #: Bytes: the end of its commit log, and how far of it is flushed to disk.
    log_end_position: int
    log_flushed_position: int
    #: Open client connections.
    connections: int
    #: Time since the broker started.
    uptime_ms: int
    #: The connection limits, by config key (`broker.<key>`).
    limits: Mapping[str, int]
    #: Their use and event counters since start: connections, inbound_bytes,
    #: response_bytes, lingering_refusals; refused, read-timeout, idle, write-stall,
    #: protocol, internal.
    usage: Mapping[str, int]
    #: Traffic since start over all topics: messages and bytes stored by produce
    #: requests, and read by fetches.
    messages_in: int = 0
    messages_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    #: The file system of the broker's data directory: its size and free bytes.
    disk_total_bytes: int = 0
    disk_free_bytes: int = 0
    #: A replica group's leader: the group's state (None: not a group).
    replication: Replication | None = None


def broker_status_from_wire(msg: wire.StatusResponse) -> BrokerStatus:
    return BrokerStatus(
        broker_name=msg.broker_name,
        version=msg.version,
        flush_mode=msg.flush_mode,
        topics=msg.topics,
        log_end_position=msg.log_end_position,
        log_flushed_position=msg.log_flushed_position,
        connections=msg.connections,
        uptime_ms=msg.uptime_ms,
        limits=dict(msg.limits),
        usage=dict(msg.usage),
        messages_in=msg.messages_in,
        messages_out=msg.messages_out,
        bytes_in=msg.bytes_in,
        bytes_out=msg.bytes_out,
        disk_total_bytes=msg.disk_total_bytes,
        disk_free_bytes=msg.disk_free_bytes,
        replication=None if msg.replication is None else _replication(msg.replication),
    )


def _replication(r: wire.ReplicationStatus) -> Replication:
    return Replication(
        group=r.group,
        member=r.member,
        epoch=r.epoch,
        committed=r.committed,
        log_end=r.log_end,
        min_insync_replicas=r.min_insync_replicas,
        in_sync=tuple(r.in_sync),
        followers=tuple(
            ReplicaFollower(
                member=f.member, position=f.position, durable=f.durable, in_sync=f.in_sync
            )
            for f in r.followers
        ),
    )


# ------------------------------------------------------------------ delayed messages


@dataclass(frozen=True, slots=True, kw_only=True)
class CancelResult:
    """A cancelled delayed send."""

    topic: str
    #: When it was due (epoch ms).
    deliver_at_ms: int
    #: Messages cancelled: a delayed batch is scheduled, and cancelled, as one unit.
    count: int


def cancel_result_from_wire(msg: wire.CancelDelayedResponse) -> CancelResult:
    return CancelResult(topic=msg.topic, deliver_at_ms=msg.deliver_at_ms, count=msg.count)


@dataclass(frozen=True, slots=True, kw_only=True)
class TimerTopicStatus:
    """Delayed messages pending for one topic."""

    topic: str
    pending_batches: int
    pending_messages: int
    #: When the next one is due (epoch ms).
    next_due_ms: int


def timer_topic_status_from_wire(msg: wire.TimerTopicStatus) -> TimerTopicStatus:
    return TimerTopicStatus(
        topic=msg.topic,
        pending_batches=msg.pending_batches,
        pending_messages=msg.pending_messages,
        next_due_ms=msg.next_due_ms,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class TimerStatus:
    """Delayed messages over all brokers: pending per topic, and counters since start."""

    #: Per topic with pending messages, sorted by topic.
    topics: tuple[TimerTopicStatus, ...]
    #: The timers' tick: a message is delivered up to this late.
    precision_ms: int
    #: The longest delay the brokers accept.
    max_delay_ms: int
    delivered_batches: int
    cancelled_batches: int


def timer_status_from_wire(msg: wire.TimerStatusResponse) -> TimerStatus:
    return TimerStatus(
        topics=tuple(timer_topic_status_from_wire(t) for t in msg.topics),
        precision_ms=msg.precision_ms,
        max_delay_ms=msg.max_delay_ms,
        delivered_batches=msg.delivered_batches,
        cancelled_batches=msg.cancelled_batches,
    )


# ------------------------------------------------------------------ tiered storage


@dataclass(frozen=True, slots=True, kw_only=True)
class TierQueueStatus:
    """One offloaded queue: offsets [log_start, remote_end) are in the object store,
    [local_min, next_offset) on the broker's disk."""

    topic: str
    queue: int
    log_start: int
    remote_end: int
    local_min: int
    next_offset: int
    files: int
    remote_bytes: int
    #: Bytes on disk not yet offloaded.
    pending_bytes: int
    last_upload_ms: int
    #: The last failure ("" while uploads succeed), and how long until the next try.
    error: str
    retry_in_ms: int
    #: Offsets [lost_from, lost_to) that were offloaded and are gone from the store.
    lost_from: int
    lost_to: int


@dataclass(frozen=True, slots=True, kw_only=True)
class TierStatus:
    """Tiered storage on one broker: its counters since start and its offloaded queues."""

    broker: str
    #: False: the broker has no `tiered.url`.
    enabled: bool
    url: str
    uploaded_files: int
    uploaded_bytes: int
    deleted_files: int
    orphans_deleted: int
    errors: int
    remote_reads: int
    #: Bytes of remote row groups held in the broker's read cache.
    cache_bytes: int
    queues: tuple[TierQueueStatus, ...]


def tier_status_from_wire(msg: tier_messages.TierStatusResponse) -> TierStatus:
    fields = {f: getattr(msg, f) for f in msg.__struct_fields__ if f != "queues"}
    queues = tuple(
        TierQueueStatus(**{f: getattr(q, f) for f in q.__struct_fields__}) for q in msg.queues
    )
    return TierStatus(**fields, queues=queues)


@dataclass(frozen=True, slots=True, kw_only=True)
class TierFile:
    """A remote file of a queue: Parquet, offsets [start, end), at `url`."""

    queue: int
    url: str
    start: int
    end: int
    messages: int
    size: int
    min_store_time_ms: int
    max_store_time_ms: int


# ------------------------------------------------------------------ transactions


@dataclass(frozen=True, slots=True, kw_only=True)
class OpenTransaction:
    """A transaction neither committed nor rolled back yet."""

    txn_id: str
    #: The producer group whose checker the brokers ask about it.
    group: str
    #: Messages staged in it.
    messages: int
    #: When its first message was sent (epoch ms).
    first_send_ms: int
    #: Check-backs asked so far.
    checks: int


def open_transaction_from_wire(msg: wire.OpenTxnInfo) -> OpenTransaction:
    return OpenTransaction(
        txn_id=msg.txn_id,
        group=msg.group,
        messages=msg.messages,
        first_send_ms=msg.first_send_ms,
        checks=msg.checks,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class DiscardedTransaction:
    """A transaction a broker rolled back on its own, after its check-backs."""

    txn_id: str
    group: str
    messages: int
    #: When the broker rolled it back (epoch ms).
    decided_ms: int
    #: Why, e.g. the checks ran out.
    reason: str


def discarded_transaction_from_wire(msg: wire.DiscardedTxnInfo) -> DiscardedTransaction:
    return DiscardedTransaction(
        txn_id=msg.txn_id,
        group=msg.group,
        messages=msg.messages,
        decided_ms=msg.decided_ms,
        reason=msg.reason,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class TransactionStatus:
    """Transactions over all brokers: open ones, discarded ones, counters since start and
    the check-back settings."""

    open: tuple[OpenTransaction, ...]
    discarded: tuple[DiscardedTransaction, ...]
    #: Transactions committed and rolled back since the brokers started.
    committed: int
    rolled_back: int
    #: How long a transaction stays open before the first check-back.
    check_delay_ms: int
    #: Time between check-backs.
    check_interval_ms: int
    #: Check-backs before the broker rolls a transaction back.
    max_checks: int


def transaction_status_from_wire(msg: wire.TxnStatusResponse) -> TransactionStatus:
    return TransactionStatus(
        open=tuple(open_transaction_from_wire(t) for t in msg.open),
        discarded=tuple(discarded_transaction_from_wire(d) for d in msg.discarded),
        committed=msg.committed,
        rolled_back=msg.rolled_back,
        check_delay_ms=msg.check_delay_ms,
        check_interval_ms=msg.check_interval_ms,
        max_checks=msg.max_checks,
    )


# ------------------------------------------------------------------ pop consumption


@dataclass(frozen=True, slots=True, kw_only=True)
class SuspendedMessage:
    """A message that used up its attempts and waits for `Admin.resume`."""

    offset: int
    message_id: str
    attempts: int
    #: The consumer's reason of the last failed attempt ("" if its lease ran out).
    error: str


def suspended_message_from_wire(msg: wire.PopSuspended) -> SuspendedMessage:
    return SuspendedMessage(
        offset=msg.offset, message_id=msg.message_id, attempts=msg.attempts, error=msg.error
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class PopStatus:
    """A pop (simple or push) consumer group's consumption of one queue."""

    topic: str
    queue: int
    #: Every message below this offset is acknowledged (or dead-lettered).
    acked_below: int
    #: The next offset to hand out.
    next_offset: int
    #: Messages handed out and not acknowledged yet.
    in_flight: int
    #: Messages moved to the group's dead-letter topic.
    dead_lettered: int
    suspended: tuple[SuspendedMessage, ...]
    #: Messages nacked from this queue and moved to the group's retry topic.
    retried: int


def pop_status_from_wire(msg: wire.PopQueueStatus) -> PopStatus:
    return PopStatus(
        topic=msg.topic,
        queue=msg.queue,
        acked_below=msg.acked_below,
        next_offset=msg.next_offset,
        in_flight=msg.in_flight,
        dead_lettered=msg.dead_lettered,
        suspended=tuple(suspended_message_from_wire(s) for s in msg.suspended),
        retried=msg.retried,
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeResult:
    """Where a resumed message is, and what was done with it."""

    topic: str
    queue: int
    offset: int
    #: "retry" or "dead-letter".
    action: str


def resume_result_from_wire(msg: wire.PopResumeResponse) -> ResumeResult:
    return ResumeResult(topic=msg.topic, queue=msg.queue, offset=msg.offset, action=msg.action)


@dataclass(frozen=True, slots=True, kw_only=True)
class UserInfo:
    """A user of the brokers' SCRAM authentication: its name and PBKDF2 iterations (the
    credentials themselves are never listed)."""

    name: str
    iterations: int


def user_info_from_wire(msg: wire.UserEntry) -> UserInfo:
    return UserInfo(name=msg.name, iterations=msg.iterations)
