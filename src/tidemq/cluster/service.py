"""The name server's request handlers, usable alone (`tidemq namesrv`) or inside a broker
process (`tidemq server`), where the broker registers itself without a network hop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from collections.abc import Callable
from typing import Any

from tidemq.cluster.membership import CLUSTER_SECRET_ENV, check_secret, registration_fields, verify
from tidemq.cluster.nameserver import (
    DEFAULT_BROKER_TTL_MS,
    DEFAULT_HEARTBEAT_INTERVAL_MS,
    DEFAULT_STALE_TOPIC_MS,
    NameServer,
)
from tidemq.core import limits
from tidemq.core.clock import Clock, SystemClock
from tidemq.core.errors import InvalidRequest
from tidemq.net.server import ServerLimits, TcpServer
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

__all__ = ["NAMESERVER_CODES", "NameServerHandlers", "NameServerService"]

log = logging.getLogger(__name__)

#: Name server frames are small: routes and registrations.
_NAMESERVER_FRAME_BYTES = 16 << 20
_SWEEP_INTERVAL_S = 1.0
#: A gap this much longer than the sweep interval between two looks at the clock means
#: this process was stopped (SIGSTOP, a VM pause), not that the brokers went silent.
_PAUSE_SLACK_MS = 1_500

NAMESERVER_CODES = frozenset(
    {
        RequestCode.GET_ROUTES,
        RequestCode.REGISTER_BROKER,
        RequestCode.UNREGISTER_BROKER,
        RequestCode.CLUSTER_STATUS,
    }
)
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
        #: Called before each request is handled (the standalone service's pause check).
        self.before_request: Callable[[], None] | None = None

    def handle(self, code: RequestCode, header: Any) -> Any:
        ns = self.nameserver
        if code is RequestCode.GET_ROUTES:
            assert isinstance(header, GetRoutesRequest)
            if header.topics is not None and len(header.topics) > _ROUTE_TOPICS_MAX:
                raise InvalidRequest(f"at most {_ROUTE_TOPICS_MAX} topics per route query")
            if header.topics is not None:
                return GetRoutesResponse(
                    routes=ns.routes(header.topics),
                    brokers=ns.brokers(),
                    coordinator=ns.coordinator(),
                )
            generation = ns.generation()
            unchanged = header.known == generation
            return GetRoutesResponse(
                routes=[] if unchanged else ns.routes(),
                brokers=ns.brokers(),
                coordinator=ns.coordinator(),
                generation=generation,
                unchanged=unchanged,
            )
        if code is RequestCode.REGISTER_BROKER:
            assert isinstance(header, RegisterBrokerRequest)
            self._verify(code.name, registration_fields(header), header)
            if header.base_version >= 0:
                accepted = ns.update(
                    header.broker_name,
                    header.address,
                    epoch=header.epoch,
                    base_version=header.base_version,
                    version=header.version,
                    topics=header.topics,
                    removed=header.removed,
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
            )
            return RegisterBrokerResponse(heartbeat_interval_ms=interval, broker_ttl_ms=ttl)
        if code is RequestCode.UNREGISTER_BROKER:
            assert isinstance(header, UnregisterBrokerRequest)
            self._verify(code.name, [header.broker_name], header)
            ns.unregister(header.broker_name)
            return Empty()
        assert isinstance(header, ClusterStatusRequest)
        return ClusterStatusResponse(brokers=ns.status())

    def _verify(
        self,
        kind: str,
        fields: list[object],
        header: RegisterBrokerRequest | UnregisterBrokerRequest,
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

    async def dispatch(self, frame: Frame, conn: object) -> tuple[Any, bytes]:
        code, header = decode_request(frame)
        if self.before_request is not None:
            self.before_request()
        if code not in NAMESERVER_CODES:
            raise InvalidRequest(f"{code.name} is a broker request; this is a name server")
        return self.handle(code, header), b""


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
    ) -> None:
        """`ssl_context`: the listener speaks TLS only (tidemq.net.tls.server_context).
        `cluster_secret`: brokers must sign their registrations with it."""
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
        self._server = TcpServer(
            self._handlers.dispatch,
            ServerLimits(max_frame_bytes=_NAMESERVER_FRAME_BYTES),
            ssl_context=ssl_context,
        )
        self._sweeper: asyncio.Task[None] | None = None
        self.address = ""

    async def start(self) -> str:
        host, port = await self._server.start(self._host, self._port)
        self.address = f"{host}:{port}"
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        tls = " (TLS)" if self._server.ssl_context is not None else ""
        signed = ", registrations signed" if self._cluster_key is not None else ""
        log.info("name server serving on %s%s%s", self.address, tls, signed)
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

    async def stop(self) -> None:
        await self._server.stop_accepting()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        await self._server.drain(5.0)
