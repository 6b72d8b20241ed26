"""Request codes. A response carries its request's code. Values are part of the wire
format: append new codes, never renumber."""

from __future__ import annotations

from enum import IntEnum

__all__ = ["RequestCode"]


class RequestCode(IntEnum):
    # data
    PRODUCE = 1
    FETCH = 2
    LIST_OFFSETS = 3
    INIT_PRODUCER = 4
    # topics
    CREATE_TOPIC = 10
    ALTER_TOPIC = 11
    DELETE_TOPIC = 12
    LIST_TOPICS = 13
    DESCRIBE_TOPIC = 14
    CREATE_TOPICS = 15
    # consumer groups
    JOIN_GROUP = 20
    HEARTBEAT = 21
    LEAVE_GROUP = 22
    COMMIT_OFFSETS = 23
    FETCH_OFFSETS = 24
    LIST_GROUPS = 25
    DESCRIBE_GROUP = 26
    RESET_OFFSETS = 27
    # cluster
    GET_ROUTES = 40
    REGISTER_BROKER = 41
    UNREGISTER_BROKER = 42
    CLUSTER_STATUS = 43
    STATUS = 44
    # delayed and transactional messages
    CANCEL_DELAYED = 50
    TIMER_STATUS = 51
    BEGIN_TXN = 52
    END_TXN = 53
    SINK_MARKER = 54
    #: Server to client: the broker asks a producer of the group how a transaction ended.
    CHECK_TXN = 55
    REGISTER_CHECKER = 56
    TXN_STATUS = 57
    # pop consumption
    POP_RECEIVE = 60
    POP_ACK = 61
    POP_CHANGE_INVISIBLE = 62
    POP_NACK = 63
    POP_STATUS = 64
    POP_RESUME = 65
    # authentication (docs/design/security.md): the only requests a connection may send
    # before it has authenticated, when the broker requires it (broker.auth_enabled)
    SASL_HANDSHAKE = 70
    SASL_AUTHENTICATE = 71
    # users (SCRAM credentials) of a broker
    USER_UPSERT = 72
    USER_DELETE = 73
    USER_LIST = 74
    # ACL entries of a broker (docs/design/security.md section 4)
    ACL_CREATE = 80
    ACL_DELETE = 81
    ACL_LIST = 82
    # static topics (docs/design/static-topics.md): open links, seal a write end, update
    STATIC_OPEN = 90
    STATIC_SEAL = 91
    STATIC_UPDATE = 92
    # hand a sealed queue's pending delayed messages over to its write end
    STATIC_TIMERS_TAKE = 93
    STATIC_TIMERS_ADOPT = 94
    STATIC_TIMERS_HANDED = 95
    # compact topics (docs/guide/compact-topics.md): a key's latest value, a run on demand
    KV_GET = 100
    COMPACT = 101
    # operations (docs/guide/operations.md): messages by key (the broker's key index)
    QUERY_MESSAGES = 110
    # ... and a delayed or transactional message by the id naming its origin
    ORIGIN_MESSAGE = 111
    # tiered storage (docs/guide/tiered-storage.md): what is offloaded, and how it goes
    TIER_STATUS = 120
    TIER_FILES = 121
    TIER_OFFLOAD = 122
    # replication within a broker group (docs/design/replication.md): a follower pulls
    # the leader's commit log by position
    REPLICA_FETCH = 130
    # ... and an operator moves a group's leadership to another member (cluster elect)
    ELECT_LEADER = 131
    # ... and a follower starting over (the leader's log start passed it) fetches the
    # leader's compacted log files, chunk by chunk
    REPLICA_FILE = 132
    # users and ACL entries shared by a cluster (docs/adr/0015): a broker gives the name
    # servers its tables, and takes newer ones from them; with a cluster secret, a broker
    # logs its name-server connections in with it (mechanism CLUSTER_MECHANISM)
    SECURITY_PUSH = 140
    SECURITY_PULL = 141
    # Planned ranges, so that work on several features at once does not collide:
    # 80-89 authorization (ACLs, issue 16); 90-99 static topics (issue 17);
    # 100-109 compact topics and key-value access (issue 18); 110-119 operations (issue 22);
    # 120-129 tiered storage (issue 20); 140-149 cluster-wide users and ACLs (issue 16;
    # 130-139 left to replication, issue 23).
