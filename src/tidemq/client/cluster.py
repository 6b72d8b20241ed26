"""What every client object shares: the bootstrap name server, connections by address, and
the cached route table (refreshed on a timer and whenever a request says routes moved).

Failure detection on the client side:

* a broker whose connection fails (refused, reset, closed) is marked down at once: its
  queues leave this client's routes (round-robin sends go to the other brokers) and the
  routes are refreshed at once. The mark is cleared when the name server stops listing
  that address (a later listing is a new registration: the broker is back) or after
  `broker_down_ms`, when the broker is tried again;
* routes are refreshed every `route_refresh_ms`, and every `route_refresh_degraded_ms`
  while a broker is marked down or some queue has no live broker, so a returning broker
  is used within about a second of registering;
* a failed refresh keeps the routes already known (served as stale, logged once) and is
  tried again after `route_refresh_degraded_ms`: a name server that is paused or away
  never makes an existing topic look deleted. A due refresh runs in the background while
  callers go on with the routes they have; a forced one is awaited.

Asyncio only; the sync API runs these on a background loop (`client._loop`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from dataclasses import dataclass, field
from typing import TypeVar

import msgspec

from tidemq.client.static_reads import static_list_offsets
from tidemq.cluster.route import RouteTable
from tidemq.core.errors import (
    BrokerNotAvailable,
    QueueMoved,
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

__all__ = ["ClientConfig", "ClusterClient", "RouteTable"]

T = TypeVar("T")

log = logging.getLogger(__name__)

#: A probe of a broker marked down: a live broker accepts within this.
_PROBE_CONNECT_TIMEOUT_MS = 1_000


@dataclass(frozen=True, kw_only=True)
class ClientConfig:
    #: Longest wait for one request's answer (fetches add their long-poll wait).
    request_timeout_ms: int = 30_000
    #: Routes are refreshed at least this often ...
    route_refresh_ms: int = 5_000
    #: ... and this often while a broker is down or a queue has no live broker.
    route_refresh_degraded_ms: int = 1_000
    #: A broker whose connection failed is left out of the routes this long at most.
    broker_down_ms: int = 3_000
    #: Longest wait for the name server's route answer.
    route_request_timeout_ms: int = 5_000
    connect_timeout_ms: int = 10_000
    #: Largest frame accepted from a broker (a fetch answer).
    max_frame_bytes: int = 80 << 20
    #: Requests outstanding per connection.
    max_in_flight: int = 64
    #: Retries of a retriable failure, and the backoff between them.
    retries: int = 8
    retry_backoff_ms: int = 100
    retry_backoff_max_ms: int = 1_000  # Kafka's retry.backoff.max.ms
    #: TLS to the name servers and brokers: None for plaintext, or a context, most simply
    #: `tidemq.client_tls(ca_file=...)` (with `cert_file`/`key_file` for a listener that
    #: asks for client certificates). The same context serves every connection.
    ssl_context: ssl.SSLContext | None = None
    #: SCRAM-SHA-256 login for a broker with `broker.auth_enabled` (docs/guide/security.md):
    #: every connection logs in as this user right after connecting (and after TLS).
    #: None: no login (a broker that requires one refuses every request).
    username: str | None = None
    password: str | None = field(default=None, repr=False)


def _retrieve(task: asyncio.Task[RouteTable]) -> None:
    """A background refresh's failure is seen by the next lookup, not left unretrieved."""
    if not task.cancelled():
        task.exception()


class ClusterClient:
    def __init__(self, bootstrap: str, config: ClientConfig | None = None) -> None:
        split_address(bootstrap)  # a clear error now rather than at the first request
        self.bootstrap = bootstrap
        self.config = config or ClientConfig()
        self._conns: dict[str, ClientConnection] = {}
        self._opening: dict[str, asyncio.Lock] = {}
        #: The name server's last answer, and that with the brokers marked down taken out.
        self._fetched = RouteTable()
        self._routes = RouteTable()
        self._have_routes = False
        #: The name server's token of the whole routes last fetched (GetRoutesRequest.known).
        self._generation = 0
        #: When (monotonic s) the routes are due for a refresh; 0: at the next lookup.
        self._refresh_due = 0.0
        #: A request said the routes are wrong (QueueMoved): the next lookup awaits a refresh.
        self._stale = False
        self._routes_lock: asyncio.Lock | None = None
        self._refresher: asyncio.Task[RouteTable] | None = None
        #: Address -> when (monotonic s) its connection failed.
        self._down: dict[str, float] = {}
        self._stale_logged = False
        #: Connection attempts to brokers marked down, by address.
        self._probes: dict[str, asyncio.Task[None]] = {}
        self._closed = False

    # ------------------------------------------------------------------ connections

    def open_connection(self, address: str) -> ClientConnection | None:
        """The open connection to `address`, if there is one (no waiting, no opening)."""
        conn = self._conns.get(address)
        return conn if conn is not None and conn.is_open and not self._closed else None

    async def connection(self, address: str, *, probe: bool = False) -> ClientConnection:
        if self._closed:
            raise BrokerNotAvailable("the client is closed")
        conn = self._conns.get(address)
        if conn is not None and conn.is_open:
            return conn
        lock = self._opening.setdefault(address, asyncio.Lock())
        async with lock:
            conn = self._conns.get(address)
            if conn is None or not conn.is_open:
                try:
                    conn = await ClientConnection.open(
                        address,
                        max_frame_bytes=self.config.max_frame_bytes,
                        max_in_flight=self.config.max_in_flight,
                        connect_timeout_s=self._connect_timeout_s(probe),
                        ssl_context=self.config.ssl_context,
                        username=self.config.username,
                        password=self.config.password,
                    )
                except BrokerNotAvailable:
                    self.mark_down(address, probe=False)
                    raise
                if self._closed:
                    # Closed while this connection was being opened: `close` has closed
                    # the ones it knew, so this one must not outlive the client.
                    conn.close()
                    raise BrokerNotAvailable("the client is closed")
                self._conns[address] = conn
                if self._down.pop(address, None) is not None:
                    # It accepts connections again: back in the routes.
                    self._routes = self._fetched.without(self._down.keys())
            return conn

    def _connect_timeout_s(self, probe: bool) -> float:
        ms = self.config.connect_timeout_ms
        return min(ms, _PROBE_CONNECT_TIMEOUT_MS) / 1000 if probe else ms / 1000

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
        try:
            return await conn.request(request, expected, body, timeout_s=timeout)
        except BrokerNotAvailable:
            if not conn.is_open:
                self.mark_down(address)
            raise

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
        """The routes as known now, without the brokers marked down (and those whose
        connection was found closed just now)."""
        self._check_connections()
        return self._routes

    def peek_routes(self) -> RouteTable:
        """The routes as known now, from any thread: nothing is checked or changed (the
        brokers whose connection closed since the last `routes` are still in)."""
        return self._routes

    def _check_connections(self) -> None:
        """Mark down the brokers whose pooled connection has closed (a killed broker's
        socket is closed by its kernel): noticed at the next lookup, not the next send."""
        closed = [address for address, conn in self._conns.items() if not conn.is_open]
        for address in closed:
            del self._conns[address]
            self.mark_down(address)

    def _refresh_interval_s(self) -> float:
        degraded = bool(self._down) or self._routes.has_unserved_queues
        ms = self.config.route_refresh_degraded_ms if degraded else self.config.route_refresh_ms
        return min(ms, self.config.route_refresh_ms) / 1000

    async def refresh_routes(self, *, force: bool = False) -> RouteTable:
        """The routes, fetched again from the name server if they are due (or `force`).
        A due refresh with routes known runs in the background and the known routes are
        returned; a forced one (or the first) is awaited. When the name server cannot be
        reached, the known routes are returned (the first fetch raises instead)."""
        # The common case, fresh routes, answers at once (one call per message sent).
        self._check_connections()
        if self._stale:
            self._stale, force = False, True
        if not force and time.monotonic() < self._refresh_due:
            return self._routes
        if self._closed:
            raise BrokerNotAvailable("the client is closed")
        if self._refresher is None or self._refresher.done():
            self._refresher = asyncio.get_running_loop().create_task(self._refresh())
            self._refresher.add_done_callback(_retrieve)
        if self._have_routes and not force:
            # Do not hold this call up: the refresh finishes in the background.
            self._refresh_due = time.monotonic() + self._refresh_interval_s()
            return self._routes
        return await asyncio.shield(self._refresher)

    async def _refresh(self) -> RouteTable:
        if self._routes_lock is None:
            self._routes_lock = asyncio.Lock()
        async with self._routes_lock:
            timeout_ms = min(self.config.route_request_timeout_ms, self.config.request_timeout_ms)
            try:
                if self._have_routes:
                    # One try: on failure the known routes serve until the next one. With
                    # the token of the routes held, an unchanged table is not sent again.
                    response, _ = await self.request(
                        self.bootstrap, GetRoutesRequest(known=self._generation),
                        GetRoutesResponse, timeout_ms=timeout_ms,
                    )  # fmt: skip
                else:
                    response = await self.call(
                        self.bootstrap, GetRoutesRequest(), GetRoutesResponse,
                        timeout_ms=timeout_ms,
                    )  # fmt: skip
            except TidemqError as exc:
                # With routes known, any failure keeps them until the next try (a route
                # answer too large for one frame, with a million queues, included).
                if not self._have_routes:
                    raise
                self._refresh_due = time.monotonic() + self.config.route_refresh_degraded_ms / 1000
                if not self._stale_logged:
                    self._stale_logged = True
                    log.warning(
                        "route refresh from %s failed (%s); using the routes known",
                        self.bootstrap,
                        exc,
                    )
                return self._routes
            if self._stale_logged:
                self._stale_logged = False
                log.warning("route refresh from %s works again", self.bootstrap)
            if not response.unchanged:
                self._fetched = RouteTable.from_response(response)
            elif not self._have_routes:  # never: nothing was known to be unchanged
                raise BrokerNotAvailable(f"{self.bootstrap} answered routes with none known")
            self._generation = response.generation
            self._have_routes = True
            # A broker the name server no longer lists has been noticed there: if it is
            # listed again, it registered again, so trust the listing.
            listed = self._fetched.addresses()
            now = time.monotonic()
            down_s = self.config.broker_down_ms / 1000
            self._down = {
                a: at for a, at in self._down.items() if a in listed and now - at < down_s
            }
            self._routes = self._fetched.without(self._down.keys())
            self._refresh_due = time.monotonic() + self._refresh_interval_s()
            return self._routes

    async def refresh_topics(self, topics: list[str]) -> RouteTable:
        """Fetch the routes of these topics only (and the broker list) and merge them into
        the known routes: what a client needs after creating a topic or before its first
        send to one, without fetching every topic's route (a cluster may have 100,000).
        An empty list fetches the broker list alone."""
        if self._closed:
            raise BrokerNotAvailable("the client is closed")
        timeout_ms = min(self.config.route_request_timeout_ms, self.config.request_timeout_ms)
        response = await self.call(
            self.bootstrap, GetRoutesRequest(topics=topics), GetRoutesResponse,
            timeout_ms=timeout_ms,
        )  # fmt: skip
        if not self._have_routes:
            # Nothing to merge into: the first fetch is a whole one (and then this answer
            # goes on top, for what it says of the topics asked, such as refusals).
            await self.refresh_routes(force=True)
        self._fetched.merge(response, topics)
        self._routes = self._fetched.without(self._down.keys())
        return self._routes

    async def topic_routes(self, topic: str) -> RouteTable:
        """The routes, with `topic`'s fetched now (it alone). TopicNotFound when no broker
        serves it, AuthorizationFailed when this user may not describe it."""
        routes = await self.refresh_topics([topic])
        if topic not in routes:
            raise routes.unknown(topic)
        return routes

    def mark_down(self, address: str, *, probe: bool = True) -> None:
        """The connection to `address` failed: leave it out of the routes until the name
        server agrees it is gone, or `broker_down_ms` passes, or (`probe`) a new
        connection to it opens (the broker lives; only that connection was lost); refresh
        the routes now."""
        if address not in self._fetched.addresses():
            return  # not a broker of the routes (the name server itself)
        self._conns.pop(address, None)
        self._down[address] = time.monotonic()
        self._routes = self._fetched.without(self._down.keys())
        self._refresh_due = 0.0
        if probe and address not in self._probes and not self._closed:
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                return  # looked up off the loop: the mark expires instead
            task = loop.create_task(self._probe(address))
            self._probes[address] = task
            task.add_done_callback(lambda _: self._probes.pop(address, None))

    async def _probe(self, address: str) -> None:
        with contextlib.suppress(TidemqError):  # still down: connection() keeps the mark
            await self.connection(address, probe=True)

    async def broker_for(self, topic: str, queue: int, offset: int | None = None) -> str:
        """The address of the broker serving the queue: its writer, or with `offset`, the
        one holding that offset (they differ only for a static topic's older links)."""

        def look(routes: RouteTable) -> str | None:
            if offset is None:
                return routes.broker_for(topic, queue)
            return routes.broker_for_offset(topic, queue, offset)

        routes = await self.refresh_routes()
        address = look(routes)
        if address is None and topic not in routes:
            routes = await self.refresh_topics([topic])  # new to this client: it alone
            if topic not in routes:  # the name server's answer, just now
                raise routes.unknown(topic)
            address = look(routes)
        if address is None:
            routes = await self.refresh_routes(force=True)
            address = look(routes)
        if address is None:
            # Marked down a moment ago and being probed (a lost connection may only have
            # been closed for idleness): the probe's answer decides.
            probe = self._probes.get(look(self._fetched) or "")
            if probe is not None:
                await asyncio.wait({probe})  # never raises for the probe's own outcome
                routes = self._routes
                address = look(routes)
        if address is None:
            if topic not in routes:
                raise routes.unknown(topic)
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
        from the broker that serves it. A static topic's queue: the range from its first
        link to its write end, the time looked up link by link, oldest first."""
        routes = await self.refresh_routes()
        chain = routes.chain(topic, queue)
        if chain is None:
            address = await self.broker_for(topic, queue)
            request = ListOffsetsRequest(topic=topic, queue=queue, timestamp_ms=timestamp_ms)
            return await self.call(address, request, ListOffsetsResponse)
        return await static_list_offsets(self, chain, topic, timestamp_ms)

    async def coordinator(self, group: str) -> str:
        """The address of the broker that coordinates `group`: rendezvous hashing of the
        group over the live brokers the name server lists (ADR 17), so every client
        agrees; a broker this client marked down still counts until the name server drops
        it (the group moves when the name server says, not when one client thinks so)."""
        routes = await self.refresh_routes()
        address = routes.group_coordinator(group)
        if not address:
            address = (await self.refresh_routes(force=True)).group_coordinator(group)
        if not address:
            raise BrokerNotAvailable(f"no live broker to coordinate consumer group {group!r}")
        return address

    async def group_call(
        self,
        group: str,
        request: msgspec.Struct,
        expected: type[T],
        *,
        timeout_ms: int | None = None,
    ) -> T:
        """A request to `group`'s coordinator, retried like `call` when the failure is
        retriable; each retry fetches the routes again and looks the coordinator up anew,
        so a request to a coordinator that went away goes to the group's next one once
        the name server has dropped it."""
        attempt = 0
        while True:
            address = await self.coordinator(group)
            try:
                header, _ = await self.request(address, request, expected, timeout_ms=timeout_ms)
                return header
            except TidemqError as exc:
                attempt += 1
                if not exc.retriable or attempt > self.config.retries:
                    raise
                await asyncio.sleep(self.backoff_s(attempt))
                with contextlib.suppress(TidemqError):  # the routes known serve meanwhile
                    await self.refresh_routes(force=True)

    async def security_writer(self) -> str:
        """The address of the broker that changes users and ACL entries, as the name
        server names it (ADR 15, ADR 20). Not a group's coordinator."""
        routes = await self.refresh_routes()
        if not routes.security_writer:
            routes = await self.refresh_routes(force=True)
        if not routes.security_writer:
            raise BrokerNotAvailable("no live broker to change users and ACL entries")
        return routes.security_writer

    async def any_broker(self) -> str:
        routes = await self.refresh_routes()
        if not routes.brokers:
            routes = await self.refresh_routes(force=True)
        if not routes.brokers:
            raise BrokerNotAvailable("no live broker is registered with the name server")
        return sorted(routes.brokers.values())[0]

    def invalidate(self, error: BaseException) -> None:
        """Errors that mean the route may be stale make the next lookup refresh it; after a
        lost connection, the brokers whose connections are closed are marked down."""
        if isinstance(
            error, (TopicNotFound, QueueNotFound, QueueMoved, BrokerNotAvailable, RequestTimeout)
        ):
            self._refresh_due = 0.0
        if isinstance(error, QueueMoved):
            # The known routes are wrong for that queue: the next lookup waits for fresh
            # ones instead of answering the old ones while refreshing in the background.
            self._stale = True
        if isinstance(error, BrokerNotAvailable):
            for address, conn in list(self._conns.items()):
                if not conn.is_open:
                    self.mark_down(address)

    async def close(self) -> None:
        self._closed = True
        tasks = [t for t in (self._refresher, *self._probes.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, TidemqError):
                await task
        for conn in self._conns.values():
            conn.close()
        self._conns.clear()
