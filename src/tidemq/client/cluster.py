"""What every client object shares: the bootstrap name server, connections by address, and
the cached route table (refreshed on a timer and whenever a request says routes moved).

Asyncio only; the sync API runs these on a background loop (`client._loop`).
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from tidemq.cluster.route import RouteTable
from tidemq.core.errors import (
    BrokerNotAvailable,
    QueueNotFound,
    RequestTimeout,
    TidemqError,
    TopicNotFound,
)
from tidemq.net.client import ClientConnection, split_address
from tidemq.protocol.commands import (
    GetRoutesRequest,
    GetRoutesResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
)

__all__ = ["ClientConfig", "ClusterClient"]

T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class ClientConfig:
    #: Longest wait for one request's answer (fetches add their long-poll wait).
    request_timeout_ms: int = 30_000
    #: Routes are refreshed at least this often.
    route_refresh_ms: int = 30_000
    connect_timeout_ms: int = 10_000
    #: Largest frame accepted from a broker (a fetch answer).
    max_frame_bytes: int = 80 << 20
    #: Requests outstanding per connection.
    max_in_flight: int = 64
    #: Retries of a retriable failure, and the backoff between them.
    retries: int = 8
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 2_000


class ClusterClient:
    def __init__(self, bootstrap: str, config: ClientConfig | None = None) -> None:
        split_address(bootstrap)  # a clear error now rather than at the first request
        self.bootstrap = bootstrap
        self.config = config or ClientConfig()
        self._conns: dict[str, ClientConnection] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        self._routes = RouteTable()
        self._routes_at = 0.0
        self._routes_lock: asyncio.Lock | None = None
        self._closed = False

    # ------------------------------------------------------------------ connections

    async def connection(self, address: str) -> ClientConnection:
        if self._closed:
            raise BrokerNotAvailable("the client is closed")
        conn = self._conns.get(address)
        if conn is not None and conn.is_open:
            return conn
        lock = self._opening.setdefault(address, asyncio.Lock())
        async with lock:
            conn = self._conns.get(address)
            if conn is None or not conn.is_open:
                conn = await ClientConnection.open(
                    address,
                    max_frame_bytes=self.config.max_frame_bytes,
                    max_in_flight=self.config.max_in_flight,
                    connect_timeout_s=self.config.connect_timeout_ms / 1000,
                )
                self._conns[address] = conn
            return conn

    async def request(
        self,
        address: str,
        request: msgspec.Struct,
        expected: type[T],
        body: bytes | memoryview = b"",
        *,
        timeout_ms: int | None = None,
    ) -> tuple[T, bytes]:
        conn = await self.connection(address)
        timeout = (timeout_ms or self.config.request_timeout_ms) / 1000
        return await conn.request(request, expected, body, timeout_s=timeout)

    async def call(
        self,
        address: str,
        request: msgspec.Struct,
        expected: type[T],
        body: bytes | memoryview = b"",
        *,
        timeout_ms: int | None = None,
    ) -> T:
        """A request whose failures are retried when retriable (not for sends: the
        producer has its own ordered retry)."""
        attempt = 0
        while True:
            try:
                header, _ = await self.request(
                    address, request, expected, body, timeout_ms=timeout_ms
                )
                return header
            except TidemqError as exc:
                attempt += 1
                if not exc.retriable or attempt > self.config.retries:
                    raise
                await asyncio.sleep(self.backoff_s(attempt))

    def backoff_s(self, attempt: int) -> float:
        ms = min(self.config.retry_backoff_ms << (attempt - 1), self.config.retry_backoff_max_ms)
        return ms / 1000

    # ------------------------------------------------------------------ routes

    @property
    def routes(self) -> RouteTable:
        return self._routes

    async def refresh_routes(self, *, force: bool = False) -> RouteTable:
        # The common case, fresh routes, answers without the lock (one per message sent).
        if not force and time.monotonic() - self._routes_at < self.config.route_refresh_ms / 1000:
            return self._routes
        if self._routes_lock is None:
            self._routes_lock = asyncio.Lock()
        async with self._routes_lock:
            fresh = time.monotonic() - self._routes_at < self.config.route_refresh_ms / 1000
            if fresh and not force:
                return self._routes
            response = await self.call(self.bootstrap, GetRoutesRequest(), GetRoutesResponse)
            self._routes = RouteTable.from_response(response)
            self._routes_at = time.monotonic()
            return self._routes

    async def broker_for(self, topic: str, queue: int) -> str:
        routes = await self.refresh_routes()
        address = routes.broker_for(topic, queue)
        if address is None:
            routes = await self.refresh_routes(force=True)
            address = routes.broker_for(topic, queue)
        if address is None:
            if topic not in routes:
                raise TopicNotFound(f"topic {topic!r} does not exist")
            if not 0 <= queue < routes.queue_count(topic):
                raise QueueNotFound(
                    f"topic {topic!r} has {routes.queue_count(topic)} queues, no queue {queue}"
                )
            raise BrokerNotAvailable(f"no live broker serves {topic}/{queue}")
        return address

    async def list_offsets(
        self, topic: str, queue: int, timestamp_ms: int | None = None
    ) -> ListOffsetsResponse:
        """A queue's readable range (and the first offset at or after `timestamp_ms`),
        from the broker that serves it."""
        address = await self.broker_for(topic, queue)
        request = ListOffsetsRequest(topic=topic, queue=queue, timestamp_ms=timestamp_ms)
        return await self.call(address, request, ListOffsetsResponse)

    async def coordinator(self) -> str:
        routes = await self.refresh_routes()
        if not routes.coordinator:
            routes = await self.refresh_routes(force=True)
        if not routes.coordinator:
            raise BrokerNotAvailable("no live broker to coordinate consumer groups")
        return routes.coordinator

    async def any_broker(self) -> str:
        routes = await self.refresh_routes()
        if not routes.brokers:
            routes = await self.refresh_routes(force=True)
        if not routes.brokers:
            raise BrokerNotAvailable("no live broker is registered with the name server")
        return sorted(routes.brokers.values())[0]

    def invalidate(self, error: BaseException) -> None:
        """Errors that mean the route may be stale make the next lookup refresh it."""
        if isinstance(error, (TopicNotFound, QueueNotFound, BrokerNotAvailable, RequestTimeout)):
            self._routes_at = 0.0

    async def close(self) -> None:
        self._closed = True
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
