"""A broker's heartbeat to its name servers: register every interval with its topics.

Registration and heartbeat are one request. With a `TopicJournal`, the first one to each
name server carries the whole topic list and the later ones only the topics changed since
the version that name server acknowledged (a beat with no change is a few bytes); a name
server that cannot apply a delta (it restarted, the broker lapsed there) says so, and
gets the whole list at once. Without a journal every beat carries the whole list.
Failures are logged and retried at the next interval; they never stop the broker.

The beat is the shorter of the broker's own interval and the one the name servers ask for
(their answer carries it), so a name server configured for fast failure detection gets
beats fast enough for its TTL. A failure is logged once when it starts and once when that
name server answers again, not at every beat. Each name server has a beat of its own: one
that does not answer holds up only its own.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Callable

from tidemq.cluster.membership import registration_fields, sign, unregistration_fields
from tidemq.cluster.name_server_sets import digest
from tidemq.cluster.security_link import (
    SecurityTables,
    cluster_login,
    confirm_change,
    follow,
    take_tables,
)
from tidemq.cluster.topic_journal import TopicJournal, TopicLookup
from tidemq.cluster.writer_lease import majority
from tidemq.core.clock import Clock, SystemClock
from tidemq.core.errors import BrokerNotAvailable, TidemqError, WriterFenced
from tidemq.net.client import ClientConnection
from tidemq.net.tasks import cancel_and_wait, completes_when_cancelled
from tidemq.protocol.commands import (
    Empty,
    GetRoutesRequest,
    GetRoutesResponse,
    RegisterBrokerRequest,
    RegisterBrokerResponse,
    StaticTopicReg,
    UnregisterBrokerRequest,
)
from tidemq.protocol.security_messages import SecuritySnapshot

__all__ = ["Registration"]

log = logging.getLogger(__name__)

_REQUEST_TIMEOUT_S = 5.0
_FRAME_BYTES_MAX = 16 << 20

TopicList = list[tuple[str, int, str, list[int]]]


class Registration:
    def __init__(
        self,
        broker_name: str,
        address: str,
        name_servers: tuple[str, ...],
        topics: Callable[[], TopicList],
        interval_ms: int,
        *,
        static_topics: Callable[[], list[StaticTopicReg]] = list,
        created_ms: int = 0,
        ssl_context: ssl.SSLContext | None = None,
        cluster_key: bytes | None = None,
        clock: Clock | None = None,
        journal: TopicJournal | None = None,
        lookup: TopicLookup | None = None,
        security: SecurityTables | None = None,
        leader_epoch: int = 0,
    ) -> None:
        """`ssl_context`: TLS to the name servers (tidemq.net.tls.client_context), None
        for plaintext. `cluster_key`: sign the registrations with it (membership.py).
        `journal` and `lookup` (one topic's registration now): beats carry changes only.
        `security`: the broker's users and ACL entries, whose version each registration
        reports and which the answers make it push or pull (security_link.py, ADR 15)."""
        self._security = security
        #: A replica group leader's epoch, on every registration (0: not a group).
        self._leader_epoch = leader_epoch
        self._journal = journal
        self._lookup = lookup
        #: Name server -> the version of the topic list it acknowledged.
        self._acked: dict[str, int] = {}
        self._name = broker_name
        self._cluster_key = cluster_key
        self._clock = clock or SystemClock()
        self._ssl_context = ssl_context
        self._created_ms = created_ms
        self._address = address
        self._servers = name_servers
        self._servers_digest = digest(name_servers)
        self._topics = topics
        self._static_topics = static_topics
        self._interval_s = interval_ms / 1000
        #: Name servers whose last registration failed (logged once until they answer).
        self._failing: set[str] = set()
        self._security_failing: set[str] = set()
        self._conns: dict[str, ClientConnection] = {}
        self._task: asyncio.Task[None] | None = None
        #: One beat per name server, each woken by `changed`: a name server that does
        #: not answer (stopped, cut off) holds up its own beat only, never the others'
        #: (the writer's lease needs a majority of them renewed in time, ADR 20).
        self._wakes = {server: asyncio.Event() for server in name_servers}
        #: Held while a connection to a name server opens (beats and confirmations
        #: share one connection per name server).
        self._opening: dict[str, asyncio.Lock] = {}

    async def start(self) -> None:
        """Register once (a broker that says it serves is in the routes: clients may use
        it at once; a name server that does not answer is logged, as at any beat), then
        beat in the background."""
        await self.register_once()
        self._task = asyncio.get_running_loop().create_task(self._run())

    def changed(self) -> None:
        """Topics changed: register now instead of at the next beat."""
        for wake in self._wakes.values():
            wake.set()

    async def _conn(self, server: str) -> ClientConnection:
        async with self._opening.setdefault(server, asyncio.Lock()):  # one per server
            return await self._open(server)

    async def _open(self, server: str) -> ClientConnection:
        conn = self._conns.get(server)
        if conn is None or not conn.is_open:
            conn = await ClientConnection.open(
                server, max_frame_bytes=_FRAME_BYTES_MAX, ssl_context=self._ssl_context
            )
            if self._cluster_key is not None:
                try:
                    await cluster_login(
                        conn, self._name, self._cluster_key, self._clock, _REQUEST_TIMEOUT_S
                    )
                except BaseException:
                    conn.close()
                    raise
            self._conns[server] = conn
        return conn

    def _full(self) -> RegisterBrokerRequest:
        journal = self._journal
        return self._signed(
            RegisterBrokerRequest(
                broker_name=self._name,
                address=self._address,
                topics=self._topics(),
                created_ms=self._created_ms,
                static_topics=self._static_topics(),
                epoch=journal.epoch if journal is not None else "",
                version=journal.version if journal is not None else 0,
            )
        )

    def _delta(self, server: str) -> RegisterBrokerRequest | None:
        """The changes since what `server` acknowledged; None: it needs the whole list."""
        if self._journal is None or self._lookup is None:
            return None
        delta = self._journal.delta(self._acked.get(server), self._lookup)
        if delta is None:
            return None
        return self._signed(
            RegisterBrokerRequest(
                broker_name=self._name,
                address=self._address,
                topics=delta.upserts,
                created_ms=self._created_ms,
                epoch=self._journal.epoch,
                version=delta.version,
                base_version=delta.base_version,
                removed=delta.removed,
            )
        )

    def _signed(self, request: RegisterBrokerRequest) -> RegisterBrokerRequest:
        request.leader_epoch = self._leader_epoch
        request.name_servers_digest = self._servers_digest
        if self._security is not None:
            request.security_counter, request.security_digest = self._security.version()
            request.writer_term = self._security.held_term()
        if self._cluster_key is not None:
            request.signed_ms, request.signature = sign(
                self._cluster_key,
                "REGISTER_BROKER",
                registration_fields(request),
                now_ms=self._clock.now_ms(),
            )
        return request

    async def register_once(self) -> None:
        """Register with every name server at once."""
        full: list[RegisterBrokerRequest] = []  # built once, for every server needing it

        def whole() -> RegisterBrokerRequest:
            if not full:
                full.append(self._full())
            return full[0]

        await asyncio.gather(*(self._register_with(server, whole) for server in self._servers))

    async def _register_with(self, server: str, whole: Callable[[], RegisterBrokerRequest]) -> None:
        request = self._delta(server)
        try:
            conn = await self._conn(server)
            # A writer's lease runs from when its registration was sent (ADR 20).
            sent_ms = self._clock.monotonic_ms()
            if request is not None:
                answer, _ = await conn.request(
                    request, RegisterBrokerResponse, timeout_s=_REQUEST_TIMEOUT_S
                )
            if request is None or not answer.accepted:
                request = whole()
                sent_ms = self._clock.monotonic_ms()
                answer, _ = await conn.request(
                    request, RegisterBrokerResponse, timeout_s=_REQUEST_TIMEOUT_S
                )
        except TidemqError as exc:
            self._acked.pop(server, None)  # what it holds is unknown: the whole list next
            if server not in self._failing:
                self._failing.add(server)
                log.warning("registering with name server %s failed: %s", server, exc)
            return
        self._acked[server] = request.version
        if server in self._failing:
            self._failing.discard(server)
            log.warning("registered with name server %s again", server)
        self._follow_interval(server, answer.heartbeat_interval_ms)
        if self._security is not None:
            await self._follow_security(server, conn, answer, sent_ms)

    async def _follow_security(
        self, server: str, conn: ClientConnection, answer: RegisterBrokerResponse, sent_ms: float
    ) -> None:
        """Push or pull users and ACL entries as the answer says; a failure is logged
        once until it succeeds again, and retried at the next beat."""
        assert self._security is not None
        try:
            await follow(
                conn,
                answer,
                self._security,
                broker_name=self._name,
                key=self._cluster_key,
                clock=self._clock,
                timeout_s=_REQUEST_TIMEOUT_S,
                sent_ms=sent_ms,
            )
        except TidemqError as exc:
            if server not in self._security_failing:
                self._security_failing.add(server)
                log.warning("users and ACL entries with name server %s: %s", server, exc)
            return
        self._security_failing.discard(server)

    async def confirm(self, snapshot: SecuritySnapshot, term: int) -> list[str]:
        """Ask every name server at once to confirm the writer's tables `snapshot`,
        made under writer `term` (docs/adr/0026); each is given `_REQUEST_TIMEOUT_S`.
        [] as soon as a majority confirmed (the others' answers are not awaited); else
        why each that did not, and if one refused under a newer term, the broker's
        tables replaced by that one's (the change is dropped here rather than pushed
        again)."""
        asks = {
            asyncio.ensure_future(self._confirm_one(server, snapshot, term)): server
            for server in self._servers
        }
        refusals: dict[str, tuple[str, bool]] = {}
        confirmed = 0
        try:
            for done in asyncio.as_completed(asks):
                why = await done
                if why is None:
                    confirmed += 1
                    if majority(confirmed, len(self._servers)):
                        return []
        finally:
            for ask in asks:
                ask.cancel()
        for ask, server in asks.items():
            why = ask.result()
            if why is not None:
                refusals[server] = why
        fenced = [server for server, (_, newer) in refusals.items() if newer]
        if fenced:
            await self._take_tables(fenced[0])
        return [f"{server}: {why}" for server, (why, _) in refusals.items()]

    async def _take_tables(self, server: str) -> None:
        assert self._security is not None
        try:
            conn = await self._conn(server)
            await take_tables(
                conn,
                self._security,
                self._name,
                key=self._cluster_key,
                clock=self._clock,
                timeout_s=_REQUEST_TIMEOUT_S,
            )
        except TidemqError as exc:
            log.warning("taking users and ACL entries from %s: %s", server, exc)

    async def _confirm_one(
        self, server: str, snapshot: SecuritySnapshot, term: int
    ) -> tuple[str, bool] | None:
        """None: `server` confirmed; else (why not, whether it refused under a newer
        writer term)."""
        try:
            conn = await self._conn(server)
            await confirm_change(
                conn,
                snapshot,
                term,
                broker_name=self._name,
                key=self._cluster_key,
                clock=self._clock,
                timeout_s=_REQUEST_TIMEOUT_S,
            )
        except WriterFenced as exc:
            return str(exc), True
        except TidemqError as exc:
            return f"{type(exc).__name__}: {exc}", False
        return None

    def _follow_interval(self, server: str, interval_ms: int) -> None:
        if 0 < interval_ms < self._interval_s * 1000:
            log.info("name server %s asks for a heartbeat every %d ms", server, interval_ms)
            self._interval_s = interval_ms / 1000

    async def queue_counts(self, topics: list[str]) -> dict[str, int]:
        """Queue counts of `topics` from the first name server that answers; a topic left
        out is unknown. Raises BrokerNotAvailable (retriable) when none answers: "no name
        server right now" must not read as "no such topic"."""
        for server in self._servers:
            try:
                conn = await self._conn(server)
                routes, _ = await conn.request(
                    GetRoutesRequest(topics=topics), GetRoutesResponse, timeout_s=_REQUEST_TIMEOUT_S
                )
            except TidemqError as exc:
                log.warning("route query to name server %s failed: %s", server, exc)
                continue
            return {r.topic: r.queues for r in routes.routes}
        raise BrokerNotAvailable(
            f"no name server answered a route query ({', '.join(self._servers)})"
        )

    async def live_brokers(self) -> dict[str, str]:
        """The live brokers (name -> address, this one included) from the first name
        server that answers; BrokerNotAvailable when none does. Each name server is
        given `_REQUEST_TIMEOUT_S`."""
        for server in self._servers:
            try:
                conn = await self._conn(server)
                routes, _ = await conn.request(
                    GetRoutesRequest(topics=[]), GetRoutesResponse, timeout_s=_REQUEST_TIMEOUT_S
                )
            except TidemqError as exc:
                log.warning("broker list query to name server %s failed: %s", server, exc)
                continue
            return dict(routes.brokers)
        raise BrokerNotAvailable(
            f"no name server answered a broker list query ({', '.join(self._servers)})"
        )

    async def _run(self) -> None:
        async with asyncio.TaskGroup() as beats:
            for server in self._servers:
                beats.create_task(self._beat(server))

    async def _beat(self, server: str) -> None:
        wake = self._wakes[server]
        while True:
            wake.clear()  # before: a change made during this registration wakes the next
            await self._register_with(server, self._full)
            try:
                async with asyncio.timeout(self._interval_s):
                    await wake.wait()
            except TimeoutError:
                pass

    @completes_when_cancelled
    async def stop(self) -> None:
        if self._task is not None:
            await cancel_and_wait(self._task)
        for server in self._servers:
            request = UnregisterBrokerRequest(
                broker_name=self._name, leader_epoch=self._leader_epoch
            )
            if self._cluster_key is not None:
                request.signed_ms, request.signature = sign(
                    self._cluster_key,
                    "UNREGISTER_BROKER",
                    unregistration_fields(request),
                    now_ms=self._clock.now_ms(),
                )
            try:
                conn = await self._conn(server)
                await conn.request(request, Empty, timeout_s=_REQUEST_TIMEOUT_S)
            except TidemqError as exc:
                log.info("unregistering from %s failed: %s", server, exc)
        for conn in self._conns.values():
            conn.close()
