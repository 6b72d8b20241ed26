"""One client connection to one endpoint: send requests, match responses by correlation id.

A request waits at most its timeout (RequestTimeout: the outcome is unknown, which
idempotent producers make safe to retry). A lost connection fails every pending request
with BrokerNotAvailable; the pool opens a new connection on the next request. At most
`max_in_flight` requests are outstanding; more wait for a slot (first come, first served).

`request` is a coroutine; `request_nowait` is its callback twin for callers that must not
spend event-loop iterations on a task (the producer's one-message fast path): it writes the
request at once and calls back from the loop when the answer, the timeout or the loss of
the connection comes. Timeouts are loop timers (`call_later`), not a task or a timeout
context per request.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import socket
import ssl
from collections import deque
from collections.abc import Callable
from typing import TypeVar

import msgspec

from tidemq.core.errors import (
    AuthenticationFailed,
    BrokerNotAvailable,
    RequestTimeout,
    TidemqError,
)
from tidemq.core.scram import MECHANISM, ScramClient, ScramError
from tidemq.protocol.codec import decode_response, encode_request, error_from_frame
from tidemq.protocol.commands import (
    SaslAuthenticateRequest,
    SaslAuthenticateResponse,
    SaslHandshakeRequest,
    SaslHandshakeResponse,
)
from tidemq.protocol.frame import Frame, FrameDecoder, FrameKind, RemoteProtocolError

__all__ = ["ClientConnection", "split_address"]

T = TypeVar("T")

_SOCKET_BUFFER_BYTES = 4 << 20

#: How `request_nowait` reports: (the response frame, None) or (None, the error).
ResponseCallback = Callable[[Frame | None, BaseException | None], None]


class _Call:
    """One outstanding request: the future a `request` awaits, or a callback."""

    __slots__ = ("callback", "future", "timer")

    def __init__(
        self,
        future: asyncio.Future[Frame] | None,
        callback: ResponseCallback | None,
        timer: asyncio.TimerHandle,
    ) -> None:
        self.future = future
        self.callback = callback
        self.timer = timer


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
        self._pending: dict[int, _Call] = {}
        self._ids = itertools.count(1)
        #: Free request slots, and the requests waiting for one (each owns the slot it is
        #: handed: its future gets a result).
        self._free_slots = max_in_flight
        self._slot_waiters: deque[asyncio.Future[None]] = deque()
        #: Slots handed to waiters that have not run again yet. Until they have written
        #: their requests, no later request may take a freed slot: requests leave in the
        #: order they asked (a producer's sequence numbers depend on it).
        self._handed = 0
        self._transport: asyncio.Transport | None = None
        self._closed_reason: str | None = None
        #: The error the broker closed the connection with (a refusal naming its limit).
        self._closed_error: TidemqError | None = None
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
        ssl_context: ssl.SSLContext | None = None,
        username: str | None = None,
        password: str | None = None,
    ) -> ClientConnection:
        """Connect (and with `ssl_context`, finish the TLS handshake, verifying the
        server's certificate for the host in `address`) within `connect_timeout_s`.
        With `username`, log in with SCRAM-SHA-256 (`password`) before returning;
        AuthenticationFailed if the broker refuses, or proves not to hold the user's
        credentials."""
        host, port = split_address(address)
        conn = cls(address, max_frame_bytes=max_frame_bytes, max_in_flight=max_in_flight)
        loop = asyncio.get_running_loop()
        try:
            async with asyncio.timeout(connect_timeout_s):
                transport, _ = await loop.create_connection(
                    lambda: _Protocol(conn),
                    host,
                    port,
                    ssl=ssl_context,
                    server_hostname=host if ssl_context is not None else None,
                )
        except TimeoutError:
            raise BrokerNotAvailable(
                f"cannot connect to {address}: no connection in {connect_timeout_s:.3g} s"
            ) from None
        except OSError as exc:
            reason = str(exc) or type(exc).__name__
            in_tls = isinstance(exc, (ssl.SSLError, ConnectionResetError, ConnectionAbortedError))
            if ssl_context is not None and in_tls:
                if not isinstance(exc, ssl.SSLError):
                    # A reset during the handshake, with no TLS alert to say why.
                    reason = (
                        "the server closed the connection (a plaintext listener, or a TLS "
                        "version it refuses)"
                    )
                reason = f"TLS handshake failed: {reason}"
            raise BrokerNotAvailable(f"cannot connect to {address}: {reason}") from None
        # No isinstance check: uvloop's transports do not subclass asyncio.Transport.
        conn._transport = transport
        if username is not None:
            try:
                await conn._login(username, password or "", connect_timeout_s)
            except BaseException:
                conn.close()
                raise
        return conn

    async def _login(self, username: str, password: str, timeout_s: float) -> None:
        """The SCRAM-SHA-256 exchange (docs/design/security.md), through
        `tidemq.core.scram.ScramClient`."""
        try:
            client = ScramClient(username, password, random_bytes=os.urandom)
        except ScramError as exc:
            raise AuthenticationFailed(f"cannot log in as {username!r}: {exc}") from None
        # The broker waits about a second before it answers a failed login.
        timeout_s = max(timeout_s, 5.0)
        try:
            offered, _ = await self.request(
                SaslHandshakeRequest(mechanism=MECHANISM),
                SaslHandshakeResponse,
                timeout_s=timeout_s,
            )
            if MECHANISM not in offered.mechanisms:
                raise AuthenticationFailed(
                    f"{self.address} does not offer {MECHANISM} (offers {offered.mechanisms})"
                )
            first, _ = await self.request(
                SaslAuthenticateRequest(message=client.first()),
                SaslAuthenticateResponse,
                timeout_s=timeout_s,
            )
            final, _ = await self.request(
                SaslAuthenticateRequest(message=client.receive_server_first(first.message)),
                SaslAuthenticateResponse,
                timeout_s=timeout_s,
            )
            client.receive_server_final(final.message)
        except ScramError as exc:
            raise AuthenticationFailed(f"login to {self.address} failed: {exc}") from None

    @property
    def is_open(self) -> bool:
        return self._transport is not None and not self._transport.is_closing()

    @property
    def has_free_slot(self) -> bool:
        """Whether a request sent now would go out at once (not wait for a slot)."""
        return self._slot_free_now()

    def _slot_free_now(self) -> bool:
        return self._free_slots > 0 and not self._slot_waiters and not self._handed

    async def request(
        self,
        request: msgspec.Struct,
        expected: type[T],
        body: bytes | memoryview = b"",
        *,
        timeout_s: float,
    ) -> tuple[T, bytes]:
        """Send a request; return the decoded response header and the raw body."""
        if self._slot_free_now():
            self._free_slots -= 1
        else:
            await self._wait_for_slot()
        loop = asyncio.get_running_loop()
        future: asyncio.Future[Frame] = loop.create_future()
        corr = self._start(request, body, timeout_s, future, None)  # releases the slot if it raises
        try:
            frame = await future
        except asyncio.CancelledError:
            call = self._pending.pop(corr, None)
            if call is not None:
                call.timer.cancel()
                self._release_slot()
            raise
        body = frame.body
        # This connection reads with FrameDecoder.feed, whose bodies are always bytes.
        assert isinstance(body, bytes)
        return decode_response(frame, expected), body

    def request_nowait(
        self,
        request: msgspec.Struct,
        body: bytes | memoryview,
        *,
        timeout_s: float,
        callback: ResponseCallback,
    ) -> None:
        """Send a request now, without waiting for a slot (check `has_free_slot` first:
        with none free this raises RuntimeError). `callback(frame, None)` gets the
        response frame (decode it with `decode_response`), `callback(None, error)` a
        RequestTimeout or BrokerNotAvailable; exactly once, from the event loop, never
        from within this call. Raises BrokerNotAvailable, without calling back, when the
        connection is closed."""
        if not self._slot_free_now():
            raise RuntimeError(f"no free request slot on the connection to {self.address}")
        self._free_slots -= 1
        self._start(request, body, timeout_s, None, callback)

    def _start(
        self,
        request: msgspec.Struct,
        body: bytes | memoryview,
        timeout_s: float,
        future: asyncio.Future[Frame] | None,
        callback: ResponseCallback | None,
    ) -> int:
        """Register and write a request that holds a slot; its correlation id."""
        try:
            transport = self._transport
            if transport is None or transport.is_closing():
                if self._closed_error is not None:
                    raise type(self._closed_error)(str(self._closed_error))
                raise BrokerNotAvailable(
                    f"connection to {self.address} is closed: {self._closed_reason or 'closed'}"
                )
            corr = next(self._ids) & 0xFFFFFFFF
            if corr == 0:  # after 2**32 requests: 0 is the broker's (a refusal)
                corr = next(self._ids) & 0xFFFFFFFF
            buffers = encode_request(request, corr, body)
        except BaseException:
            self._release_slot()
            raise
        loop = asyncio.get_running_loop()
        timer = loop.call_later(timeout_s, self._expire, corr, type(request).__name__, timeout_s)
        self._pending[corr] = _Call(future, callback, timer)
        transport.writelines(buffers)
        return corr

    async def _wait_for_slot(self) -> None:
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._slot_waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self._handed -= 1
                self._release_slot()  # handed a slot, then cancelled before using it
            raise
        self._handed -= 1  # the caller writes its request now, before any later one

    def _release_slot(self) -> None:
        while self._slot_waiters:
            waiter = self._slot_waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes to the first request waiting
                self._handed += 1
                return
        self._free_slots += 1

    def _finish(self, call: _Call, frame: Frame | None, error: BaseException | None) -> None:
        """Complete a call removed from `_pending`: free its timer and slot, report."""
        call.timer.cancel()
        self._release_slot()
        if call.callback is not None:
            try:
                call.callback(frame, error)
            except Exception as exc:  # a callback's bug must not break the connection
                asyncio.get_running_loop().call_exception_handler(
                    {"message": f"request callback failed on {self.address}", "exception": exc}
                )
            return
        future = call.future
        assert future is not None
        if future.done():
            return
        if frame is not None:
            future.set_result(frame)
        else:
            future.set_exception(error or BrokerNotAvailable(f"no answer from {self.address}"))

    def _expire(self, corr: int, what: str, timeout_s: float) -> None:
        call = self._pending.pop(corr, None)
        if call is not None:
            self._finish(
                call,
                None,
                RequestTimeout(f"{what} to {self.address} got no answer in {timeout_s:.3g} s"),
            )

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
            if frame.kind is FrameKind.RESPONSE and frame.correlation_id == 0 and frame.is_error:
                # Correlation id 0 is never a request's: the broker refuses the connection
                # (a connection limit) and closes it.
                error = error_from_frame(frame)
                self._closed_error = type(error)(f"{self.address}: {error}")
                self._fail(str(self._closed_error))
                return
            if frame.kind is FrameKind.RESPONSE:
                call = self._pending.pop(frame.correlation_id, None)
                if call is not None:
                    self._finish(call, frame, None)
            elif frame.kind is FrameKind.SERVER_REQUEST and self.on_server_request:
                self.on_server_request(frame)

    def on_lost(self, exc: Exception | None) -> None:
        if self._closed_error is None:
            self._closed_reason = str(exc) if exc else "closed by the broker"
        self._transport = None
        self._fail_pending()

    def _fail(self, reason: str) -> None:
        self._closed_reason = reason
        if self._transport is not None:
            self._transport.close()
        self._fail_pending()

    def _fail_pending(self) -> None:
        calls = list(self._pending.values())
        self._pending.clear()
        for call in calls:
            error = self._closed_error
            self._finish(
                call,
                None,
                type(error)(str(error))
                if error is not None
                else BrokerNotAvailable(
                    f"connection to {self.address} lost: {self._closed_reason}"
                ),
            )

    def close(self) -> None:
        self._fail("closed by the client")
