"""The asyncio client API: the same names and arguments as the sync API in `tidemq`."""

from __future__ import annotations

from tidemq.client.acls import Acl
from tidemq.client.admin import AsyncAdmin as Admin
from tidemq.client.broadcast_consumer import AsyncBroadcastConsumer as BroadcastConsumer
from tidemq.client.group_consumer import AsyncGroupConsumer as GroupConsumer
from tidemq.client.kv import CompactionReport, KeyLookup
from tidemq.client.producer import AsyncProducer as Producer
from tidemq.client.push_consumer import AsyncPushConsumer as PushConsumer
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
from tidemq.client.simple_consumer import AsyncReceivedMessage as ReceivedMessage
from tidemq.client.simple_consumer import AsyncSimpleConsumer as SimpleConsumer
from tidemq.client.simple_consumer import Sql92
from tidemq.client.stream_consumer import AsyncStreamConsumer as StreamConsumer
from tidemq.client.table_view import AsyncTableView as TableView
from tidemq.client.transaction import AsyncTransaction as Transaction
from tidemq.client.transaction import AsyncTransactionProducer as TransactionProducer
from tidemq.client.transaction import TransactionCheck
from tidemq.core.message import BatchReceipts, Message, MessageBatch, Receipt

__all__ = [
    "Acl",
    "Admin",
    "BatchReceipts",
    "BroadcastConsumer",
    "BrokerInfo",
    "BrokerStatus",
    "CancelResult",
    "CommittedOffset",
    "CompactionReport",
    "DiscardedTransaction",
    "GroupConsumer",
    "GroupDescription",
    "HandlerTimeout",
    "KeyLookup",
    "LeaderHandover",
    "MemberInfo",
    "Message",
    "MessageBatch",
    "NewTopic",
    "OpenTransaction",
    "PopStatus",
    "Producer",
    "PushConsumer",
    "QueueInfo",
    "QueueLag",
    "Receipt",
    "ReceivedMessage",
    "ReplicaFollower",
    "Replication",
    "ResumeResult",
    "RetryPolicy",
    "SimpleConsumer",
    "Sql92",
    "StreamConsumer",
    "SuspendedMessage",
    "TableView",
    "TierFile",
    "TierQueueStatus",
    "TierStatus",
    "TimerStatus",
    "TimerTopicStatus",
    "TopicInfo",
    "Transaction",
    "TransactionCheck",
    "TransactionProducer",
    "TransactionStatus",
    "UserInfo",
]
