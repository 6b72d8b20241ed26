"""The accept loop and one asyncio Protocol per connection: it only moves bytes.

Frames are decoded by `tidemq.protocol.frame.FrameDecoder` and each request runs as its
own task through the dispatcher; responses are written in the order they complete (the
correlation id pairs them up). Limits: a connection has at most `max_in_flight` requests
running (beyond that the server stops reading from it: backpressure, not errors), the
server at most `max_connections` connections, and frames at most `max_frame_bytes`.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import msgspec

from tidemq.core.errors import BrokerNotAvailable, InvalidRequest, RequestTimeout, TidemqError
from tidemq.protocol.codec import (
    decode_response,
    encode_error,
    encode_response,
    encode_server_request,
)
from tidemq.protocol.frame import Frame, FrameDecoder, FrameKind, RemoteProtocolError

T = TypeVar("T")

__all__ = ["Dispatcher", "Reply", "ServerConnection", "ServerLimits", "TcpServer"]

log = logging.getLogger(__name__)

#: A handler's answer: the response header and an optional raw body.
Reply = tuple[Any, bytes | memoryview]
Dispatcher = Callable[[Frame, "ServerConnection"], Awaitable[Reply]]

#: Socket buffers: large enough that a 256-message batch is one or two syscalls.
_SOCKET_BUFFER_BYTES = 4 << 20


@dataclass(frozen=True, kw_only=True)
class ServerLimits:
    max_frame_bytes: int
    max_in_flight: int = 32
    max_connections: int = 1024


class ServerConnection(asyncio.BufferedProtocol):
    """One client connection. A BufferedProtocol: reads land in the frame decoder's buffers,
    and a large request (a batch) in a buffer of its own, which the commit log is written
    from: no copy of the payload between the socket and the page cache."""

    def __init__(self, server: TcpServer) -> None:
        self._server = server
        self._decoder = FrameDecoder(server.limits.max_frame_bytes)
        self._transport: asyncio.Transport | None = None
        self._in_flight = 0
        self._reading_paused = False
        self._writing_paused = False
        self.peer = "?"
        self.tasks: set[asyncio.Task[None]] = set()
        #: Server-to-client requests waiting for their answer, by correlation id.
        self._asks: dict[int, asyncio.Future[Frame]] = {}
        self._ask_ids = itertools.count(1)
        #: Called once when the connection closes (services forget what it registered).
        self.on_close: list[Callable[[], None]] = []

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Duck-typed: uvloop's transports do not subclass asyncio.Transport.
        self._transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if peer else "?"
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER_BYTES)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_BUFFER_BYTES)
        if not self._server.accept(self):
            log.warning("refusing %s: %d connections open", self.peer, self._server.connections)
            transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.forget(self)
        self._transport = None
        for future in self._asks.values():
            if not future.done():
                future.set_exception(BrokerNotAvailable(f"client {self.peer} disconnected"))
        self._asks.clear()
        callbacks, self.on_close = self.on_close, []
        for callback in callbacks:
            callback()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self._update_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._decoder.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            frames = self._decoder.buffer_updated(nbytes)
        except RemoteProtocolError as exc:
            log.info("closing %s: %s", self.peer, exc)
            self.close()
            return
        for frame in frames:
            if frame.kind is FrameKind.SERVER_RESPONSE:
                future = self._asks.get(frame.correlation_id)
                if future is not None and not future.done():
                    future.set_result(frame)
                continue
            if frame.kind not in (FrameKind.REQUEST, FrameKind.ONEWAY):
                self._server.on_client_frame(frame, self)
                continue
            self._in_flight += 1
            task = asyncio.get_running_loop().create_task(self._handle(frame))
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)
        self._update_reading()

    # ------------------------------------------------------------------ requests

    async def _handle(self, frame: Frame) -> None:
        try:
            try:
                header, body = await self._server.dispatcher(frame, self)
                out = encode_response(frame.code, frame.correlation_id, header, body)
            except TidemqError as exc:
                out = encode_error(frame.code, frame.correlation_id, _remote(exc))
            except Exception:
                log.exception("request %d from %s failed", frame.code, self.peer)
                err = TidemqError("internal error; see the broker log")
                out = encode_error(frame.code, frame.correlation_id, err)
            if frame.kind is FrameKind.REQUEST:
                self.send(out)
        finally:
            self._in_flight -= 1
            self._update_reading()

    async def ask(self, request: msgspec.Struct, expected: type[T], *, timeout_s: float) -> T:
        """Send a server-to-client request and wait for the client's answer (or its error,
        raised here). RequestTimeout after `timeout_s`; BrokerNotAvailable if the client
        goes away first."""
        if self._transport is None or self._transport.is_closing():
            raise BrokerNotAvailable(f"client {self.peer} disconnected")
        corr = next(self._ask_ids) & 0xFFFFFFFF
        future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._asks[corr] = future
        try:
            self.send(encode_server_request(request, corr))
            async with asyncio.timeout(timeout_s):
                frame = await future
        except TimeoutError:
            raise RequestTimeout(
                f"client {self.peer} did not answer {type(request).__name__} in {timeout_s:.3g} s"
            ) from None
        finally:
            self._asks.pop(corr, None)
        return decode_response(frame, expected)

    def send(self, buffers: list[bytes | memoryview]) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.writelines(buffers)

    def _update_reading(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        pause = self._writing_paused or self._in_flight >= self._server.limits.max_in_flight
        if pause and not self._reading_paused:
            transport.pause_reading()
            self._reading_paused = True
        elif not pause and self._reading_paused:
            transport.resume_reading()
            self._reading_paused = False

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


def _remote(exc: TidemqError) -> TidemqError:
    # A peer's undecodable request is, from the peer's side, an invalid request.
    if isinstance(exc, RemoteProtocolError):
        return InvalidRequest(str(exc))
    return exc


class TcpServer:
    """Listens on one address; hands every request frame to the dispatcher."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        limits: ServerLimits,
        *,
        on_client_frame: Callable[[Frame, ServerConnection], None] | None = None,
    ) -> None:
        self.dispatcher = dispatcher
        self.limits = limits
        self._on_client_frame = on_client_frame
        self._conns: set[ServerConnection] = set()
        self._server: asyncio.Server | None = None

    @property
    def connections(self) -> int:
        return len(self._conns)

    def accept(self, conn: ServerConnection) -> bool:
        if len(self._conns) >= self.limits.max_connections:
            return False
        self._conns.add(conn)
        return True

    def forget(self, conn: ServerConnection) -> None:
        self._conns.discard(conn)

    def on_client_frame(self, frame: Frame, conn: ServerConnection) -> None:
        if self._on_client_frame is not None:
            self._on_client_frame(frame, conn)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: ServerConnection(self), host, port, reuse_address=True, backlog=1024
        )
        sockname = self._server.sockets[0].getsockname()
        return sockname[0], sockname[1]

    async def stop_accepting(self) -> None:
        if self._server is not None:
            self._server.close()

    async def drain(self, timeout_s: float) -> None:
        """Wait for in-flight requests to finish (graceful shutdown), then close."""
        tasks = [t for c in self._conns for t in c.tasks]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        for conn in list(self._conns):
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()
