"""The asyncio client API: the same names and arguments as the sync API in `tidemq`."""

from __future__ import annotations

from tidemq.client.admin import AsyncAdmin as Admin
from tidemq.client.group_consumer import AsyncGroupConsumer as GroupConsumer
from tidemq.client.producer import AsyncProducer as Producer
from tidemq.client.stream_consumer import AsyncStreamConsumer as StreamConsumer
from tidemq.client.transaction import AsyncTransaction as Transaction
from tidemq.client.transaction import AsyncTransactionProducer as TransactionProducer
from tidemq.client.transaction import TransactionCheck
from tidemq.core.message import Message, Receipt

__all__ = [
    "Admin",
    "GroupConsumer",
    "Message",
    "Producer",
    "Receipt",
    "StreamConsumer",
    "Transaction",
    "TransactionCheck",
    "TransactionProducer",
]
