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

from tidemq.protocol.codes import RequestCode

__all__ = [
    "REQUESTS",
    "AlterTopicRequest",
    "BrokerStatus",
    "ClusterStatusRequest",
    "ClusterStatusResponse",
    "CommitOffsetsRequest",
    "CommitOffsetsResponse",
    "CreateTopicRequest",
    "DeleteTopicRequest",
    "DescribeGroupRequest",
    "DescribeGroupResponse",
    "DescribeTopicRequest",
    "Empty",
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
    "ProduceRequest",
    "ProduceResponse",
    "QueueInfo",
    "QueueOffset",
    "RegisterBrokerRequest",
    "RegisterBrokerResponse",
    "ResetOffsetsRequest",
    "ResetOffsetsResponse",
    "StatusRequest",
    "StatusResponse",
    "TopicInfoMsg",
    "TopicRoute",
    "UnregisterBrokerRequest",
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


class ProduceResponse(_Msg):
    base_offset: int
    count: int
    duplicate: bool = False
    store_time_ms: int = 0


class FetchRequest(_Msg):
    topic: str
    queue: int
    offset: int
    max_bytes: int
    max_wait_ms: int = 0
    tag_mask: int = 0


class FetchResponse(_Msg):
    status: str  # "found" | "no_new_message" | "offset_out_of_range"
    next_offset: int
    min_offset: int
    max_offset: int
    record_sizes: list[int] = []


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


# ------------------------------------------------------------------ topics


class QueueInfo(_Msg):
    queue: int
    min_offset: int
    max_offset: int
    broker: str


class TopicInfoMsg(_Msg):
    name: str
    queues: int
    message_type: str
    config: dict[str, str] = {}
    queue_info: list[QueueInfo] = []


class CreateTopicRequest(_Msg):
    name: str
    queues: int
    message_type: str = "NORMAL"
    #: Kafka-named topic configs: cleanup.policy, retention.ms, retention.bytes, ...
    config: dict[str, str] = {}
    #: The queues this broker serves; empty means all (a one-broker topic).
    hosted_queues: list[int] = []


class AlterTopicRequest(_Msg):
    name: str
    queues: int | None = None
    config: dict[str, str] = {}
    hosted_queues: list[int] = []


class DeleteTopicRequest(_Msg):
    name: str


class ListTopicsRequest(_Msg):
    pass


class ListTopicsResponse(_Msg):
    topics: list[TopicInfoMsg]


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


class FetchOffsetsResponse(_Msg):
    offsets: list[QueueOffset]


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


class TopicRoute(_Msg):
    topic: str
    queues: int
    message_type: str
    #: queue id -> broker address "host:port"
    brokers: dict[int, str]


class RegisterBrokerRequest(_Msg):
    broker_name: str
    address: str
    #: (topic, total queues, message type, hosted queue ids)
    topics: list[tuple[str, int, str, list[int]]]


class RegisterBrokerResponse(_Msg):
    heartbeat_interval_ms: int
    broker_ttl_ms: int


class UnregisterBrokerRequest(_Msg):
    broker_name: str


class GetRoutesRequest(_Msg):
    topics: list[str] | None = None


class GetRoutesResponse(_Msg):
    routes: list[TopicRoute]
    brokers: dict[str, str]  # broker name -> address
    #: The broker that coordinates consumer groups (offsets, membership).
    coordinator: str = ""


class ClusterStatusRequest(_Msg):
    pass


class BrokerStatus(_Msg):
    name: str
    address: str
    last_heartbeat_ms_ago: int
    topics: int


class ClusterStatusResponse(_Msg):
    brokers: list[BrokerStatus]


class StatusRequest(_Msg):
    pass


class StatusResponse(_Msg):
    broker_name: str
    version: str
    flush_mode: str
    topics: int
    log_end_position: int
    log_flushed_position: int
    connections: int
    uptime_ms: int


#: code -> (request header type, response header type)
REQUESTS: Final[dict[RequestCode, tuple[type[_Msg], type[_Msg]]]] = {
    RequestCode.PRODUCE: (ProduceRequest, ProduceResponse),
    RequestCode.FETCH: (FetchRequest, FetchResponse),
    RequestCode.LIST_OFFSETS: (ListOffsetsRequest, ListOffsetsResponse),
    RequestCode.INIT_PRODUCER: (InitProducerRequest, InitProducerResponse),
    RequestCode.CREATE_TOPIC: (CreateTopicRequest, TopicInfoMsg),
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
}
