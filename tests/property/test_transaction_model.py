"""The transaction service against its state table (`transaction_states.TRANSITIONS`).

A hypothesis state machine drives a real broker (in process, over 127.0.0.1) with random
begins, sends, commits, rollbacks, multi-transaction commits and broker restarts, and
checks every answer against the table, and the topic's visible messages against the
model: exactly the committed transactions' messages, each once.
"""

from __future__ import annotations

import asyncio
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tidemq import aio
from tidemq.broker.broker import Broker
from tidemq.broker.config import BrokerConfig
from tidemq.broker.transaction_states import TRANSITIONS, Answer, TxnEvent, TxnState
from tidemq.client.cluster import ClusterClient
from tidemq.core.batch import encode_values
from tidemq.core.errors import TransactionStateError, UnknownTransaction
from tidemq.protocol.commands import (
    BeginTxnRequest,
    BeginTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    ProduceRequest,
    ProduceResponse,
)
from tidemq.store.config import StoreConfig

TOPIC = "model"


def test_every_state_answers_every_event() -> None:
    assert set(TRANSITIONS) == {(s, e) for s in TxnState for e in TxnEvent}
    # Ended transactions take nothing new, and only repeat their own ending.
    for s in (TxnState.COMMITTED, TxnState.ROLLED_BACK):
        assert TRANSITIONS[(s, TxnEvent.SEND)] is Answer.REFUSE
    assert TRANSITIONS[(TxnState.COMMITTED, TxnEvent.COMMIT)] is Answer.ALREADY
    assert TRANSITIONS[(TxnState.ROLLED_BACK, TxnEvent.COMMIT)] is Answer.REFUSE


class TransactionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._tmp = tempfile.TemporaryDirectory()
        self._runner = asyncio.Runner()
        config = BrokerConfig(
            port=0,
            store=StoreConfig(data_dir=Path(self._tmp.name)),
            service_checkpoint_interval_ms=50,
            txn_check_delay_ms=3_600_000,  # no check-backs: the test decides every end
        )
        self._config = config
        self._broker = Broker(config, embedded_nameserver=True)
        self._address = self._run(self._broker.start())
        self._cluster = ClusterClient(self._address)
        self._run(self._create())
        #: txn id -> (state, messages sent); forgotten ids may answer UnknownTransaction.
        self.txns: dict[str, tuple[TxnState, list[bytes]]] = {}
        self.forgettable: set[str] = set()
        self.visible: list[bytes] = []
        self.counter = 0

    def _run(self, coro: Any) -> Any:
        async def bounded() -> Any:
            async with asyncio.timeout(30):
                return await coro

        return self._runner.run(bounded())

    async def _create(self) -> None:
        async with aio.Admin(self._address) as admin:
            await admin.create_topic(TOPIC, 2)

    def teardown(self) -> None:
        self._run(self._cluster.close())
        self._run(self._broker.stop())
        self._runner.close()
        self._tmp.cleanup()

    # ------------------------------------------------------------------ rules

    @rule()
    def begin(self) -> None:
        resp = self._run(
            self._cluster.call(self._address, BeginTxnRequest(group="g"), BeginTxnResponse)
        )
        self.txns[resp.txn_id] = (TxnState.OPEN, [])

    @precondition(lambda self: self.txns)
    @rule(data=st.data(), queue=st.integers(0, 1))
    def send(self, data: st.DataObject, queue: int) -> None:
        txn_id = data.draw(st.sampled_from(sorted(self.txns)))
        state, sent = self.txns[txn_id]
        self.counter += 1
        value = b"m%d" % self.counter
        req = ProduceRequest(topic=TOPIC, queue=queue, txn_id=txn_id)
        body = encode_values([value], timestamp_ms=1)
        try:
            self._run(self._cluster.request(self._address, req, ProduceResponse, body))
        except UnknownTransaction:
            assert txn_id in self.forgettable
            del self.txns[txn_id]
            return
        except TransactionStateError:
            assert TRANSITIONS[(state, TxnEvent.SEND)] is Answer.REFUSE
            return
        assert TRANSITIONS[(state, TxnEvent.SEND)] is Answer.ACCEPT
        sent.append(value)

    @precondition(lambda self: self.txns)
    @rule(data=st.data(), commit=st.booleans(), size=st.integers(1, 3))
    def end(self, data: st.DataObject, commit: bool, size: int) -> None:
        ids = data.draw(
            st.lists(st.sampled_from(sorted(self.txns)), min_size=1, max_size=size, unique=True)
        )
        event = TxnEvent.COMMIT if commit else TxnEvent.ROLLBACK
        answers = {TRANSITIONS[(self.txns[i][0], event)] for i in ids}
        req = EndTxnRequest(txn_ids=ids, commit=commit)
        try:
            resp = self._run(self._cluster.call(self._address, req, EndTxnResponse))
        except UnknownTransaction:
            assert set(ids) & self.forgettable
            for i in set(ids) & self.forgettable:
                del self.txns[i]
            return
        except TransactionStateError:
            assert Answer.REFUSE in answers or len(answers) > 1
            return
        if resp.already:
            assert answers == {Answer.ALREADY}
            return
        assert answers == {Answer.END}
        new_state = TxnState.COMMITTED if commit else TxnState.ROLLED_BACK
        for i in ids:
            sent = self.txns[i][1]
            self.txns[i] = (new_state, sent)
            if commit:
                self.visible.extend(sent)

    @rule()
    def restart(self) -> None:
        self._run(self._cluster.close())
        self._run(self._broker.stop())
        self._broker = Broker(self._config, embedded_nameserver=True)
        self._address = self._run(self._broker.start())
        self._cluster = ClusterClient(self._address)
        for txn_id, (state, sent) in list(self.txns.items()):
            if state is TxnState.OPEN and not sent:
                del self.txns[txn_id]  # nothing durable: the broker never heard of it
            elif state is not TxnState.OPEN:
                self.forgettable.add(txn_id)  # finished: remembered only for a while

    # ------------------------------------------------------------------ invariants

    @invariant()
    def visible_is_exactly_the_committed_messages(self) -> None:
        consumer = aio.StreamConsumer(self._address, start="earliest")

        async def read() -> list[bytes]:
            consumer.assign([(TOPIC, 0), (TOPIC, 1)])
            out: list[bytes] = []
            while batch := await consumer.poll(50):
                out.extend(m.value or b"" for m in batch)
            await consumer.close()
            return out

        got = self._run(read())
        assert sorted(got) == sorted(self.visible)


TransactionMachine.TestCase.settings = settings(
    max_examples=12,
    stateful_step_count=15,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_transactions_follow_the_table = pytest.mark.timeout(300)(TransactionMachine.TestCase)
