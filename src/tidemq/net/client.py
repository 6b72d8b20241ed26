"""One client connection to one endpoint: send requests, match responses by correlation id.

A request waits at most its timeout (RequestTimeout: the outcome is unknown, which
idempotent producers make safe to retry). A lost connection fails every pending request
with BrokerNotAvailable; the pool opens a new connection on the next request. At most
`max_in_flight` requests are outstanding; more wait for a slot.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import Callable
from typing import TypeVar

import msgspec

from tidemq.core.errors import BrokerNotAvailable, RequestTimeout
from tidemq.protocol.codec import decode_response, encode_request
from tidemq.protocol.frame import Frame, FrameDecoder, FrameKind, RemoteProtocolError

__all__ = ["ClientConnection", "split_address"]

T = TypeVar("T")

_SOCKET_BUFFER_BYTES = 4 << 20


def split_address(address: str) -> tuple[str, int]:
    """'host:port' -> (host, port), with a clear error for anything else."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"address must be host:port, got {address!r}")
    return host.strip("[]"), int(port)


class _Protocol(asyncio.Protocol):
    def __init__(self, conn: ClientConnection) -> None:
        self._conn = conn

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER_BYTES)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_BUFFER_BYTES)

    def data_received(self, data: bytes) -> None:
        self._conn.on_data(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._conn.on_lost(exc)


class ClientConnection:
    def __init__(self, address: str, *, max_frame_bytes: int, max_in_flight: int) -> None:
        self.address = address
        self._decoder = FrameDecoder(max_frame_bytes)
        self._pending: dict[int, asyncio.Future[Frame]] = {}
        self._ids = itertools.count(1)
        self._slots = asyncio.Semaphore(max_in_flight)
        self._transport: asyncio.Transport | None = None
        self._closed_reason: str | None = None
        #: Called with frames the server initiates (transaction check-back).
        self.on_server_request: Callable[[Frame], None] | None = None

    @classmethod
    async def open(
        cls,
        address: str,
        *,
        max_frame_bytes: int,
        max_in_flight: int = 64,
        connect_timeout_s: float = 10.0,
    ) -> ClientConnection:
        host, port = split_address(address)
        conn = cls(address, max_frame_bytes=max_frame_bytes, max_in_flight=max_in_flight)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_timeout_s):
                transport, _ = await loop.create_connection(lambda: _Protocol(conn), host, port)
        except (OSError, TimeoutError) as exc:
            raise BrokerNotAvailable(f"cannot connect to {address}: {exc}") from None
        # No isinstance check: uvloop's transports do not subclass asyncio.Transport.
        conn._transport = transport
        return conn

    @property
    def is_open(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    async def request(
        self,
        request: msgspec.Struct,
        expected: type[T],
        body: bytes | memoryview = b"",
        *,
        timeout_s: float,
    ) -> tuple[T, bytes]:
        """Send a request; return the decoded response header and the raw body."""
        async with self._slots:
            transport = self._transport
            if transport is None or transport.is_closing():
                raise BrokerNotAvailable(
                    f"connection to {self.address} is closed: {self._closed_reason or 'closed'}"
                )
            corr = next(self._ids) & 0xFFFFFFFF
            future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
            self._pending[corr] = future
            transport.writelines(encode_request(request, corr, body))
            try:
                async with asyncio.timeout(timeout_s):
                    frame = await future
            except TimeoutError:
                raise RequestTimeout(
                    f"{type(request).__name__} to {self.address} got no answer in {timeout_s:.3g} s"
                ) from None
            finally:
                self._pending.pop(corr, None)
        return decode_response(frame, expected), frame.body

    def send_oneway(self, request: msgspec.Struct, body: bytes | memoryview = b"") -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.writelines(encode_request(request, 0, body, oneway=True))

    def send_frame(self, buffers: list[bytes | memoryview]) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.writelines(buffers)

    # ------------------------------------------------------------------ protocol callbacks

    def on_data(self, data: bytes) -> None:
        try:
            frames = self._decoder.feed(data)
        except RemoteProtocolError as exc:
            self._fail(f"protocol error from {self.address}: {exc}")
            return
        for frame in frames:
            if frame.kind is FrameKind.RESPONSE:
                future = self._pending.get(frame.correlation_id)
                if future is not None and not future.done():
                    future.set_result(frame)
            elif frame.kind is FrameKind.SERVER_REQUEST and self.on_server_request:
                self.on_server_request(frame)

    def on_lost(self, exc: Exception | None) -> None:
        self._closed_reason = str(exc) if exc else "closed by the broker"
        self._transport = None
        self._fail_pending()

    def _fail(self, reason: str) -> None:
        self._closed_reason = reason
        if self._transport is not None:
            self._transport.close()
        self._fail_pending()

    def _fail_pending(self) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(
                    BrokerNotAvailable(f"connection to {self.address} lost: {self._closed_reason}")
                )
        self._pending.clear()

    def close(self) -> None:
        self._fail("closed by the client")
