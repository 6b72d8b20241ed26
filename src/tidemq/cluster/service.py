"""The name server's request handlers, usable alone (`tidemq namesrv`) or inside a broker
process (`tidemq server`), where the broker registers itself without a network hop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from tidemq.cluster.nameserver import NameServer
from tidemq.core.clock import Clock, SystemClock
from tidemq.core.errors import InvalidRequest
from tidemq.net.server import ServerLimits, TcpServer
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

NAMESERVER_CODES = frozenset(
    {
        RequestCode.GET_ROUTES,
        RequestCode.REGISTER_BROKER,
        RequestCode.UNREGISTER_BROKER,
        RequestCode.CLUSTER_STATUS,
    }
)
#: Topics named in one route query.
_ROUTE_TOPICS_MAX = 10_000


class NameServerHandlers:
    def __init__(self, nameserver: NameServer) -> None:
        self.nameserver = nameserver

    def handle(self, code: RequestCode, header: Any) -> Any:
        ns = self.nameserver
        if code is RequestCode.GET_ROUTES:
            assert isinstance(header, GetRoutesRequest)
            if header.topics is not None and len(header.topics) > _ROUTE_TOPICS_MAX:
                raise InvalidRequest(f"at most {_ROUTE_TOPICS_MAX} topics per route query")
            return GetRoutesResponse(
                routes=ns.routes(header.topics),
                brokers=ns.brokers(),
                coordinator=ns.coordinator(),
            )
        if code is RequestCode.REGISTER_BROKER:
            assert isinstance(header, RegisterBrokerRequest)
            interval, ttl = ns.register(
                header.broker_name,
                header.address,
                list(header.topics),
                created_ms=header.created_ms,
            )
            return RegisterBrokerResponse(heartbeat_interval_ms=interval, broker_ttl_ms=ttl)
        if code is RequestCode.UNREGISTER_BROKER:
            assert isinstance(header, UnregisterBrokerRequest)
            ns.unregister(header.broker_name)
            return Empty()
        assert isinstance(header, ClusterStatusRequest)
        return ClusterStatusResponse(brokers=ns.status())

    async def dispatch(self, frame: Frame, conn: object) -> tuple[Any, bytes]:
        code, header = decode_request(frame)
        if code not in NAMESERVER_CODES:
            raise InvalidRequest(f"{code.name} is a broker request; this is a name server")
        return self.handle(code, header), b""


class NameServerService:
    """A standalone name server process's parts: the registry, its handlers, a listener,
    and the sweep that drops silent brokers."""

    def __init__(
        self,
        *,
        host: str = "127.0.0.1",
        port: int = 9876,
        broker_ttl_ms: int = 30_000,
        heartbeat_interval_ms: int = 10_000,
        clock: Clock | None = None,
    ) -> None:
        self._host = host
        self._port = port
        self.nameserver = NameServer(
            clock or SystemClock(),
            broker_ttl_ms=broker_ttl_ms,
            heartbeat_interval_ms=heartbeat_interval_ms,
        )
        self._handlers = NameServerHandlers(self.nameserver)
        self._server = TcpServer(
            self._handlers.dispatch, ServerLimits(max_frame_bytes=_NAMESERVER_FRAME_BYTES)
        )
        self._sweeper: asyncio.Task[None] | None = None
        self.address = ""

    async def start(self) -> str:
        host, port = await self._server.start(self._host, self._port)
        self.address = f"{host}:{port}"
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep())
        log.info("name server serving on %s", self.address)
        return self.address

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(_SWEEP_INTERVAL_S)
            for name in self.nameserver.expire():
                log.warning("broker %s stopped heartbeating; dropped from routes", name)

    async def stop(self) -> None:
        await self._server.stop_accepting()
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
        await self._server.drain(5.0)
