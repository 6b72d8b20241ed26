"""Fixtures for the Spark tests (marker `spark`).

* `spark`: ONE SparkSession for the whole test session (starting a JVM costs seconds),
  configured as conventions.md §5 says, with the `tidemq` data source registered.
* `broker`: a broker with an embedded name server on its own thread and event loop, so
  that Spark's Python worker processes reach it over 127.0.0.1 while the test thread
  blocks in Spark. Session-scoped too; tests use topics of their own (`topic_name`).
* `admin`, `producer`: sync clients of that broker.
* helpers, as fixtures: `options`, `load`, `consume`, `source_messages`.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import itertools
import os
import sys
import threading
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as sf

import tidemq.spark
from tidemq import Admin, Message, Producer, StreamConsumer
from tidemq.broker.broker import Broker
from tidemq.broker.config import BrokerConfig
from tidemq.http.listener import HttpListener
from tidemq.store.config import StoreConfig
from tidemq.tiered.config import TieredConfig

T = TypeVar("T")
TIMEOUT_S = 60.0


class ThreadedBroker:
    """A broker with an embedded name server on its own thread and event loop."""

    def __init__(
        self, data_dir: Path, *, bootstrap_password: str | None = None, **config: Any
    ) -> None:
        """`config`: BrokerConfig overrides (auth_enabled=True, ...)."""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="spark-broker")
        self._thread.daemon = True
        self._thread.start()
        broker_config = BrokerConfig(
            port=0, store=StoreConfig(data_dir=data_dir), shutdown_timeout_ms=5_000, **config
        )
        self.broker = Broker(
            broker_config, embedded_nameserver=True, bootstrap_password=bootstrap_password
        )
        self.address = self.call(self.broker.start())

    def call(self, coro: Awaitable[T], timeout_s: float = TIMEOUT_S) -> T:
        async def wrapped() -> T:
            return await coro

        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(
            wrapped(), self._loop
        )
        return future.result(timeout_s)

    def enforce_retention(self) -> None:
        """Run the broker's retention now (it runs every minute on its own)."""

        async def run() -> None:
            await self.broker._gateway.call(lambda store: store.enforce_retention())

        self.call(run())

    def stop(self) -> None:
        try:
            self.call(self.broker.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(TIMEOUT_S)
            self._loop.close()


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    session = (
        SparkSession.builder.master("local[2]")
        .appName("tidemq-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "1g")
        .config("spark.sql.session.timeZone", "UTC")
        .config(
            "spark.driver.extraJavaOptions",
            "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xss16m",
        )
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    tidemq.spark.register(session)
    try:
        yield session
    finally:
        session.stop()


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ThreadedBroker]:
    root = tmp_path_factory.mktemp("spark-broker")
    # With a local-directory tier: topics with remote.storage.enable=true offload there.
    tb = ThreadedBroker(root / "data", tiered=TieredConfig(url=f"file://{root / 'tier'}"))
    try:
        yield tb
    finally:
        tb.stop()


@pytest.fixture(scope="session")
def admin(broker: ThreadedBroker) -> Iterator[Admin]:
    with Admin(broker.address) as a:
        yield a


@pytest.fixture(scope="session")
def producer(broker: ThreadedBroker) -> Iterator[Producer]:
    with Producer(broker.address) as p:
        yield p


_topics = itertools.count()


@pytest.fixture
def topic_name(request: pytest.FixtureRequest) -> str:
    """A topic name no other test uses."""
    return f"{request.node.name.split('[')[0][:80]}-{next(_topics)}"


def _read_options(broker: ThreadedBroker, **options: Any) -> dict[str, str]:
    return {"bootstrap": broker.address, **{k: str(v) for k, v in options.items()}}


def _consume(bootstrap: str, ranges: dict[tuple[str, int], tuple[int, int]]) -> list[Message]:
    """The messages of each (topic, queue) range [start, end), read with StreamConsumer."""
    out: list[Message] = []
    with StreamConsumer(bootstrap, start="none") as consumer:
        consumer.assign(ranges)
        for (topic, queue), (start, _) in ranges.items():
            consumer.seek(topic, queue, start)
        pending = {tq for tq, (start, end) in ranges.items() if end > start}
        while pending:
            for m in consumer.poll(2000):
                if m.offset < ranges[(m.topic, m.queue)][1]:
                    out.append(m)
            for tq in list(pending):
                position = consumer.position(*tq)
                if position is not None and position >= ranges[tq][1]:
                    pending.discard(tq)
    return sorted(out, key=lambda m: (m.topic, m.queue, m.offset))


def _source_messages(df: DataFrame) -> list[Message]:
    """A source DataFrame's rows as the Messages StreamConsumer gives (timestamps in ms,
    headers as a dict), sorted by (topic, queue, offset)."""
    rows = df.withColumn("ts_us", sf.unix_micros("timestamp")).collect()
    out = []
    for row in rows:
        r = row.asDict()
        assert r["ts_us"] % 1000 == 0
        assert r["timestampType"] == 0
        out.append(
            Message(
                r["topic"],
                r["partition"],
                r["offset"],
                None if r["value"] is None else bytes(r["value"]),
                None if r["key"] is None else bytes(r["key"]),
                r["tag"],
                tuple(r["keys"]),
                {h["key"]: bytes(h["value"]) for h in r.get("headers") or []},
                r["ts_us"] // 1000,
            )
        )
    return sorted(out, key=lambda m: (m.topic, m.queue, m.offset))


# Test modules cannot import this conftest at run time: they get its helpers as fixtures
# (and their types under TYPE_CHECKING).
Ranges = dict[tuple[str, int], tuple[int, int]]
Options = Callable[..., dict[str, str]]
Consume = Callable[[Ranges], list[Message]]
SourceMessages = Callable[[DataFrame], list[Message]]
Load = Callable[..., DataFrame]


@pytest.fixture(scope="session")
def options(broker: ThreadedBroker) -> Options:
    """`options(subscribe="t", ...)`: source options with the broker's bootstrap, as str."""
    return functools.partial(_read_options, broker)


@pytest.fixture(scope="session")
def consume(broker: ThreadedBroker) -> Consume:
    """`consume({(topic, queue): (start, end)})`: those ranges read with StreamConsumer."""
    return functools.partial(_consume, broker.address)


@pytest.fixture(scope="session")
def source_messages() -> SourceMessages:
    """`source_messages(df)`: a source DataFrame's rows as StreamConsumer's Messages."""
    return _source_messages


@pytest.fixture(scope="session")
def load(spark: SparkSession, options: Options) -> Load:
    """`load(subscribe="t", ...)`: a batch read of the test broker."""

    def read(**given: Any) -> DataFrame:
        return spark.read.format("tidemq").options(**options(**given)).load()

    return read


@pytest.fixture
def make_broker(tmp_path: Path) -> Iterator[Callable[..., ThreadedBroker]]:
    """`make_broker(**config)`: another broker of the test's own (BrokerConfig overrides,
    and `bootstrap_password`), stopped at teardown."""
    started: list[ThreadedBroker] = []

    def make(**config: Any) -> ThreadedBroker:
        tb = ThreadedBroker(tmp_path / f"broker-{len(started)}", **config)
        started.append(tb)
        return tb

    try:
        yield make
    finally:
        for tb in reversed(started):
            tb.stop()


@pytest.fixture
def registry_url(broker: ThreadedBroker) -> Iterator[str]:
    """The schema registry of an HTTP listener beside the session's broker."""
    listener = HttpListener(broker.address, port=0)
    url = "http://" + broker.call(listener.start())
    try:
        yield url
    finally:
        broker.call(listener.stop())
