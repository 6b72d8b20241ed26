"""tidemq: stream storage for Python data teams.

The synchronous client API; `tidemq.aio` has the asyncio twins with the same names.
"""

from __future__ import annotations

from tidemq.client.push_consumer import HandlerTimeout, RetryPolicy
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
    Transaction,
    TransactionProducer,
)
from tidemq.client.transaction import TransactionCheck
from tidemq.core.errors import (
    AlreadyDelivered,
    BatchTooLarge,
    BrokerNotAvailable,
    DelayTooLong,
    DiskFull,
    InvalidTopicName,
    MessageTypeMismatch,
    OffsetOutOfRange,
    QueueNotFound,
    RequestTimeout,
    TidemqError,
    TopicAlreadyExists,
    TopicNotFound,
    TransactionStateError,
    UnknownMessage,
    UnknownTransaction,
)
from tidemq.core.malloc_tuning import tune_malloc
from tidemq.core.message import BatchReceipts, Message, MessageBatch, Receipt
from tidemq.core.version import __version__

__all__ = [
    "Admin",
    "AlreadyDelivered",
    "BatchReceipts",
    "BatchTooLarge",
    "BroadcastConsumer",
    "BrokerNotAvailable",
    "DelayTooLong",
    "DiskFull",
    "GroupConsumer",
    "HandlerTimeout",
    "InvalidTopicName",
    "Message",
    "MessageBatch",
    "MessageTypeMismatch",
    "OffsetOutOfRange",
    "Producer",
    "PushConsumer",
    "QueueNotFound",
    "Receipt",
    "ReceivedMessage",
    "RequestTimeout",
    "RetryPolicy",
    "SimpleConsumer",
    "Sql92",
    "StreamConsumer",
    "TidemqError",
    "TopicAlreadyExists",
    "TopicNotFound",
    "Transaction",
    "TransactionCheck",
    "TransactionProducer",
    "TransactionStateError",
    "UnknownMessage",
    "UnknownTransaction",
    "__version__",
    "tune_malloc",
]
