"""Typed request and response headers (msgpack via msgspec; the frame body is separate).

Each request class names its code and its response class in `REQUESTS`. Fields may be
added at the end with defaults; none is ever removed or reordered (wire compatibility).
Body conventions:

* PRODUCE request body: one batch payload (`tidemq.core.batch`), as the producer encoded it.
* FETCH response body: whole commit-log records back to back, as stored; their sizes are in
  `FetchResponse.record_sizes`.
"""

from __future__ import annotations

from typing import Final

import msgspec

from tidemq.core.static_chain import QueueChain
from tidemq.protocol.codes import RequestCode

__all__ = [
    "REQUESTS",
    "AlterTopicRequest",
    "BeginTxnRequest",
    "BeginTxnResponse",
    "BrokerStatus",
    "CancelDelayedRequest",
    "CancelDelayedResponse",
    "CheckTxnRequest",
    "CheckTxnResponse",
    "ClusterStatusRequest",
    "ClusterStatusResponse",
    "CommitOffsetsRequest",
    "CommitOffsetsResponse",
    "CreateTopicRequest",
    "DeleteTopicRequest",
    "DescribeGroupRequest",
    "DescribeGroupResponse",
    "DescribeTopicRequest",
    "DiscardedTxnInfo",
    "Empty",
    "EndTxnRequest",
    "EndTxnResponse",
    "ErrorResponse",
    "FetchOffsetsRequest",
    "FetchOffsetsResponse",
    "FetchRequest",
    "FetchResponse",
    "GetRoutesRequest",
    "GetRoutesResponse",
    "GroupMember",
    "GroupOffset",
    "HeartbeatRequest",
    "HeartbeatResponse",
    "InitProducerRequest",
    "InitProducerResponse",
    "JoinGroupRequest",
    "JoinGroupResponse",
    "LeaveGroupRequest",
    "ListGroupsRequest",
    "ListGroupsResponse",
    "ListOffsetsRequest",
    "ListOffsetsResponse",
    "ListTopicsRequest",
    "ListTopicsResponse",
    "OpenTxnInfo",
    "PopAckRequest",
    "PopAckResponse",
    "PopChangeInvisibleRequest",
    "PopChangeInvisibleResponse",
    "PopNackRequest",
    "PopQueueStatus",
    "PopReceiveRequest",
    "PopReceiveResponse",
    "PopRecord",
    "PopResumeRequest",
    "PopResumeResponse",
    "PopStatusRequest",
    "PopStatusResponse",
    "PopSubscription",
    "PopSuspended",
    "PoppedMessage",
    "ProduceRequest",
    "ProduceResponse",
    "PublishedBatch",
    "QueueInfo",
    "QueueOffset",
    "RegisterBrokerRequest",
    "RegisterBrokerResponse",
    "RegisterCheckerRequest",
    "ResetOffsetsRequest",
    "ResetOffsetsResponse",
    "SaslAuthenticateRequest",
    "SaslAuthenticateResponse",
    "SaslHandshakeRequest",
    "SaslHandshakeResponse",
    "SinkMarkerRequest",
    "SinkMarkerResponse",
    "StaticTopicReg",
    "StatusRequest",
    "StatusResponse",
    "TimerStatusRequest",
    "TimerStatusResponse",
    "TimerTopicStatus",
    "TopicInfoMsg",
    "TopicRoute",
    "TxnStatusRequest",
    "TxnStatusResponse",
    "UnregisterBrokerRequest",
    "UserDeleteRequest",
    "UserEntry",
    "UserListRequest",
    "UserListResponse",
    "UserUpsertRequest",
]


class _Msg(msgspec.Struct, kw_only=True, omit_defaults=True):
    pass


class Empty(_Msg):
    pass


class ErrorResponse(_Msg):
    code: int
    message: str


# ------------------------------------------------------------------ data


class ProduceRequest(_Msg):
    topic: str
    queue: int
    producer_id: int = -1
    epoch: int = -1
    base_sequence: int = -1
    #: Deliver at this time (epoch ms) through the timer service; 0: at once.
    deliver_at_ms: int = 0
    #: Write as half messages of this transaction (from BEGIN_TXN); "": not transactional.
    txn_id: str = ""


class ProduceResponse(_Msg):
    base_offset: int
    count: int
    duplicate: bool = False
    store_time_ms: int = 0
    #: Set when the batch went to an internal topic first (the timer topic for a delayed
    #: batch, the half topic for a transactional one): `base_offset` is then its offset in
    #: queue `origin_queue` of that topic, from which the messages' ids are computed.
    origin_topic: str = ""
    origin_queue: int = 0


class FetchRequest(_Msg):
    topic: str
    queue: int
    offset: int
    max_bytes: int
    max_wait_ms: int = 0
    tag_mask: int = 0
    #: A subscription filter evaluated on the broker: kind "tag" (a tag expression) or
    #: "sql92"; "" for none. Records without a match are left out of the answer.
    filter_kind: str = ""
    filter_expression: str = ""


class FetchResponse(_Msg):
    status: str  # "found" | "no_new_message" | "offset_out_of_range"
    next_offset: int
    min_offset: int
    max_offset: int
    record_sizes: list[int] = []
    #: With a filter: per record, a bitmap of its messages that match (bit i of byte i//8
    #: for message i); b"" when all of them do. Empty list without a filter.
    masks: list[bytes] = []


class ListOffsetsRequest(_Msg):
    topic: str
    queue: int
    timestamp_ms: int | None = None


class ListOffsetsResponse(_Msg):
    min_offset: int
    max_offset: int
    offset_for_time: int | None = None


class InitProducerRequest(_Msg):
    #: An id this producer had before (to bump its epoch and fence older instances).
    producer_id: int = -1


class InitProducerResponse(_Msg):
    producer_id: int
    epoch: int
    #: Batches the broker remembers per (producer, queue): an idempotent producer keeps at
    #: most this many in flight per queue (brokers that do not say remember 5).
    window: int = 5


# ------------------------------------------------------------------ topics


class QueueInfo(_Msg):
    queue: int
    min_offset: int
    max_offset: int
    broker: str
    #: Compact topics: offsets below this are served from the queue's compacted log.
    compacted_end: int = 0


class TopicInfoMsg(_Msg):
    name: str
    queues: int
    message_type: str
    config: dict[str, str] = {}
    queue_info: list[QueueInfo] = []
    #: A static topic: the chains of the queues this broker holds links of.
    chains: list[QueueChain] = []


class CreateTopicRequest(_Msg):
    name: str
    queues: int
    message_type: str = "MIXED"
    #: Kafka-named topic configs: cleanup.policy, retention.ms, retention.bytes, ...
    config: dict[str, str] = {}
    #: The queues this broker serves; empty means all (a one-broker topic).
    hosted_queues: list[int] = []


class CreateTopicsRequest(_Msg):
    #: At most `limits.MAX_TOPICS_PER_CREATE`; each one created or refused on its own.
    topics: list[CreateTopicRequest]


class TopicFailure(_Msg):
    name: str
    #: An `ErrorCode` (TOPIC_ALREADY_EXISTS, INVALID_TOPIC_NAME, CONFIG_ERROR, ...).
    code: int
    message: str


class CreateTopicsResponse(_Msg):
    #: The topics created (name, queues, message type, configs; no per-queue info).
    created: list[TopicInfoMsg]
    failed: list[TopicFailure]


class AlterTopicRequest(_Msg):
    name: str
    queues: int | None = None
    config: dict[str, str] = {}
    hosted_queues: list[int] = []


class DeleteTopicRequest(_Msg):
    name: str


class ListTopicsRequest(_Msg):
    """One page of the topic list, by name."""

    #: Only topics whose names start with this ("": every topic).
    prefix: str = ""
    #: Only names after this one (the `next` of the previous page; "": from the first).
    after: str = ""
    #: At most this many (0: `limits.MAX_LIST_TOPICS`, also the most allowed).
    limit: int = 0


class ListTopicsResponse(_Msg):
    topics: list[TopicInfoMsg]
    #: More may follow: ask again with `after` set to this ("": the list is complete).
    #: The last name looked at, which an ACL filter may have left out of `topics`.
    next: str = ""


class DescribeTopicRequest(_Msg):
    name: str


# ------------------------------------------------------------------ groups


class QueueOffset(_Msg):
    topic: str
    queue: int
    offset: int


class JoinGroupRequest(_Msg):
    group: str
    topics: list[str]
    member_id: str = ""
    client_id: str = ""
    session_timeout_ms: int = 30_000


class JoinGroupResponse(_Msg):
    member_id: str
    generation: int
    assignment: list[tuple[str, int]]


class HeartbeatRequest(_Msg):
    group: str
    member_id: str
    generation: int


class HeartbeatResponse(_Msg):
    generation: int
    assignment: list[tuple[str, int]]


class LeaveGroupRequest(_Msg):
    group: str
    member_id: str


class CommitOffsetsRequest(_Msg):
    group: str
    offsets: list[QueueOffset]
    #: -1 with an empty member id: a commit from outside any generation (standalone
    #: consumers, admin), accepted only while the group has no members.
    member_id: str = ""
    generation: int = -1


class CommitOffsetsResponse(_Msg):
    pass


class FetchOffsetsRequest(_Msg):
    group: str
    #: Answer from this broker's own store only. A broker asking the others for a group's
    #: offsets (it has just become the group's coordinator, ADR 17) sets it, so that they
    #: do not ask on in turn.
    local_only: bool = False


class FetchOffsetsResponse(_Msg):
    offsets: list[QueueOffset]
    #: When each of `offsets` was committed (epoch ms, the answering broker's clock), in
    #: the same order. A group's new coordinator adopts, per queue, the offset committed
    #: last (ADR 17). Empty from a broker older than this field: times unknown.
    committed_ms: list[int] = []


class ListGroupsRequest(_Msg):
    pass


class ListGroupsResponse(_Msg):
    groups: list[str]


class DescribeGroupRequest(_Msg):
    group: str


class GroupMember(_Msg):
    member_id: str
    client_id: str
    assignment: list[tuple[str, int]]


class GroupOffset(_Msg):
    topic: str
    queue: int
    committed: int  # -1: nothing committed
    max_offset: int
    lag: int


class DescribeGroupResponse(_Msg):
    group: str
    generation: int
    members: list[GroupMember]
    offsets: list[GroupOffset]


class ResetOffsetsRequest(_Msg):
    group: str
    topic: str
    #: "earliest" | "latest" | "timestamp" (value = ms) | "offset" (value) | "shift" (by value)
    to: str
    value: int = 0
    execute: bool = False


class ResetOffsetsResponse(_Msg):
    offsets: list[QueueOffset]


# ------------------------------------------------------------------ cluster


class TopicRoute(_Msg, array_like=True):
    """One topic's route. Encoded as an array, not a map: a route answer of 100,000
    topics is half the size without the field names (3.4 MB against 6.7)."""

    topic: str
    queues: int
    message_type: str
    #: queue id -> broker address "host:port" (a static topic: its write end's broker)
    brokers: dict[int, str]
    #: A static topic: the newest chain of every queue (tidemq.core.static_chain).
    chains: list[QueueChain] = []


class StaticTopicReg(_Msg):
    """A static topic in a broker's registration: the chains of the queues it holds."""

    topic: str
    queues: int
    message_type: str
    chains: list[QueueChain] = []


class RegisterBrokerRequest(_Msg):
    broker_name: str
    address: str
    #: (topic, total queues, message type, hosted queue ids)
    topics: list[tuple[str, int, str, list[int]]]
    #: When the broker's data directory was created (epoch ms): the oldest live broker
    #: takes the security writer role when it is free (ADR 20).
    created_ms: int = 0
    #: With a cluster secret (tidemq.cluster.membership): when the broker signed this
    #: request (epoch ms), and the HMAC-SHA256 of what it claims.
    signed_ms: int = 0
    signature: bytes = b""
    #: Static topics, apart from `topics` (their queues are chains, not claims).
    static_topics: list[StaticTopicReg] = []
    #: The broker's run and its topic list's version (cluster/topic_journal.py). With
    #: `base_version` >= 0 this is a delta on top of that version: `topics` are the
    #: topics changed since (upserted), `removed` those deleted; -1: a full registration.
    epoch: str = ""
    version: int = 0
    base_version: int = -1
    removed: list[str] = []
    #: The version of the broker's users and ACL entries (protocol/security_messages.py).
    security_counter: int = 0
    security_digest: int = 0
    #: A replica group's leader (docs/design/replication.md): the epoch it leads under
    #: (0: not a group). A name server refuses a registration under an older epoch than
    #: one it holds for the name: a deposed leader that has not noticed yet cannot take
    #: the group's routes back.
    leader_epoch: int = 0
    #: The security writer's term this broker holds a lease for (docs/adr/0020; 0:
    #: none): a name server that restarted learns the writer from it.
    writer_term: int = 0
    #: A digest of the name servers this broker registers with (cluster/name_server_sets.py;
    #: 0: not said): a writer's change is confirmed by a majority of its list, so every
    #: broker must list the same ones (docs/adr/0026).
    name_servers_digest: int = 0


class RegisterBrokerResponse(_Msg):
    heartbeat_interval_ms: int
    broker_ttl_ms: int
    #: False: a delta the name server could not apply (it does not hold the broker at its
    #: base version); the broker registers in full.
    accepted: bool = True
    #: The newest users and ACL entries this name server holds (security_messages.py): a
    #: broker with an older version pulls them (SECURITY_PULL).
    security_counter: int = 0
    security_digest: int = 0
    #: The broker's version is newer than what this name server holds: push it.
    security_push: bool = False
    #: The address of the broker that changes users and ACL entries (the security
    #: writer, ADR 15 and 20); a change sent to another broker is refused
    #: (NotCoordinator).
    security_writer: str = ""
    #: The term `security_writer` holds (docs/adr/0020): to that broker, a lease on the
    #: role for `broker_ttl_ms` from when it sent the registration; 0: no lease now (the
    #: name server is new and still learning who held the role).
    writer_term: int = 0


class UnregisterBrokerRequest(_Msg):
    broker_name: str
    #: As for RegisterBrokerRequest.
    signed_ms: int = 0
    signature: bytes = b""
    #: A replica group's leader: the epoch it led under (0: not a group). A name server
    #: ignores an unregister from an older epoch than the group's registration: the old
    #: leader stopping after a handover must not take the new leader's routes away.
    leader_epoch: int = 0


class GetRoutesRequest(_Msg):
    topics: list[str] | None = None
    #: Asking for every topic: the `generation` of the routes the client has (0: none).
    #: When nothing changed since, the answer says `unchanged` and carries no routes.
    known: int = 0


class GetRoutesResponse(_Msg):
    routes: list[TopicRoute]
    brokers: dict[str, str]  # broker name -> address
    #: The security writer: the broker that changes users and ACL entries (the oldest
    #: live broker, ADR 15). Named for when it also coordinated every consumer group;
    #: each group's coordinator now follows from `brokers` (ADR 17).
    coordinator: str = ""
    #: For an answer about every topic: a token of these routes, to send back as `known`
    #: (0 for an answer about named topics).
    generation: int = 0
    #: The routes of `known` are current: `routes` is empty, `brokers` and `coordinator`
    #: are as they were.
    unchanged: bool = False
    #: Topics asked for by name that the asking user may not describe, whether they exist
    #: or not (a broker with ACLs): refused, rather than reported unknown.
    denied: list[str] = []


class ClusterStatusRequest(_Msg):
    pass


class BrokerStatus(_Msg):
    name: str
    address: str
    last_heartbeat_ms_ago: int
    topics: int
    #: The version of its users and ACL entries, as it last reported it.
    security_counter: int = 0
    security_digest: int = 0
    #: The security writer's term, if this broker holds the role here (0: it does not;
    #: docs/adr/0020).
    writer_term: int = 0


class ClusterStatusResponse(_Msg):
    brokers: list[BrokerStatus]
    #: The newest users and ACL entries the answering name server holds.
    security_counter: int = 0
    security_digest: int = 0


class StatusRequest(_Msg):
    pass


class ReplicaFollowerStatus(_Msg):
    member: str
    #: The follower's log end and flushed position at its last fetch this term.
    position: int
    durable: int
    in_sync: bool


class ReplicationStatus(_Msg):
    """A replica group leader's view (docs/design/replication.md)."""

    group: str
    #: The member leading, and its epoch.
    member: str
    epoch: int
    #: The group's committed position, and the leader's log end.
    committed: int
    log_end: int
    min_insync_replicas: int
    in_sync: list[str]
    followers: list[ReplicaFollowerStatus] = []


class StatusResponse(_Msg):
    broker_name: str
    version: str
    flush_mode: str
    topics: int
    log_end_position: int
    log_flushed_position: int
    connections: int
    uptime_ms: int
    #: The connection limits, by config key (`broker.<key>`), and their use and event
    #: counters since start: connections, inbound_bytes, response_bytes,
    #: lingering_refusals; refused, read-timeout, idle, write-stall, protocol, internal.
    limits: dict[str, int] = {}
    usage: dict[str, int] = {}
    #: Traffic since start over all topics (produce in, fetch out): the console's rates.
    messages_in: int = 0
    messages_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    #: The file system of the data directory: its size and free bytes.
    disk_total_bytes: int = 0
    disk_free_bytes: int = 0
    #: A replica group's leader: the group's state (None: not a group).
    replication: ReplicationStatus | None = None


#: code -> (request header type, response header type)
# ------------------------------------------------------------------ delayed messages


class CancelDelayedRequest(_Msg):
    message_id: str


class CancelDelayedResponse(_Msg):
    topic: str
    deliver_at_ms: int
    #: Messages cancelled: a delayed batch is scheduled, and cancelled, as one unit.
    count: int


class TimerStatusRequest(_Msg):
    topic: str = ""


class TimerTopicStatus(_Msg):
    topic: str
    pending_batches: int
    pending_messages: int
    next_due_ms: int


class TimerStatusResponse(_Msg):
    topics: list[TimerTopicStatus]
    precision_ms: int
    max_delay_ms: int
    delivered_batches: int
    cancelled_batches: int


# ------------------------------------------------------------------ transactions


class BeginTxnRequest(_Msg):
    group: str


class BeginTxnResponse(_Msg):
    txn_id: str
    #: Undecided after this long, the broker starts asking the group's checkers.
    check_delay_ms: int


class EndTxnRequest(_Msg):
    #: Transactions decided as one unit: one decision record covers them all.
    txn_ids: list[str]
    commit: bool
    #: Exactly-once sinks: stored atomically with a commit, queried by SINK_MARKER.
    sink_id: str = ""
    batch_id: int = -1


class PublishedBatch(_Msg):
    txn_id: str
    topic: str
    queue: int
    base_offset: int
    count: int
    #: Offset of the batch in the half topic (its messages' ids come from there).
    origin_offset: int
    #: The half topic as the ids name it (qualified by the broker; empty from brokers
    #: that predate it: the bare half topic).
    origin_topic: str = ""


class EndTxnResponse(_Msg):
    #: "committed" or "rolled_back".
    outcome: str
    published: list[PublishedBatch] = []
    #: True when the transactions had already ended this way (a retried end is a no-op).
    already: bool = False


class SinkMarkerRequest(_Msg):
    sink_id: str


class SinkMarkerResponse(_Msg):
    #: Last batch id committed with this sink id; -1 if none.
    batch_id: int


class CheckTxnRequest(_Msg):
    txn_id: str
    group: str
    messages: int
    topics: list[str]
    first_send_ms: int
    check: int


class CheckTxnResponse(_Msg):
    #: "commit", "rollback" or "unknown".
    decision: str


class RegisterCheckerRequest(_Msg):
    group: str


class OpenTxnInfo(_Msg):
    txn_id: str
    group: str
    messages: int
    first_send_ms: int
    checks: int


class DiscardedTxnInfo(_Msg):
    txn_id: str
    group: str
    messages: int
    decided_ms: int
    reason: str


class TxnStatusRequest(_Msg):
    pass


class TxnStatusResponse(_Msg):
    open: list[OpenTxnInfo]
    discarded: list[DiscardedTxnInfo]
    committed: int
    rolled_back: int
    check_delay_ms: int
    check_interval_ms: int
    max_checks: int


# ------------------------------------------------------------------ pop consumption


class PopSubscription(_Msg):
    topic: str
    #: A tag expression ("*", "a || b") or, with kind "sql92", a SQL92 filter.
    expression: str = "*"
    kind: str = "tag"


class PopReceiveRequest(_Msg):
    group: str
    subscriptions: list[PopSubscription]
    max_messages: int
    invisible_ms: int
    max_wait_ms: int = 0
    #: After this many deliveries a message goes to the group's dead-letter topic
    #: (`on_exhausted` "dead-letter"), or stays with the broker, suspended, until an
    #: operator resumes it ("suspend"; on a FIFO topic its message group waits too).
    max_attempts: int = 16
    on_exhausted: str = "dead-letter"
    #: Static FIFO topics: (topic, queue, logical offset) below which the consumer knows
    #: every message to be finished for the group, from the brokers' `fifo_finished`
    #: answers (`core/static_fifo.py`); a broker pops a link only past the others' before it.
    fifo_finished: list[tuple[str, int, int]] = []


class PopRecord(_Msg):
    topic: str
    queue: int
    size: int


class PoppedMessage(_Msg):
    topic: str
    queue: int
    offset: int
    #: 1 for the first delivery.
    attempt: int
    handle: str
    deadline_ms: int


class PopReceiveResponse(_Msg):
    #: The records in the body, in order (a record may hold messages not leased here:
    #: the client keeps only the ones in `messages`).
    records: list[PopRecord]
    messages: list[PoppedMessage]
    #: Static FIFO queues with links on several brokers: (topic, queue, logical offset)
    #: below which every message of this broker's links is finished for the group.
    fifo_finished: list[tuple[str, int, int]] = []


class PopAckRequest(_Msg):
    group: str
    handles: list[str]


class PopAckResponse(_Msg):
    #: Per handle: "" when acknowledged, else why not (stale, foreign, unknown).
    errors: list[str]


class PopChangeInvisibleRequest(_Msg):
    group: str
    handle: str
    invisible_ms: int


class PopChangeInvisibleResponse(_Msg):
    handle: str
    deadline_ms: int


class PopNackRequest(_Msg):
    group: str
    handle: str
    #: Redeliver after this long. With `release`, at once and without counting the
    #: delivery as an attempt.
    delay_ms: int = 0
    release: bool = False
    reason: str = ""
    #: The consumer's limit: a nack of a delivery that was the last attempt dead-letters
    #: (or, with `on_exhausted` "suspend", suspends) the message now (0: no limit here).
    max_attempts: int = 0
    on_exhausted: str = "dead-letter"


class PopSuspended(_Msg):
    """A message that used up its attempts and waits for `POP_RESUME`."""

    offset: int
    message_id: str
    attempts: int
    #: The consumer's reason of the last failed attempt ("" if its lease ran out).
    error: str = ""


class PopQueueStatus(_Msg):
    topic: str
    queue: int
    acked_below: int
    next_offset: int
    in_flight: int
    dead_lettered: int
    suspended: list[PopSuspended] = []
    #: Messages nacked from this queue and moved to the group's retry topic.
    retried: int = 0


class PopResumeRequest(_Msg):
    group: str
    message_id: str
    #: "retry": deliver it again with a fresh count of attempts; "dead-letter": move it to
    #: the group's dead-letter topic now (its FIFO message group moves on).
    action: str = "retry"


class PopResumeResponse(_Msg):
    topic: str
    queue: int
    offset: int
    action: str


class PopStatusRequest(_Msg):
    group: str


class PopStatusResponse(_Msg):
    queues: list[PopQueueStatus]


# ------------------------------------------------------------------ authentication


class SaslHandshakeRequest(_Msg):
    mechanism: str


class SaslHandshakeResponse(_Msg):
    mechanisms: list[str]


class SaslAuthenticateRequest(_Msg):
    #: One SCRAM message (client-first, then client-final), at most 2 KiB.
    message: bytes


class SaslAuthenticateResponse(_Msg):
    #: The server's SCRAM answer (server-first, then server-final).
    message: bytes


class UserUpsertRequest(_Msg):
    """Create a user or replace its credentials: never the password, only what the
    server stores (`tidemq.core.scram.Credentials`, made on the client side)."""

    name: str
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


class UserDeleteRequest(_Msg):
    name: str


class UserListRequest(_Msg):
    pass


class UserEntry(_Msg):
    name: str
    iterations: int


class UserListResponse(_Msg):
    users: list[UserEntry]


REQUESTS: Final[dict[RequestCode, tuple[type[_Msg], type[_Msg]]]] = {
    RequestCode.PRODUCE: (ProduceRequest, ProduceResponse),
    RequestCode.FETCH: (FetchRequest, FetchResponse),
    RequestCode.LIST_OFFSETS: (ListOffsetsRequest, ListOffsetsResponse),
    RequestCode.INIT_PRODUCER: (InitProducerRequest, InitProducerResponse),
    RequestCode.CREATE_TOPIC: (CreateTopicRequest, TopicInfoMsg),
    RequestCode.CREATE_TOPICS: (CreateTopicsRequest, CreateTopicsResponse),
    RequestCode.ALTER_TOPIC: (AlterTopicRequest, TopicInfoMsg),
    RequestCode.DELETE_TOPIC: (DeleteTopicRequest, Empty),
    RequestCode.LIST_TOPICS: (ListTopicsRequest, ListTopicsResponse),
    RequestCode.DESCRIBE_TOPIC: (DescribeTopicRequest, TopicInfoMsg),
    RequestCode.JOIN_GROUP: (JoinGroupRequest, JoinGroupResponse),
    RequestCode.HEARTBEAT: (HeartbeatRequest, HeartbeatResponse),
    RequestCode.LEAVE_GROUP: (LeaveGroupRequest, Empty),
    RequestCode.COMMIT_OFFSETS: (CommitOffsetsRequest, CommitOffsetsResponse),
    RequestCode.FETCH_OFFSETS: (FetchOffsetsRequest, FetchOffsetsResponse),
    RequestCode.LIST_GROUPS: (ListGroupsRequest, ListGroupsResponse),
    RequestCode.DESCRIBE_GROUP: (DescribeGroupRequest, DescribeGroupResponse),
    RequestCode.RESET_OFFSETS: (ResetOffsetsRequest, ResetOffsetsResponse),
    RequestCode.GET_ROUTES: (GetRoutesRequest, GetRoutesResponse),
    RequestCode.REGISTER_BROKER: (RegisterBrokerRequest, RegisterBrokerResponse),
    RequestCode.UNREGISTER_BROKER: (UnregisterBrokerRequest, Empty),
    RequestCode.CLUSTER_STATUS: (ClusterStatusRequest, ClusterStatusResponse),
    RequestCode.STATUS: (StatusRequest, StatusResponse),
    RequestCode.CANCEL_DELAYED: (CancelDelayedRequest, CancelDelayedResponse),
    RequestCode.TIMER_STATUS: (TimerStatusRequest, TimerStatusResponse),
    RequestCode.BEGIN_TXN: (BeginTxnRequest, BeginTxnResponse),
    RequestCode.END_TXN: (EndTxnRequest, EndTxnResponse),
    RequestCode.SINK_MARKER: (SinkMarkerRequest, SinkMarkerResponse),
    RequestCode.CHECK_TXN: (CheckTxnRequest, CheckTxnResponse),
    RequestCode.REGISTER_CHECKER: (RegisterCheckerRequest, Empty),
    RequestCode.TXN_STATUS: (TxnStatusRequest, TxnStatusResponse),
    RequestCode.POP_RECEIVE: (PopReceiveRequest, PopReceiveResponse),
    RequestCode.POP_ACK: (PopAckRequest, PopAckResponse),
    RequestCode.POP_CHANGE_INVISIBLE: (PopChangeInvisibleRequest, PopChangeInvisibleResponse),
    RequestCode.POP_NACK: (PopNackRequest, Empty),
    RequestCode.POP_STATUS: (PopStatusRequest, PopStatusResponse),
    RequestCode.POP_RESUME: (PopResumeRequest, PopResumeResponse),
    RequestCode.SASL_HANDSHAKE: (SaslHandshakeRequest, SaslHandshakeResponse),
    RequestCode.SASL_AUTHENTICATE: (SaslAuthenticateRequest, SaslAuthenticateResponse),
    RequestCode.USER_UPSERT: (UserUpsertRequest, Empty),
    RequestCode.USER_DELETE: (UserDeleteRequest, Empty),
    RequestCode.USER_LIST: (UserListRequest, UserListResponse),
}

# Requests defined in their own modules (imported here, after REQUESTS, so that they may
# import from this module without a cycle).
from tidemq.protocol.acl_messages import ACL_REQUESTS  # noqa: E402
from tidemq.protocol.kv_messages import KV_REQUESTS  # noqa: E402
from tidemq.protocol.query_messages import QUERY_REQUESTS  # noqa: E402
from tidemq.protocol.replica_messages import REPLICA_REQUESTS  # noqa: E402
from tidemq.protocol.security_messages import SECURITY_REQUESTS  # noqa: E402
from tidemq.protocol.static_messages import STATIC_REQUESTS  # noqa: E402
from tidemq.protocol.tier_messages import TIER_REQUESTS  # noqa: E402

REQUESTS.update(ACL_REQUESTS)  # type: ignore[arg-type]
REQUESTS.update(KV_REQUESTS)  # type: ignore[arg-type]
REQUESTS.update(QUERY_REQUESTS)  # type: ignore[arg-type]
REQUESTS.update(REPLICA_REQUESTS)  # type: ignore[arg-type]
REQUESTS.update(SECURITY_REQUESTS)  # type: ignore[arg-type]
REQUESTS.update(STATIC_REQUESTS)  # type: ignore[arg-type]
REQUESTS.update(TIER_REQUESTS)  # type: ignore[arg-type]
