"""tidemq: stream storage for Python data teams.

The synchronous client API; `tidemq.aio` has the asyncio twins with the same names.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tidemq.client.acls import Acl
from tidemq.client.kv import CompactionReport, KeyLookup
from tidemq.client.push_consumer import HandlerTimeout, RetryPolicy
from tidemq.client.results import (
    BrokerInfo,
    BrokerStatus,
    CancelResult,
    CommittedOffset,
    DiscardedTransaction,
    GroupDescription,
    LeaderHandover,
    MemberInfo,
    NewTopic,
    OpenTransaction,
    PopStatus,
    QueueInfo,
    QueueLag,
    ReplicaFollower,
    Replication,
    ResumeResult,
    SuspendedMessage,
    TierFile,
    TierQueueStatus,
    TierStatus,
    TimerStatus,
    TimerTopicStatus,
    TopicInfo,
    TransactionStatus,
    UserInfo,
)
from tidemq.client.serde import (
    AvroDeserializer,
    AvroSerializer,
    JsonDeserializer,
    JsonSerializer,
    SchemaRegistry,
)
from tidemq.client.simple_consumer import Sql92
from tidemq.client.sync import (
    Admin,
    BroadcastConsumer,
    GroupConsumer,
    Producer,
    PushConsumer,
    ReceivedMessage,
    SimpleConsumer,
    StreamConsumer,
    TableView,
    Transaction,
    TransactionProducer,
)
from tidemq.client.transaction import TransactionCheck
from tidemq.core.errors import (
    AlreadyDelivered,
    AuthenticationFailed,
    AuthorizationFailed,
    BatchTooLarge,
    BrokerNotAvailable,
    ChangeUnconfirmed,
    DataLost,
    DelayTooLong,
    DeserializationFailed,
    DiskFull,
    InvalidTopicName,
    LeaderFenced,
    MessageTypeMismatch,
    NotEnoughReplicas,
    NotLeader,
    OffsetOutOfRange,
    QueueMoved,
    QueueNotFound,
    RequestTimeout,
    SchemaValidationFailed,
    TidemqError,
    TierUnavailable,
    TopicAlreadyExists,
    TopicNotFound,
    TransactionStateError,
    UnknownMessage,
    UnknownTransaction,
    WriterFenced,
)
from tidemq.core.malloc_tuning import tune_malloc
from tidemq.core.message import BatchReceipts, Message, MessageBatch, Receipt
from tidemq.core.version import __version__
from tidemq.net.tls import client_context as client_tls

__all__ = [
    "Acl",
    "Admin",
    "AlreadyDelivered",
    "AuthenticationFailed",
    "AuthorizationFailed",
    "AvroDeserializer",
    "AvroSerializer",
    "BatchReceipts",
    "BatchTooLarge",
    "BroadcastConsumer",
    "BrokerInfo",
    "BrokerNotAvailable",
    "BrokerStatus",
    "CancelResult",
    "ChangeUnconfirmed",
    "CommittedOffset",
    "CompactionReport",
    "DataLost",
    "DelayTooLong",
    "DeserializationFailed",
    "DiscardedTransaction",
    "DiskFull",
    "GroupConsumer",
    "GroupDescription",
    "HandlerTimeout",
    "InvalidTopicName",
    "JsonDeserializer",
    "JsonSerializer",
    "KeyLookup",
    "LeaderFenced",
    "LeaderHandover",
    "MemberInfo",
    "Message",
    "MessageBatch",
    "MessageTypeMismatch",
    "NewTopic",
    "NotEnoughReplicas",
    "NotLeader",
    "OffsetOutOfRange",
    "OpenTransaction",
    "PopStatus",
    "Producer",
    "ProtobufDeserializer",
    "ProtobufSerializer",
    "PushConsumer",
    "QueueInfo",
    "QueueLag",
    "QueueMoved",
    "QueueNotFound",
    "Receipt",
    "ReceivedMessage",
    "ReplicaFollower",
    "Replication",
    "RequestTimeout",
    "ResumeResult",
    "RetryPolicy",
    "SchemaRegistry",
    "SchemaValidationFailed",
    "SimpleConsumer",
    "Sql92",
    "StreamConsumer",
    "SuspendedMessage",
    "TableView",
    "TidemqError",
    "TierFile",
    "TierQueueStatus",
    "TierStatus",
    "TierUnavailable",
    "TimerStatus",
    "TimerTopicStatus",
    "TopicAlreadyExists",
    "TopicInfo",
    "TopicNotFound",
    "Transaction",
    "TransactionCheck",
    "TransactionProducer",
    "TransactionStateError",
    "TransactionStatus",
    "UnknownMessage",
    "UnknownTransaction",
    "UserInfo",
    "WriterFenced",
    "__version__",
    "client_tls",
    "tune_malloc",
]


if TYPE_CHECKING:
    from tidemq.client.protobuf_serde import ProtobufDeserializer, ProtobufSerializer


def __getattr__(name: str) -> Any:
    # The Protobuf serde imports the protobuf runtime (~50 ms): only when asked for.
    if name in ("ProtobufSerializer", "ProtobufDeserializer"):
        from tidemq.client import protobuf_serde  # noqa: PLC0415

        return getattr(protobuf_serde, name)
    raise AttributeError(f"module 'tidemq' has no attribute {name!r}")
