"""A Spark stream with the exactly-once topic sink reads a static topic while it is
remapped onto another broker and back: the output is the input, each message once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pyspark.sql import DataFrame, SparkSession
from tests.spark.test_spark_sink import _query, _values

from tidemq import Admin, Producer
from tidemq.broker.broker import Broker
from tidemq.broker.config import BrokerConfig
from tidemq.cluster.service import NameServerService
from tidemq.store.config import StoreConfig

pytestmark = pytest.mark.spark

T = TypeVar("T")


class ThreadedCluster:
    """A name server and two brokers on one background event loop (real sockets)."""

    def __init__(self, base: Path) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.ns = NameServerService(port=0, broker_ttl_ms=1_500, heartbeat_interval_ms=200)
        self.bootstrap = self.call(self.ns.start())
        self.brokers = [
            Broker(
                BrokerConfig(
                    port=0,
                    broker_name=name,
                    name_servers=(self.bootstrap,),
                    broker_heartbeat_interval_ms=200,
                    broker_ttl_ms=1_500,
                    shutdown_timeout_ms=5_000,
                    store=StoreConfig(data_dir=base / name),
                )
            )
            for name in ("broker-a", "broker-b")
        ]
        for b in self.brokers:
            self.call(b.start())

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(60)

    def stop(self) -> None:
        for b in self.brokers:
            self.call(b.stop())
        self.call(self.ns.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(30)
        self._loop.close()


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[ThreadedCluster]:
    env = ThreadedCluster(tmp_path)
    try:
        with Admin(env.bootstrap) as admin:
            deadline = time.monotonic() + 30
            while len(admin.cluster_status()) < 2:
                assert time.monotonic() < deadline, "the brokers did not register"
                time.sleep(0.05)  # polling a registration, not what the test checks
        yield env
    finally:
        env.stop()


def _fill(producer: Producer, topic: str, start: int, n: int) -> None:
    for i in range(start, start + n):
        producer.send(topic, b"v%d" % i, key=b"k%d" % (i % 7))


def test_stream_reads_a_static_topic_across_two_remaps_exactly_once(
    spark: SparkSession, topic_name: str, tmp_path: Path, cluster: ThreadedCluster
) -> None:
    source, target, sink = topic_name + "-in", topic_name + "-out", topic_name + "-sink"

    def options(**given: Any) -> dict[str, str]:
        return {"bootstrap": cluster.bootstrap, **{k: str(v) for k, v in given.items()}}

    def load(**given: Any) -> DataFrame:
        return spark.read.format("tidemq").options(**options(**given)).load()

    def query() -> None:
        _query(spark, options, source, target, checkpoint, {"sinkId": sink}, 25)

    checkpoint = tmp_path / "checkpoint"
    with Admin(cluster.bootstrap) as admin, Producer(cluster.bootstrap) as producer:
        # An ordinary target (the sink writes in transactions, which static topics do not
        # take yet), spread over both brokers.
        admin.create_topic(target, 2)
        admin.create_topic(source, 2, static=True, brokers=["broker-a"])
        _fill(producer, source, 0, 60)
        query()
        admin.remap_topic(source, brokers=["broker-b"])
        _fill(producer, source, 60, 60)
        query()
        admin.remap_topic(source, brokers=["broker-a"])
        _fill(producer, source, 120, 60)
        query()
    assert _values(load, target) == Counter(b"v%d" % i for i in range(180))
    # A batch read of the whole source crosses both link boundaries of each queue.
    rows = load(subscribe=source).select("partition", "offset").collect()
    for q in (0, 1):
        offsets = sorted(r.offset for r in rows if r.partition == q)
        assert offsets == list(range(len(offsets)))
    assert len(rows) == 180
