"""The name server's request handlers, usable alone (`tidemq namesrv`) or inside a broker
process (`tidemq server`), where the broker registers itself without a network hop."""

from __future__ import annotations

import asyncio
import logging
import os
import ssl
from collections.abc import Callable, Iterable
from typing import Any

from tidemq.cluster.membership import (
    CLUSTER_SECRET_ENV,
    check_secret,
    registration_fields,
    unregistration_fields,
    verify,
)
from tidemq.cluster.name_server_sets import NameServerSets
from tidemq.cluster.nameserver import (
    DEFAULT_BROKER_TTL_MS,
    DEFAULT_HEARTBEAT_INTERVAL_MS,
    DEFAULT_STALE_TOPIC_MS,
    NameServer,
)
from tidemq.cluster.push_checks import PushChecks
from tidemq.cluster.route_acls import RouteAcls
from tidemq.cluster.security_holder import SecurityHolder
from tidemq.cluster.security_link import (
    PULL_KIND,
    PUSH_KIND,
    check_cluster_login,
    login_fields,
    push_fields,
)
from tidemq.core import limits
from tidemq.core.clock import Clock, SystemClock
from tidemq.core.errors import (
    AuthenticationFailed,
    ConfigError,
    InvalidRequest,
    Unsupported,
)
from tidemq.net.login import LoginGate
from tidemq.net.server import ServerConnection, ServerLimits, TcpServer
from tidemq.net.tasks import cancel_and_wait, completes_when_cancelled
from tidemq.net.tls import is_loopback
from tidemq.protocol.codec import decode_request
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.commands import (
    ClusterStatusRequest,
    ClusterStatusResponse,
    Empty,
    GetRoutesRequest,
    GetRoutesResponse,
    RegisterBrokerRequest,
    RegisterBrokerResponse,
    UnregisterBrokerRequest,
)
from tidemq.protocol.frame import Frame
from tidemq.protocol.security_messages import (
    SecurityPullRequest,
    SecurityPushRequest,
    SecurityPushResponse,
)

__all__ = ["NAMESERVER_CODES", "NameServerHandlers", "NameServerService"]

log = logging.getLogger(__name__)

#: Name server frames are small: routes and registrations.
_NAMESERVER_FRAME_BYTES = 16 << 20
_SWEEP_INTERVAL_S = 1.0
_MOCK_SECRET_BYTES = 32
#: A gap this much longer than the sweep interval between two looks at the clock means
#: this process was stopped (SIGSTOP, a VM pause), not that the brokers went silent.
_PAUSE_SLACK_MS = 1_500

NAMESERVER_CODES = frozenset(
    {
        RequestCode.GET_ROUTES,
        RequestCode.REGISTER_BROKER,
        RequestCode.UNREGISTER_BROKER,
        RequestCode.CLUSTER_STATUS,
        RequestCode.SECURITY_PUSH,
        RequestCode.SECURITY_PULL,
    }
)
#: Brokers' requests (signed with the cluster secret when the name server has one).
BROKER_CODES = frozenset(
    {
        RequestCode.REGISTER_BROKER,
        RequestCode.UNREGISTER_BROKER,
        RequestCode.SECURITY_PUSH,
        RequestCode.SECURITY_PULL,
    }
)
_SASL_CODES = frozenset({RequestCode.SASL_HANDSHAKE, RequestCode.SASL_AUTHENTICATE})
#: Requests that carry the users' and ACLs' tables.
_TABLE_CODES = frozenset({RequestCode.SECURITY_PUSH, RequestCode.SECURITY_PULL})
#: Topics named in one route query.
_ROUTE_TOPICS_MAX = limits.MAX_ROUTE_TOPICS


class NameServerHandlers:
    def __init__(
        self,
        nameserver: NameServer,
        *,
        cluster_key: bytes | None = None,
        clock: Clock | None = None,
    ) -> None:
        """`cluster_key`: registrations must be signed with it (membership.py); None:
        anyone who reaches the listener may register (protect it with mutual TLS)."""
        self.nameserver = nameserver
        self._cluster_key = cluster_key
        self._clock = clock or SystemClock()
        #: The cluster's users and ACL entries as the brokers push them (ADR 15).
        self.security = SecurityHolder()
        #: Which name servers each broker registers with (ADR 26).
        self.name_server_sets = NameServerSets()
        self.push_checks = PushChecks(nameserver, self.security, self.name_server_sets)
        #: The login of client connections (None: the name server asks for none; then
        #: with a cluster key, `cluster_gate` takes brokers' logins all the same).
        self.gate: LoginGate | None = None
        self.cluster_gate: LoginGate | None = None
        #: Called before each request is handled (the standalone service's pause check).
        self.before_request: Callable[[], None] | None = None
        #: Routes cut by the ACLs (a standalone name server with authorization on).
        self.route_acls: RouteAcls | None = None

    def handle(self, code: RequestCode, header: Any) -> Any:
        ns = self.nameserver
        if code is RequestCode.GET_ROUTES:
            assert isinstance(header, GetRoutesRequest)
            return self._routes(header)
        if code is RequestCode.REGISTER_BROKER:
            assert isinstance(header, RegisterBrokerRequest)
            self._verify(code.name, registration_fields(header), header)
            return self._security_answer(header, self._register(header))
        if code is RequestCode.UNREGISTER_BROKER:
            assert isinstance(header, UnregisterBrokerRequest)
            self._verify(code.name, unregistration_fields(header), header)
            ns.unregister(header.broker_name, leader_epoch=header.leader_epoch)
            return Empty()
        if code is RequestCode.SECURITY_PUSH:
            assert isinstance(header, SecurityPushRequest)
            self._verify(PUSH_KIND, push_fields(header), header)
            self.push_checks.check(header)
            return SecurityPushResponse(accepted=self.security.offer(header.snapshot))
        if code is RequestCode.SECURITY_PULL:
            assert isinstance(header, SecurityPullRequest)
            self._verify(PULL_KIND, login_fields(header.broker_name), header)
            return self.security.snapshot
        assert isinstance(header, ClusterStatusRequest)
        return self._status()

    def _routes(self, header: GetRoutesRequest) -> GetRoutesResponse:
        ns = self.nameserver
        if header.topics is not None and len(header.topics) > _ROUTE_TOPICS_MAX:
            raise InvalidRequest(f"at most {_ROUTE_TOPICS_MAX} topics per route query")
        if header.topics is not None:
            return GetRoutesResponse(
                routes=ns.routes(header.topics),
                brokers=ns.brokers(),
                coordinator=ns.security_writer(),
            )
        generation = ns.generation()
        unchanged = header.known == generation
        return GetRoutesResponse(
            routes=[] if unchanged else ns.routes(),
            brokers=ns.brokers(),
            coordinator=ns.security_writer(),
            generation=generation,
            unchanged=unchanged,
        )

    def _register(self, header: RegisterBrokerRequest) -> RegisterBrokerResponse:
        ns = self.nameserver
        if header.base_version >= 0:
            accepted = ns.update(
                header.broker_name,
                header.address,
                epoch=header.epoch,
                base_version=header.base_version,
                version=header.version,
                topics=header.topics,
                removed=header.removed,
                leader_epoch=header.leader_epoch,
            )
            interval, ttl = ns.timing()
            return RegisterBrokerResponse(
                heartbeat_interval_ms=interval, broker_ttl_ms=ttl, accepted=accepted
            )
        interval, ttl = ns.register(
            header.broker_name,
            header.address,
            list(header.topics),
            created_ms=header.created_ms,
            static_topics=header.static_topics,
            epoch=header.epoch,
            version=header.version,
            leader_epoch=header.leader_epoch,
        )
        return RegisterBrokerResponse(heartbeat_interval_ms=interval, broker_ttl_ms=ttl)

    def _security_answer(
        self, header: RegisterBrokerRequest, answer: RegisterBrokerResponse
    ) -> RegisterBrokerResponse:
        """A registration answer with what the name server knows of users and ACLs."""
        self.push_checks.registered(header.broker_name, header.name_servers_digest)
        version = (header.security_counter, header.security_digest)
        holder = self.security
        now_ms = self._clock.monotonic_ms()
        answer.security_push = holder.report(header.broker_name, version, now_ms)
        answer.security_counter, answer.security_digest = holder.held
        self.nameserver.report_writer(
            header.broker_name, header.writer_term, header.security_counter
        )
        answer.security_writer, answer.writer_term = self.nameserver.security_writer_term()
        return answer

    def _status(self) -> ClusterStatusResponse:
        brokers = self.nameserver.status()
        writer, term = self.nameserver.security_writer_term()
        for b in brokers:
            b.security_counter, b.security_digest = self.security.reported(b.name)
            if b.address == writer:
                b.writer_term = term
        counter, digest = self.security.held
        return ClusterStatusResponse(
            brokers=brokers, security_counter=counter, security_digest=digest
        )

    def _verify(
        self,
        kind: str,
        fields: list[object],
        header: RegisterBrokerRequest
        | UnregisterBrokerRequest
        | SecurityPushRequest
        | SecurityPullRequest,
    ) -> None:
        if self._cluster_key is not None:
            verify(
                self._cluster_key,
                kind,
                fields,
                signed_ms=header.signed_ms,
                signature=header.signature,
                now_ms=self._clock.now_ms(),
            )

    async def dispatch(self, frame: Frame, conn: ServerConnection) -> tuple[Any, bytes]:
        if self.gate is not None and conn.principal is None:
            # Logins on: before login only SASL_HANDSHAKE and SASL_AUTHENTICATE.
            return await self.gate.before_login(frame, conn), b""
        code, header = decode_request(frame)
        if self.before_request is not None:
            self.before_request()
        if code in _SASL_CODES:
            return await self._sasl(frame, code, conn), b""
        if code not in NAMESERVER_CODES:
            raise InvalidRequest(f"{code.name} is a broker request; this is a name server")
        if code in _TABLE_CODES and self._cluster_key is None and not is_loopback(conn.host):
            # Unsigned, the tables (salted keys included) would go to anyone who asks.
            raise AuthenticationFailed(
                f"{code.name} refused: users and ACL entries are shared only with a cluster "
                f"secret ({CLUSTER_SECRET_ENV}) or over loopback"
            )
        acls = self.route_acls
        if acls is not None and code is RequestCode.CLUSTER_STATUS:
            acls.check_status(conn.principal, conn.host)
        if acls is None or code is not RequestCode.GET_ROUTES:
            return self.handle(code, header), b""
        header.known = acls.token(header.known, conn.principal, conn.host)
        return acls.filter(header, self.handle(code, header), conn.principal, conn.host), b""

    async def _sasl(self, frame: Frame, code: RequestCode, conn: ServerConnection) -> Any:
        """SASL on a connection that needs no login: a broker's cluster login (taken when
        the name server has a cluster key); a user's login is Unsupported, as on a broker
        without logins."""
        if conn.principal is not None:
            raise InvalidRequest(f"{code.name}: this connection is authenticated already")
        if self.cluster_gate is None:
            raise Unsupported(
                f"{code.name}: this name server does not authenticate (broker.auth_enabled "
                "is off and it has no cluster secret)"
            )
        return await self.cluster_gate.before_login(frame, conn)

    def check_cluster_login(self, message: bytes) -> str:
        """A broker's `ClusterLogin`: its principal, or AuthenticationFailed."""
        assert self._cluster_key is not None
        return check_cluster_login(self._cluster_key, message, self._clock)


class NameServerService:
    """A standalone name server process's parts: the registry, its handlers, a listener,
    and the sweep that drops silent brokers.

    Pauses: the sweep looks at the clock every second and every request looks too; a gap
    much longer than that means this process was stopped, and the brokers' leases are
    extended by the gap before anything is answered, so a paused name server does not
    drop every broker (and report their topics stale) the moment it resumes."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 9876,
        broker_ttl_ms: int = DEFAULT_BROKER_TTL_MS,
        heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS,
        stale_topic_ms: int = DEFAULT_STALE_TOPIC_MS,
        clock: Clock | None = None,
        ssl_context: ssl.SSLContext | None = None,
        cluster_secret: str | None = None,
        auth_enabled: bool = False,
        authorization_enabled: bool = False,
        super_users: Iterable[str] = (),
    ) -> None:
        """`ssl_context`: the listener speaks TLS only (tidemq.net.tls.server_context).
        `cluster_secret`: brokers must sign their registrations with it. `auth_enabled`:
        clients log in with SCRAM-SHA-256 as users of the cluster, which the name server
        learns from the brokers (ADR 15; needs `cluster_secret`). `authorization_enabled`:
        a user learns only the routes of the topics the cluster's ACL entries let it
        describe (route_acls.py; needs `auth_enabled`); `super_users` (user names) see
        every route."""
        if auth_enabled and cluster_secret is None:
            raise ConfigError(
                "a name server with broker.auth_enabled needs the cluster secret "
                f"({CLUSTER_SECRET_ENV}): it learns the users from brokers that sign with it"
            )
        if authorization_enabled and not auth_enabled:
            raise ConfigError(
                "broker.authorization_enabled needs broker.auth_enabled: ACL entries name "
                "users, and without login every client is anonymous"
            )
        self._host = host
        self._port = port
        self._clock = clock or SystemClock()
        self.nameserver = NameServer(
            self._clock,
            broker_ttl_ms=broker_ttl_ms,
            heartbeat_interval_ms=heartbeat_interval_ms,
            stale_topic_ms=stale_topic_ms,
        )
        self._last_look_ms = self._clock.monotonic_ms()
        #: Pauses of this process noticed so far, and their total length.
        self.pauses = 0
        self.paused_ms_total = 0.0
        self._cluster_key = None if cluster_secret is None else check_secret(cluster_secret)
        self._handlers = NameServerHandlers(
            self.nameserver, cluster_key=self._cluster_key, clock=self._clock
        )
        self._handlers.before_request = self.check_pause
        if authorization_enabled:
            self._handlers.route_acls = RouteAcls(
                self._handlers.security, super_users=[f"User:{u}" for u in super_users]
            )
        #: The users and ACL entries this name server holds (pushed by the brokers).
        self.security = self._handlers.security
        self._auth_enabled = auth_enabled
        self._set_up_logins()
        self._server = TcpServer(
            self._handlers.dispatch,
            ServerLimits(max_frame_bytes=_NAMESERVER_FRAME_BYTES),
            ssl_context=ssl_context,
            auth_required=auth_enabled,
        )
        self._sweeper: asyncio.Task[None] | None = None
        self.address = ""

    def _set_up_logins(self) -> None:
        """Users' logins (with auth_enabled) and brokers' (with a cluster key)."""
        handlers = self._handlers
        cluster_login = None if self._cluster_key is None else handlers.check_cluster_login
        # Unknown users' fake credentials derive from this; kept for the process only (a
        # name server keeps nothing on disk).
        mock_secret = os.urandom(_MOCK_SECRET_BYTES)
        if self._auth_enabled:
            handlers.gate = LoginGate(
                handlers.security.credentials,
                mock_secret=mock_secret,
                clock=self._clock,
                what="name server",
                cluster_login=cluster_login,
                not_ready=self._users_unknown,
            )
        elif cluster_login is not None:
            handlers.cluster_gate = LoginGate(
                lambda _: None,
                mock_secret=mock_secret,
                clock=self._clock,
                what="name server",
                cluster_login=cluster_login,
            )

    def _users_unknown(self) -> str | None:
        if self._handlers.security.current:
            return None
        return (
            "it has not learned the cluster's users from a broker since it started (a "
            "broker's next registration brings them); retry"
        )

    async def start(self) -> str:
        host, port = await self._server.start(self._host, self._port)
        self.address = f"{host}:{port}"
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        tls = " (TLS)" if self._server.ssl_context is not None else ""
        signed = ", registrations signed" if self._cluster_key is not None else ""
        auth = " (SCRAM-SHA-256 authentication)" if self._auth_enabled else ""
        if self._handlers.route_acls is not None:
            auth += " (routes cut by the ACLs)"
        log.info("name server serving on %s%s%s%s", self.address, tls, signed, auth)
        if self._cluster_key is None and not is_loopback(host):
            log.warning(
                "name server on %s without a cluster secret: anyone who reaches it may "
                "register a broker (set %s, or require client certificates)",
                self.address,
                CLUSTER_SECRET_ENV,
            )
        return self.address

    def check_pause(self) -> None:
        """Extend the brokers' leases by the time this process was stopped, if it was."""
        now = self._clock.monotonic_ms()
        gap = now - self._last_look_ms
        self._last_look_ms = now
        paused = gap - _SWEEP_INTERVAL_S * 1000
        if paused > _PAUSE_SLACK_MS:
            self.pauses += 1
            self.paused_ms_total += paused
            self.nameserver.extend_leases(paused)
            log.warning(
                "name server was stopped for about %d ms; brokers' leases extended by that",
                paused,
            )

    async def _sweep(self) -> None:
        self._last_look_ms = self._clock.monotonic_ms()
        while True:
            await asyncio.sleep(_SWEEP_INTERVAL_S)
            self.check_pause()
            for name in self.nameserver.expire():
                log.warning("broker %s stopped heartbeating; dropped from routes", name)

    @completes_when_cancelled
    async def stop(self) -> None:
        await self._server.stop_accepting()
        if self._sweeper is not None:
            await cancel_and_wait(self._sweeper)
        await self._server.drain(5.0)
