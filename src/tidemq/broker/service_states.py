"""The saved states of the broker's log-backed services (timers, transactions, pop): the
rebuild before serving, the periodic save, and the trims and log pin the save allows
(`system_topics` describes the three things a restart rebuilds from).

Also the broker's creation time, the other service_state row the broker keeps.
"""

from __future__ import annotations

import asyncio
import logging
import time

from tidemq.broker.pop_service import PopService
from tidemq.broker.replica_leader import ReplicaLeader
from tidemq.broker.store_gateway import StoreGateway
from tidemq.broker.system_topics import (
    HALF_TOPIC,
    OP_TOPIC,
    POP_TOPIC,
    TIMER_TOPIC,
    ensure_internal_topics,
    scan_moved,
)
from tidemq.broker.timer_service import TimerService
from tidemq.broker.transaction_service import TransactionService
from tidemq.core.errors import DiskFull
from tidemq.store.message_store import MessageStore

__all__ = ["ServiceStates", "created_ms"]

log = logging.getLogger(__name__)

#: service_state key of the broker's creation time (8 bytes, big-endian epoch ms).
_CREATED_KEY = "broker.created_ms"


class ServiceStates:
    """Rebuilds the timer, transaction and pop services from their saved state at start,
    and saves that state (then lets retention drop what they no longer need). One per
    broker; `rebuild` runs on the loop before serving, blocking like the store's own
    recovery; `save` runs on the loop."""

    def __init__(
        self,
        gateway: StoreGateway,
        timers: TimerService,
        transactions: TransactionService,
        pop: PopService,
        *,
        replica: ReplicaLeader | None,
        interval_ms: int,
    ) -> None:
        self._gateway = gateway
        self._timers = timers
        self._transactions = transactions
        self._pop = pop
        self._replica = replica
        self._interval_ms = interval_ms

    def rebuild(self, store: MessageStore) -> None:
        """Before serving: internal topics exist, and the timer and transaction services are
        rebuilt from their saved state, their topics and one scan of the log written since
        (see `system_topics`). Blocking, like the store's own recovery."""
        ensure_internal_topics(store)
        timer_state = store.metadata.service_state("timer")
        txn_state = store.metadata.service_state("transactions")
        pop_state = store.metadata.service_state("pop")
        position = min(
            TimerService.scan_position(timer_state),
            TransactionService.scan_position(txn_state),
            PopService.scan_position(pop_state),
        )
        moved = list(scan_moved(store, position))
        self._timers.rebuild(store, timer_state, moved)
        self._transactions.rebuild(store, txn_state, moved)
        self._pop.rebuild(store, pop_state, moved)
        store.pin_log("services", position)

    def save(self) -> None:
        """Save the services' state, then let retention drop what they no longer need."""
        store = self._gateway.store
        position = store.flushed_position
        timer_state = self._timers.save_state(position)
        txn_state = self._transactions.save_state(position)
        pop_state, pop_offset, pop_position = self._pop.save_state(position)
        store.metadata.save_service_state(
            {"timer": timer_state, "transactions": txn_state, "pop": pop_state}
        )
        store.trim_queue(POP_TOPIC, 0, pop_offset)
        # Each service's scan position is at or before `position` (moves in flight).
        scan = min(
            TimerService.scan_position(timer_state),
            TransactionService.scan_position(txn_state),
            pop_position,
        )
        store.pin_log("services", scan)
        half_low, op_low = self._transactions.low_watermarks
        trims = [
            (TIMER_TOPIC, 0, self._timers.low_watermark),
            (HALF_TOPIC, 0, half_low),
            (OP_TOPIC, 0, op_low),
            (POP_TOPIC, 0, pop_offset),
        ]
        for topic, queue, offset in trims[:3]:
            store.trim_queue(topic, queue, offset)
        if self._replica is not None:  # a replica group's followers keep the same
            self._replica.services_saved(
                {"timer": timer_state, "transactions": txn_state, "pop": pop_state},
                position=position,
                scan_position=scan,
                trims=trims,
            )

    async def save_periodically(self) -> None:
        """`save` every `service_checkpoint_interval_ms`, until cancelled."""
        while True:
            await asyncio.sleep(self._interval_ms / 1000)
            try:
                self.save()
            except DiskFull:
                pass  # the store logs a full disk once, when it starts and when it ends
            except Exception:
                log.exception("saving the timer and transaction state failed")


def created_ms(store: MessageStore) -> int:
    """When this broker's data directory was first used (epoch ms), saved on first start:
    the name servers make the oldest live broker the security writer when the role is
    free (ADR 15, ADR 20)."""
    saved = store.metadata.service_state(_CREATED_KEY)
    if saved is not None and len(saved) == 8:
        return int.from_bytes(saved, "big")
    created = time.time_ns() // 1_000_000
    store.metadata.save_service_state({_CREATED_KEY: created.to_bytes(8, "big")})
    return created
