"""Fixtures for tests against real brokers over 127.0.0.1, on random ports, with data in
`tmp_path`.

* `loop`: one event loop per test (`asyncio.Runner`); `loop.run(coro)` runs a coroutine on
  it under a timeout. Brokers started by the fixtures below live on this loop, so a test's
  coroutines talk to them in-process while they serve over real sockets.
* `start_broker(**overrides)`: a broker with an embedded name server (`tidemq server`);
  `broker` is one with default settings. Every broker started is stopped at teardown.
* `cluster`: a standalone `NameServerService` and two brokers registering with it, with
  short heartbeat and TTL settings so that a silent broker drops out within seconds.
* `sync_broker`: a broker with an embedded name server on its own thread and loop, for the
  synchronous client (which runs its own background loop).

Everything is function-scoped and stopped in teardown, pass or fail.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import sys
import threading
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tidemq.broker.broker import Broker
from tidemq.broker.config import BrokerConfig
from tidemq.cluster.service import NameServerService
from tidemq.store.config import StoreConfig

T = TypeVar("T")

#: Longest any one test coroutine may run: far above what a test needs on a loaded
#: two-core machine, far below "hangs forever".
DEFAULT_TIMEOUT_S = 60.0
#: Cluster timing: heartbeat every 200 ms, gone after 1.5 s of silence.
CLUSTER_HEARTBEAT_MS = 200
CLUSTER_TTL_MS = 1_500


async def wait_until(
    predicate: Callable[[], bool | Awaitable[bool]],
    *,
    timeout_s: float = 20.0,
    interval_s: float = 0.02,
    what: str = "condition",
) -> None:
    """Poll `predicate` (cheap, in-process state; or a coroutine asking a remote status
    that has no event to wait on) until it holds; fail after `timeout_s`."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s

    async def holds() -> bool:
        answer = predicate()
        return await answer if inspect.isawaitable(answer) else bool(answer)

    while not await holds():
        if loop.time() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        await asyncio.sleep(interval_s)


def _print_task_stacks() -> None:
    tasks = asyncio.all_tasks()
    print(f"--- the test's bound is reached: {len(tasks)} tasks ---", file=sys.stderr)
    for task in tasks:
        print(f"{task.get_name()}:", file=sys.stderr)
        awaited: Any = task.get_coro()
        while awaited is not None:  # the chain of coroutines the task is suspended in
            frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
            if frame is not None:
                code = frame.f_code
                print(f"  {code.co_filename}:{frame.f_lineno} {code.co_name}", file=sys.stderr)
            awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)


class Loop:
    """A per-test event loop. `run` may be called many times; the loop (and every broker
    on it) persists between calls, and its background tasks run only during them."""

    def __init__(self) -> None:
        self._runner = asyncio.Runner()

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float = DEFAULT_TIMEOUT_S) -> T:
        async def bounded() -> T:
            loop = asyncio.get_running_loop()
            # Where every task waits, printed just before the bound cancels them: a test
            # that overran shows what it was stuck on (its captured stderr).
            dump = loop.call_later(max(0.0, timeout_s - 0.05), _print_task_stacks)
            try:
                async with asyncio.timeout(timeout_s) as bound:
                    result = await coro
            finally:
                dump.cancel()
            # Code that swallows the cancellation it got from the bound would let the
            # test pass after the bound, its remaining checks skipped.
            if bound.expired():
                raise AssertionError(f"ran past its {timeout_s} s bound")
            return result

        return self._runner.run(bounded())

    def close(self) -> None:
        self._runner.close()

    #: For test modules, which cannot import this conftest at run time.
    wait_until = staticmethod(wait_until)


@pytest.fixture
def loop() -> Iterator[Loop]:
    lp = Loop()
    try:
        yield lp
    finally:
        lp.close()


def broker_config(data_dir: Path, **overrides: Any) -> BrokerConfig:
    """A broker on a random port of 127.0.0.1 with the default (sync) flush mode.
    `store_overrides` (a dict) goes to the StoreConfig; everything else to BrokerConfig."""
    store = StoreConfig(data_dir=data_dir, **overrides.pop("store_overrides", {}))
    overrides.setdefault("shutdown_timeout_ms", 5_000)
    overrides.setdefault("port", 0)
    return BrokerConfig(store=store, **overrides)


@dataclass
class BrokerEnv:
    broker: Broker
    #: The broker's address; with an embedded name server it is also the bootstrap.
    address: str
    data_dir: Path


StartBroker = Callable[..., BrokerEnv]


@pytest.fixture
def start_broker(loop: Loop, tmp_path: Path) -> Iterator[StartBroker]:
    """`start_broker(**overrides)` starts a broker with an embedded name server on `loop`
    (see `broker_config` for the overrides; `bootstrap_password` and `clock` go to the
    Broker) and returns it running."""
    started: list[Broker] = []

    def start(**overrides: Any) -> BrokerEnv:
        data_dir = tmp_path / f"broker-{len(started)}"
        password = overrides.pop("bootstrap_password", None)
        clock = overrides.pop("clock", None)
        broker = Broker(
            broker_config(data_dir, **overrides),
            embedded_nameserver=True,
            bootstrap_password=password,
            clock=clock,
        )
        started.append(broker)
        address = loop.run(broker.start())
        return BrokerEnv(broker, address, data_dir)

    try:
        yield start
    finally:
        for broker in reversed(started):
            if hasattr(broker, "_server"):  # it got as far as listening
                loop.run(broker.stop())


@pytest.fixture
def broker(start_broker: StartBroker) -> BrokerEnv:
    return start_broker()


@dataclass
class ClusterEnv:
    nameserver: NameServerService
    #: The name server's address: what clients bootstrap from.
    bootstrap: str
    brokers: list[Broker] = field(default_factory=list)
    addresses: list[str] = field(default_factory=list)


@pytest.fixture
def cluster(loop: Loop, tmp_path: Path) -> Iterator[ClusterEnv]:
    """A name server and two brokers ("broker-a", "broker-b") registered with it."""
    yield from start_cluster(loop, tmp_path, ("broker-a", "broker-b"))


@pytest.fixture
def cluster3(loop: Loop, tmp_path: Path) -> Iterator[ClusterEnv]:
    """A name server and three brokers ("broker-a", "broker-b", "broker-c")."""
    yield from start_cluster(loop, tmp_path, ("broker-a", "broker-b", "broker-c"))


def start_cluster(
    loop: Loop, tmp_path: Path, names: tuple[str, ...], **overrides: Any
) -> Iterator[ClusterEnv]:
    """A name server and brokers named `names` registered with it (fixtures yield from
    it); `overrides` go to every broker's config (`broker_config`), but `clock` to the
    brokers."""
    clock = overrides.pop("clock", None)
    ns = NameServerService(
        port=0, broker_ttl_ms=CLUSTER_TTL_MS, heartbeat_interval_ms=CLUSTER_HEARTBEAT_MS
    )
    env = ClusterEnv(ns, loop.run(ns.start()))
    try:
        for name in names:
            config = broker_config(
                tmp_path / name,
                broker_name=name,
                name_servers=(env.bootstrap,),
                broker_heartbeat_interval_ms=CLUSTER_HEARTBEAT_MS,
                broker_ttl_ms=CLUSTER_TTL_MS,
                **overrides,
            )
            b = Broker(config, clock=clock)
            env.brokers.append(b)
            env.addresses.append(loop.run(b.start()))

        async def both_registered() -> None:
            await wait_until(
                lambda: len(ns.nameserver.brokers()) == len(names), what="registration"
            )

        loop.run(both_registered())
        yield env
    finally:
        for b in reversed(env.brokers):
            if hasattr(b, "_server"):
                loop.run(b.stop())
        loop.run(ns.stop())


class ThreadedBroker:
    """A broker with an embedded name server on its own thread and event loop."""

    def __init__(self, config: BrokerConfig, *, bootstrap_password: str | None = None) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="test-broker", daemon=True
        )
        self._thread.start()
        self.broker = Broker(
            config, embedded_nameserver=True, bootstrap_password=bootstrap_password
        )
        self.address = ""

    def start(self) -> str:
        self.address = self.call(self.broker.start())
        return self.address

    def call(self, coro: Awaitable[T], timeout_s: float = DEFAULT_TIMEOUT_S) -> T:
        """Run a coroutine on the broker's loop and wait for its result."""

        async def wrapped() -> T:
            return await coro

        future: concurrent.futures.Future[T] = asyncio.run_coroutine_threadsafe(
            wrapped(), self._loop
        )
        return future.result(timeout_s)

    def stop(self) -> None:
        try:
            if hasattr(self.broker, "_server"):  # it got as far as listening
                self.call(self.broker.stop())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(DEFAULT_TIMEOUT_S)
            self._loop.run_until_complete(_cancel_all(self._loop))
            self._loop.close()


async def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if t is not asyncio.current_task()]
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


@pytest.fixture
def sync_broker(tmp_path: Path) -> Iterator[ThreadedBroker]:
    tb = ThreadedBroker(broker_config(tmp_path / "broker"))
    try:
        tb.start()
        yield tb
    finally:
        tb.stop()


@pytest.fixture
def start_sync_broker(tmp_path: Path) -> Iterator[Callable[..., ThreadedBroker]]:
    """`start_sync_broker(**overrides)`: like `sync_broker`, with `broker_config`
    overrides (and `bootstrap_password` for the Broker); started, stopped at teardown."""
    started: list[ThreadedBroker] = []

    def start(**overrides: Any) -> ThreadedBroker:
        password = overrides.pop("bootstrap_password", None)
        config = broker_config(tmp_path / f"sync-broker-{len(started)}", **overrides)
        tb = ThreadedBroker(config, bootstrap_password=password)
        started.append(tb)
        tb.start()
        return tb

    try:
        yield start
    finally:
        for tb in reversed(started):
            tb.stop()
