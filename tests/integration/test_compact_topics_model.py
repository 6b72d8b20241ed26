"""A compact topic on a real broker against a dict model (hypothesis): puts and
tombstones through the Producer, compaction runs (the broker's worker process), broker
restarts on the same data directory, and every read: `Admin.get`, a StreamConsumer from
the start, a TableView. The store-level machine (`tests/property/test_compaction_model.py`)
adds crashes and the clock; this one checks the whole path a user takes."""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from tests.integration.conftest import ThreadedBroker, broker_config

import tidemq

pytestmark = pytest.mark.timeout(300)

TOPIC = "model-kv"
KEYS = [b"a", b"b", b"c", b"d"]
QUEUES = 2


class BrokerCompactionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        self.config = broker_config(Path(self.tmp.name) / "broker")
        self.broker = ThreadedBroker(self.config)
        self.broker.start()
        self._clients()
        self.admin.create_topic(TOPIC, QUEUES, config={"cleanup.policy": "compact"})
        #: key -> latest value sent (None: a tombstone); every send is acknowledged
        self.model: dict[bytes, bytes | None] = {}

    def _clients(self) -> None:
        self.admin = tidemq.Admin(self.broker.address)
        self.producer = tidemq.Producer(self.broker.address)

    def _close_clients(self) -> None:
        self.producer.close()
        self.admin.close()

    def teardown(self) -> None:
        self._close_clients()
        self.broker.stop()
        self.tmp.cleanup()

    @rule(
        puts=st.lists(
            st.tuples(st.sampled_from(KEYS), st.none() | st.binary(min_size=1, max_size=8)),
            min_size=1,
            max_size=6,
        )
    )
    def put(self, puts: list[tuple[bytes, bytes | None]]) -> None:
        for key, value in puts:
            self.producer.send(TOPIC, value, key=key)
            self.model[key] = value

    @rule()
    def compact(self) -> None:
        self.admin.compact(TOPIC)

    @rule()
    def restart(self) -> None:
        self._close_clients()
        self.broker.stop()
        self.config = broker_config(Path(self.tmp.name) / "broker")
        self.broker = ThreadedBroker(self.config)
        self.broker.start()
        self._clients()

    @invariant()
    def reads_agree_with_the_model(self) -> None:
        for key in KEYS:
            assert self.admin.get(TOPIC, key) == self.model.get(key), key
        latest: dict[bytes, bytes | None] = {}
        ends = {q.queue: q.max_offset for q in self.admin.describe_topic(TOPIC).queue_info}
        with tidemq.StreamConsumer(self.broker.address, start="earliest") as consumer:
            consumer.assign([(TOPIC, q) for q in range(QUEUES)])
            deadline = time.monotonic() + 20
            while any((consumer.position(TOPIC, q) or 0) < ends[q] for q in range(QUEUES)):
                assert time.monotonic() < deadline, "the consumer did not reach the end"
                for m in consumer.poll(timeout_ms=100):
                    assert m.key is not None
                    latest[m.key] = m.value
        # Tombstones stay a day after compaction (delete.retention.ms default): a reader
        # from the start sees every key's latest value, deletes included.
        assert latest == self.model
        with tidemq.TableView(TOPIC, self.broker.address) as view:
            assert view.snapshot() == {k: v for k, v in self.model.items() if v is not None}


BrokerCompactionMachine.TestCase.settings = settings(
    max_examples=20,
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestBrokerCompactionModel = BrokerCompactionMachine.TestCase
