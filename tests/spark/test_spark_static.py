"""Spark on static topics remapped while it reads and writes them: a stream with the
exactly-once topic sink from one static topic to another (output = input, each once),
and the db-sync pipeline running continuously (the shards end equal to the reference
state)."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pyspark.sql import DataFrame, SparkSession
from tests.spark.test_pipeline_db_sync import _applied, _read_shard
from tests.spark.test_spark_sink import _query, _values

from tidemq import Admin, Producer
from tidemq.broker.broker import Broker
from tidemq.broker.config import BrokerConfig
from tidemq.cluster.service import NameServerService
from tidemq.spark.pipelines.changes import expected_state, generate_changes, produce_changes
from tidemq.spark.pipelines.db_sync import run_db_sync
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
            # A broker registers before its start returns.
            assert [b.name for b in admin.cluster_status()] == ["broker-a", "broker-b"]
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
        # The sink writes in transactions, to a static topic remapped too.
        admin.create_topic(target, 2, static=True, brokers=["broker-a"])
        admin.create_topic(source, 2, static=True, brokers=["broker-a"])
        _fill(producer, source, 0, 60)
        query()
        admin.remap_topic(source, brokers=["broker-b"])
        admin.remap_topic(target, brokers=["broker-b"])
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


def test_db_sync_runs_on_while_its_static_topic_is_remapped(
    spark: SparkSession, topic_name: str, tmp_path: Path, cluster: ThreadedCluster
) -> None:
    """The seed's database-sync case: change events keep arriving, the topic is remapped
    onto another broker mid-run; the shards end equal to the reference state."""
    events = generate_changes(300, seed=17)
    thirds = [events[:100], events[100:200], events[200:]]
    target = f"sqlite:///{tmp_path}/shard_{{shard}}.db"
    with Admin(cluster.bootstrap) as admin:
        admin.create_topic(topic_name, 4, static=True, brokers=["broker-a"])
        assert produce_changes(cluster.bootstrap, topic_name, thirds[0]) == 100
        query = run_db_sync(
            spark,
            bootstrap=cluster.bootstrap,
            topics=[topic_name],
            target=target,
            shards=3,
            checkpoint=tmp_path / "checkpoint",
            trigger="continuous",
            max_offsets_per_trigger=40,
        )
        try:
            produce_changes(cluster.bootstrap, topic_name, thirds[1])
            report = admin.remap_topic(topic_name, brokers=["broker-b"])
            assert len(report.switches) == 4
            produce_changes(cluster.bootstrap, topic_name, thirds[2])
            # Spark's own wait: until the running query has processed all there is.
            query.processAllAvailable()
            assert query.exception() is None
            assert _applied_total(tmp_path) == len(events)
        finally:
            query.stop()
    state = {s: _read_shard(tmp_path / f"shard_{s}.db") for s in range(3)}
    assert state == expected_state(events, 3)


def _applied_total(root: Path) -> int:
    path = root / "shard_0.db"
    if not path.exists():
        return 0
    return sum(_applied(path).values())
