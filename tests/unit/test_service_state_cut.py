"""A member's saved service states after a cut of its log (`broker/service_state_cut.py`):
a state whose rescan starts past the cut is forgotten (elected, the member rescanned the
log from inside a copied record and could not lead); one at or before it is kept."""

from __future__ import annotations

from pathlib import Path

import msgspec

from tidemq.broker.pop_service import PopService
from tidemq.broker.service_state_cut import drop_states_past
from tidemq.broker.timer_service import TimerService
from tidemq.broker.transaction_service import TransactionService
from tidemq.store.config import StoreConfig
from tidemq.store.message_store import MessageStore


def _states(timer: int, transactions: int, pop: int) -> dict[str, bytes]:
    """Saved states as the services write them, rescanning from these positions."""
    encode = msgspec.msgpack.encode
    return {
        "timer": encode({"position": timer, "done": [], "delivered": 0, "cancelled": 0}),
        "transactions": encode(
            {
                "position": transactions,
                "half_done": [],
                "op_done": [],
                "markers": {},
                "discarded": [],
                "committed": 0,
                "rolled_back": 0,
            }
        ),
        "pop": encode({"op_offset": 0, "epoch": 0, "queues": [], "position": pop}),
    }


def test_states_past_the_cut_are_dropped_and_the_others_kept(tmp_path: Path) -> None:
    store = MessageStore.open(StoreConfig(data_dir=tmp_path))
    try:
        meta = store.metadata
        meta.save_service_state(_states(timer=100, transactions=500, pop=501))
        assert TimerService.scan_position(meta.service_state("timer")) == 100
        assert sorted(drop_states_past(store, 500)) == ["pop"]
        assert TransactionService.scan_position(meta.service_state("transactions")) == 500
        assert meta.service_state("pop") is None
        assert PopService.scan_position(meta.service_state("pop")) == 0  # rebuilt from scratch
        assert drop_states_past(store, 500) == []
        assert sorted(drop_states_past(store, 99)) == ["timer", "transactions"]
        assert [meta.service_state(n) for n in ("timer", "transactions")] == [None, None]
    finally:
        store.close()
