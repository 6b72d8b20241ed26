"""One event loop and one `ClusterClient` per bootstrap address, per process.

Spark pickles readers and writers and runs them in driver-side and executor-side Python
processes, which it reuses across tasks. Nothing that holds a socket, a lock or a thread
can travel in a pickle, so the connector keeps them here, created on first use and keyed
by `os.getpid()`: a process forked after first use (Spark's daemon forks its workers)
builds its own instead of inheriting a loop whose thread did not survive the fork.

The loop runs on a daemon thread; callers block on `run(coro)` or keep the future of
`submit(coro)` to overlap network waits with their own work.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

from tidemq.client.cluster import ClusterClient
from tidemq.spark.options import ClientOptions

__all__ = ["Runtime", "runtime"]

T = TypeVar("T")


#: Plaintext, no login: the default connection.
_PLAIN = ClientOptions()


class Runtime:
    def __init__(self) -> None:
        self.pid = os.getpid()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="tidemq-spark", daemon=True
        )
        self._thread.start()
        self._clusters: dict[tuple[str, ClientOptions], ClusterClient] = {}
        self._lock = threading.Lock()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def run(self, coro: Coroutine[Any, Any, T], timeout_s: float | None = None) -> T:
        return self.submit(coro).result(timeout_s)

    def cluster(self, bootstrap: str, options: ClientOptions = _PLAIN) -> ClusterClient:
        """The process's client for `bootstrap` with these connection options (connections
        and routes are shared by every task the process runs)."""
        key = (bootstrap, options)
        with self._lock:
            client = self._clusters.get(key)
            if client is None:
                client = self._clusters[key] = ClusterClient(bootstrap, options.client_config())
            return client


_lock = threading.Lock()
_current: Runtime | None = None


def runtime() -> Runtime:
    """This process's runtime, created on first use (and again after a fork)."""
    global _current  # noqa: PLW0603 - one per process, by design
    with _lock:
        if _current is None or _current.pid != os.getpid():
            _current = Runtime()
        return _current
