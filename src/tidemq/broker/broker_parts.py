"""The broker's core parts, as one context object for the parts built over them (the
request handlers, `request_handling`; the metrics, `broker_metrics`)."""

from __future__ import annotations

from dataclasses import dataclass

from tidemq.broker.compaction_service import CompactionService
from tidemq.broker.config import BrokerConfig
from tidemq.broker.groups import GroupCoordinator
from tidemq.broker.long_polling import LongPolling
from tidemq.broker.offset_book import OffsetBook
from tidemq.broker.pop_service import PopService
from tidemq.broker.replica_leader import ReplicaLeader
from tidemq.broker.static_service import StaticService
from tidemq.broker.store_gateway import StoreGateway
from tidemq.broker.timer_service import TimerService
from tidemq.broker.topics import TopicTable
from tidemq.broker.transaction_service import TransactionService
from tidemq.core.clock import Clock

__all__ = ["BrokerParts"]


@dataclass(frozen=True, kw_only=True, slots=True)
class BrokerParts:
    """Made by `Broker._start` once its services run; read, never replaced."""

    config: BrokerConfig
    clock: Clock
    gateway: StoreGateway
    topics: TopicTable
    polling: LongPolling
    timers: TimerService
    transactions: TransactionService
    pop: PopService
    static: StaticService
    compaction: CompactionService
    book: OffsetBook
    coordinator: GroupCoordinator
    #: This broker leads a replica group (None: it does not).
    replica: ReplicaLeader | None
