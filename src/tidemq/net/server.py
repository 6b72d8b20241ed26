"""The accept loop and one asyncio Protocol per connection: it only moves bytes.

Frames are decoded by `tidemq.protocol.frame.FrameDecoder` and each request runs as its
own task through the dispatcher; responses are written in the order they complete (the
correlation id pairs them up). A request the server's `answer_now` can answer without
waiting (a one-message produce with async flush) is answered from the protocol callback
instead, with no task: only when nothing of that connection is running, so it cannot
overtake an earlier request. What one client can make the server hold or do is
bounded (`ServerLimits`; the table is in docs/design/protocol.md, "Connection limits"):

* requests: at most `max_in_flight` run per connection. Decoded requests beyond that wait
  in the connection's queue, and the connection stops reading (transport.pause_reading)
  while running + waiting reach the limit: backpressure through TCP, not errors. Each
  connection starts at most `requests_per_turn` requests per event-loop turn, so a
  pipelining client takes turns with the others.
* bytes in: requests received and not yet answered (partial frames, waiting, running)
  count against `max_inbound_bytes` over all connections; above it, connections holding
  such bytes stop reading.
* bytes out: FETCH answers are charged to a `ResponseBudget` (per connection and total)
  until they have left the write buffer; a connection whose write buffer is above
  `write_buffer_high_bytes` stops reading.
* time: a started frame must complete within `frame_read_timeout_ms`, a connection with
  nothing in flight is closed after `idle_timeout_ms`, and one whose write buffer does not
  shrink for `write_stall_timeout_ms` is closed. One periodic sweep checks them (`sweep`).
* connections: at most `max_connections`, `max_connections_per_address` from one IP. A
  refused client gets an error frame naming the limit before the close.
* authentication (`TcpServer(auth_required=True)`, docs/design/security.md): until the
  dispatcher calls `ServerConnection.authenticated`, frames are limited to
  `PREAUTH_MAX_FRAME_BYTES` (a larger one closes the connection). Whatever request is
  answered with AuthenticationFailed, the connection is closed after that answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
import ssl
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

import msgspec

from tidemq.core.clock import Clock, SystemClock
from tidemq.core.errors import (
    AuthenticationFailed,
    BrokerNotAvailable,
    InvalidRequest,
    RequestTimeout,
    TidemqError,
)
from tidemq.net.budget import ConnectionBudget
from tidemq.net.ledger import ConnectionLedger, ServerLimits
from tidemq.net.tasks import cancel_and_wait, completes_when_cancelled
from tidemq.net.tls import is_loopback
from tidemq.protocol.codec import (
    decode_response,
    encode_error,
    encode_response,
    encode_server_request,
)
from tidemq.protocol.frame import Frame, FrameDecoder, FrameKind, RemoteProtocolError

T = TypeVar("T")

__all__ = [
    "PREAUTH_MAX_FRAME_BYTES",
    "AnswerNow",
    "Dispatcher",
    "Reply",
    "ServerConnection",
    "ServerLimits",
    "TcpServer",
]

log = logging.getLogger(__name__)

#: A handler's answer: the response header and an optional raw body.
Reply = tuple[Any, bytes | memoryview]
Dispatcher = Callable[[Frame, "ServerConnection"], Awaitable[Reply]]
#: The response header for a request answered at once, or None: it goes to the dispatcher.
#: Raises what a handler raises (a TidemqError is answered as an error).
AnswerNow = Callable[[Frame, "ServerConnection"], Any]

#: Socket buffers: large enough that a 256-message batch is one or two syscalls.
_SOCKET_BUFFER_BYTES = 4 << 20
#: What a decoded frame costs besides its header and body (the Frame and bytes objects):
#: charged to the inbound budget so that thousands of tiny frames count too.
_FRAME_OVERHEAD_BYTES = 256
#: A TLS handshake must finish within this (reliability.md 6.5: 10 s handshake timeout).
_TLS_HANDSHAKE_TIMEOUT_S = 10.0
#: Largest frame a connection may send before it has authenticated (when the server
#: requires it): a SCRAM message is at most 2 KiB, so this bounds unauthenticated memory
#: far below a batch (reliability.md 6.5).
PREAUTH_MAX_FRAME_BYTES = 64 << 10
#: Where a refused connection's reads go (discarded).
_DISCARD = memoryview(bytearray(4096))


class ServerConnection(asyncio.BufferedProtocol):
    """One client connection. A BufferedProtocol: reads land in the frame decoder's buffers,
    and a large request (a batch) in a buffer of its own, which the commit log is written
    from: no copy of the payload between the socket and the page cache."""

    def __init__(self, server: TcpServer) -> None:
        self._server = server
        self._limits = server.limits
        max_frame = server.limits.max_frame_bytes
        if server.auth_required:
            max_frame = min(max_frame, PREAUTH_MAX_FRAME_BYTES)
        self._decoder = FrameDecoder(max_frame)
        #: With authentication required: `User:<name>` once authenticated, None before.
        self.principal: str | None = None
        #: The authentication exchange under way (the dispatcher's state), if any.
        self.auth_exchange: object | None = None
        self._transport: asyncio.Transport | None = None
        self._in_flight = 0
        #: Decoded requests waiting for a slot (bounded: reading stops at the limit).
        self._waiting: deque[Frame] = deque()
        self._pump_scheduled = False
        self._reading_paused = False
        self._last_pause_reason: str | None = None
        self._writing_paused = False
        self._refused = False
        #: Bytes of requests received and not answered, as charged to the server.
        self._inbound_bytes = 0
        self._frame_bytes = 0
        now = server.clock.monotonic_ms()
        self._last_activity_ms = now
        #: When the partial frame now buffered began (None: none buffered, or our pause).
        self._frame_started_ms: float | None = None
        self._stall_since_ms = now
        self._stall_buffer_bytes = 0
        self._opened_ms = now
        self.peer = "?"
        self.host = "?"
        self.budget: ConnectionBudget = server.response_budget.connection()
        self.tasks: set[asyncio.Task[None]] = set()
        #: Server-to-client requests waiting for their answer, by correlation id.
        self._asks: dict[int, asyncio.Future[Frame]] = {}
        self._ask_ids = itertools.count(1)
        #: Called once when the connection closes (services forget what it registered).
        self.on_close: list[Callable[[], None]] = []

    def authenticated(self, principal: str) -> None:
        """The connection proved who it is: record the principal, lift the pre-auth
        frame limit."""
        self.principal = principal
        self.auth_exchange = None
        self._decoder.max_frame_bytes = self._limits.max_frame_bytes

    # ------------------------------------------------------------------ asyncio callbacks

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # Duck-typed: uvloop's transports do not subclass asyncio.Transport.
        tr = self._transport = cast(asyncio.Transport, transport)
        try:
            self._set_up(tr)
        except Exception:
            # asyncio only logs what this callback raises, and the transport would stay
            # open with no one to close it (a socket reset by its peer while being set
            # up fails `setsockopt`): close it here.
            log.debug("a connection failed while being set up", exc_info=True)
            tr.abort()

    def _set_up(self, transport: asyncio.Transport) -> None:
        if not self._server.accepting:
            # Accepted by the kernel just before the server stopped listening: the
            # shutdown has already closed every connection it knew, so close this one.
            transport.abort()
            return
        self._loop = asyncio.get_running_loop()
        peer = transport.get_extra_info("peername")
        if peer:
            self.host, self.peer = str(peer[0]), f"{peer[0]}:{peer[1]}"
        self.budget = self._server.response_budget.connection(self.host)
        sock = transport.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SOCKET_BUFFER_BYTES)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, _SOCKET_BUFFER_BYTES)
        high = self._limits.write_buffer_high_bytes
        transport.set_write_buffer_limits(high=high, low=high // 4)
        refusal = self._server.accept(self)
        if refusal is not None:
            self._refuse(refusal)

    def _refuse(self, reason: str) -> None:
        """Answer with an error frame naming the limit, then close: at once when many
        refusals linger already, else after the client has had time to read it (a close
        with its request unread would reset the connection and lose the frame)."""
        self._refused = True
        transport = self._transport
        assert transport is not None
        self._server.log_event(logging.WARNING, "refused", "refusing %s: %s", self.peer, reason)
        self.send(
            encode_error(0, 0, BrokerNotAvailable(f"broker refused the connection: {reason}"))
        )
        if not self._server.linger(self):
            transport.close()
            return
        with contextlib.suppress(OSError, RuntimeError):
            if transport.can_write_eof():
                transport.write_eof()

    def eof_received(self) -> bool | None:
        return None  # close: a half-closed client sends no more requests

    def connection_lost(self, exc: Exception | None) -> None:
        self._server.forget(self)
        self._transport = None
        self._set_inbound(0)
        self._waiting.clear()
        self.budget.close()
        for future in self._asks.values():
            if not future.done():
                future.set_exception(BrokerNotAvailable(f"client {self.peer} disconnected"))
        self._asks.clear()
        callbacks, self.on_close = self.on_close, []
        for callback in callbacks:
            callback()

    def pause_writing(self) -> None:
        self._writing_paused = True
        self._stall_since_ms = self._server.clock.monotonic_ms()
        self._stall_buffer_bytes = self._write_buffer_bytes()
        self.update_reading()

    def resume_writing(self) -> None:
        self._writing_paused = False
        self.budget.drained()
        self.update_reading()

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._refused:
            return _DISCARD
        return self._decoder.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        if self._refused:
            return
        now = self._server.clock.monotonic_ms()
        self._last_activity_ms = now
        try:
            frames = self._decoder.buffer_updated(nbytes)
        except RemoteProtocolError as exc:
            self._server.log_event(logging.INFO, "protocol", "closing %s: %s", self.peer, exc)
            self.close()
            return
        if (
            len(frames) == 1
            and not self._in_flight
            and not self._waiting
            and self._server.answer_now is not None
            and frames[0].kind in _REQUEST_KINDS
        ):
            # The one-request-per-round-trip case: answered here or started as a task
            # at once, with no trip through the waiting queue and `_pump`.
            self._serve_one(frames[0], now)
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
            self._frame_bytes += _cost(frame)
            self._waiting.append(frame)
        if self._decoder.buffered_bytes == 0:
            self._frame_started_ms = None
        elif self._frame_started_ms is None or frames:
            self._frame_started_ms = now  # a new frame began in this read
        self._pump(scheduled=False)

    # ------------------------------------------------------------------ requests

    def _serve_one(self, frame: Frame, now: float) -> None:
        """The only request of a read, with nothing of the connection running or waiting
        (so it overtakes nothing): answered at once (`_answered_now`) or started as a
        task, as `_pump` would, without the waiting queue."""
        if self._decoder.buffered_bytes == 0:
            self._frame_started_ms = None
        else:
            self._frame_started_ms = now  # the next frame began in this read
        self._frame_bytes += _cost(frame)
        if not self._answered_now(frame):
            self._start(frame)
        inbound = self._decoder.buffered_bytes + self._frame_bytes
        if inbound or self._inbound_bytes or self._in_flight or self._reading_paused:
            self._set_inbound(inbound)
            self.update_reading()
        # Else nothing is held, nothing runs and reading goes on: `update_reading` would
        # find no reason to pause (a full write buffer pauses through `pause_writing`).

    def _pump(self, *, scheduled: bool = True) -> None:
        """Start waiting requests: up to `requests_per_turn` now, the rest on later turns
        (`call_soon` queues behind every other connection's ready callbacks)."""
        if scheduled:
            self._pump_scheduled = False
        if self._transport is None:
            return  # closed meanwhile
        limit = self._limits.max_in_flight
        started = 0
        answer_now = self._server.answer_now
        while (
            self._waiting and self._in_flight < limit and started < self._limits.requests_per_turn
        ):
            frame = self._waiting.popleft()
            started += 1
            if answer_now is not None and not self._in_flight and self._answered_now(frame):
                continue
            self._start(frame)
        if self._waiting and self._in_flight < limit and not self._pump_scheduled:
            self._pump_scheduled = True
            self._loop.call_soon(self._pump)
        self._set_inbound(self._decoder.buffered_bytes + self._frame_bytes)
        self.update_reading()

    def _start(self, frame: Frame) -> None:
        """Run `frame` as a task through the dispatcher."""
        self._in_flight += 1
        task = self._loop.create_task(self._handle(frame))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def _answered_now(self, frame: Frame) -> bool:
        """Answer `frame` here if the server's `answer_now` can (see the module's
        docstring): True if it did, False to run it as a task."""
        answer_now = self._server.answer_now
        assert answer_now is not None
        try:
            header = answer_now(frame, self)
            if header is None:
                return False
            out = encode_response(frame.code, frame.correlation_id, header, b"")
        except TidemqError as exc:
            out = encode_error(frame.code, frame.correlation_id, _remote(exc))
        except Exception:
            out = self._internal_error(frame)
        if frame.kind is FrameKind.REQUEST:
            self.send(out)
        self._frame_bytes -= _cost(frame)
        return True

    def _internal_error(self, frame: Frame) -> list[bytes | memoryview]:
        """Log the exception being handled; the answer that says to look there."""
        self._server.log_event(
            logging.ERROR,
            "internal",
            "request %d from %s failed",
            frame.code,
            self.peer,
            exc_info=True,
        )
        err = TidemqError("internal error; see the broker log")
        return encode_error(frame.code, frame.correlation_id, err)

    async def _handle(self, frame: Frame) -> None:
        task = asyncio.current_task()
        close_after = False
        try:
            try:
                header, body = await self._server.dispatcher(frame, self)
                out = encode_response(frame.code, frame.correlation_id, header, body)
            except TidemqError as exc:
                out = encode_error(frame.code, frame.correlation_id, _remote(exc))
                close_after = isinstance(exc, AuthenticationFailed)
            except Exception:
                out = self._internal_error(frame)
            if frame.kind is FrameKind.REQUEST:
                self.send(out)
            if close_after:
                self.close()  # after the answer: close() sends what is buffered first
        finally:
            self.budget.settle(task, queued=self._writing_paused)
            self._in_flight -= 1
            self._frame_bytes -= _cost(frame)
            self._last_activity_ms = self._server.clock.monotonic_ms()
            if self._transport is not None:
                if self._waiting and not self._pump_scheduled:
                    self._pump_scheduled = True
                    if not self._loop.is_closed():  # (a task closed with its loop)
                        self._loop.call_soon(self._pump)
                self._set_inbound(self._decoder.buffered_bytes + self._frame_bytes)
                self.update_reading()

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
        transport = self._transport
        if transport is not None and not transport.is_closing():
            if len(buffers) == 1:
                transport.write(buffers[0])  # an answer with no body: one buffer
            else:
                transport.writelines(buffers)

    # ------------------------------------------------------------------ limits

    def _set_inbound(self, size_bytes: int) -> None:
        delta = size_bytes - self._inbound_bytes
        if delta:
            self._inbound_bytes = size_bytes
            self._server.add_inbound(delta)

    def _pause_reason(self) -> str | None:
        """Why this connection must not read now (None: it may)."""
        if self._writing_paused:
            return "writing"
        if self._in_flight + len(self._waiting) >= self._limits.max_in_flight:
            return "in-flight"
        if self._inbound_bytes and self._server.inbound_over():
            return "inbound"
        return None

    def update_reading(self) -> None:
        transport = self._transport
        if transport is None or transport.is_closing() or self._refused:
            return
        reason = self._pause_reason()
        self._server.waiting_for_inbound(self, reason == "inbound")
        if reason is not None:
            if not self._reading_paused:
                transport.pause_reading()
                self._reading_paused = True
            self._last_pause_reason = reason
        elif self._reading_paused:
            transport.resume_reading()
            self._reading_paused = False
            if self._frame_started_ms is not None and self._last_pause_reason != "inbound":
                # The frame's time ran while we chose not to read; it starts again now.
                # (Not after an inbound-budget pause: under that pressure a peer that
                # holds a partial frame must finish it in time or go.)
                self._frame_started_ms = self._server.clock.monotonic_ms()

    def check_timeouts(self, now_ms: float) -> str | None:
        """Close the connection if one of its timeouts passed; the reason, or None."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return None
        reason = self._timeout_reason(now_ms)
        if reason is not None:
            self._server.log_event(
                logging.INFO, reason.split(":")[0], "closing %s: %s", self.peer, reason
            )
            # abort, not close: close waits for the write buffer to drain, and a client
            # that does not read would keep its connection (and the buffer) forever.
            transport.abort()
        return reason

    def _timeout_reason(self, now_ms: float) -> str | None:
        lim = self._limits
        if self._writing_paused:
            size = self._write_buffer_bytes()
            if size < self._stall_buffer_bytes:
                self._stall_buffer_bytes, self._stall_since_ms = size, now_ms
            elif now_ms - self._stall_since_ms >= lim.write_stall_timeout_ms:
                return (
                    f"write-stall: {size} bytes of answers unread for "
                    f"{lim.write_stall_timeout_ms} ms (write_stall_timeout_ms)"
                )
        started = self._frame_started_ms
        own_pause = self._pause_reason() in ("writing", "in-flight")
        if started is not None and not own_pause and now_ms - started >= lim.frame_read_timeout_ms:
            return (
                f"read-timeout: frame incomplete after {lim.frame_read_timeout_ms} ms "
                f"({self._decoder.buffered_bytes} bytes; frame_read_timeout_ms)"
            )
        idle = (
            not self._in_flight
            and not self._waiting
            and not self._asks
            and self._decoder.buffered_bytes == 0
        )
        if idle and now_ms - self._last_activity_ms >= lim.idle_timeout_ms:
            return f"idle: no request for {lim.idle_timeout_ms} ms (idle_timeout_ms)"
        if (
            self._server.auth_required
            and self.principal is None
            and now_ms - self._opened_ms >= lim.login_timeout_ms
        ):
            return f"login-timeout: not logged in {lim.login_timeout_ms} ms after connecting"
        return None

    def _write_buffer_bytes(self) -> int:
        transport = self._transport
        return transport.get_write_buffer_size() if transport is not None else 0

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()


#: The frames a client sends as requests (the rest are answers or server-bound replies).
_REQUEST_KINDS = frozenset((FrameKind.REQUEST, FrameKind.ONEWAY))


def _cost(frame: Frame) -> int:
    return len(frame.header) + len(frame.body) + _FRAME_OVERHEAD_BYTES


def _remote(exc: TidemqError) -> TidemqError:
    # A peer's undecodable request is, from the peer's side, an invalid request.
    if isinstance(exc, RemoteProtocolError):
        return InvalidRequest(str(exc))
    return exc


class TcpServer(ConnectionLedger["ServerConnection"]):
    """Listens on one address; hands every request frame to the dispatcher. Its
    connections' shared bookkeeping (admission, inbound budget, timeouts sweep, counters)
    is the ConnectionLedger it is. With `ssl_context` (tidemq.net.tls.server_context) it
    speaks TLS only: a connection's protocol starts once the handshake has succeeded."""

    def __init__(
        self,
        dispatcher: Dispatcher,
        limits: ServerLimits,
        *,
        on_client_frame: Callable[[Frame, ServerConnection], None] | None = None,
        clock: Clock | None = None,
        ssl_context: ssl.SSLContext | None = None,
        auth_required: bool = False,
        answer_now: AnswerNow | None = None,
    ) -> None:
        super().__init__(limits, clock or SystemClock(), log)
        self.dispatcher = dispatcher
        #: Answers the requests that need no waiting from the protocol callback.
        self.answer_now = answer_now
        self.ssl_context = ssl_context
        #: Connections start unauthenticated, with the pre-auth frame limit.
        self.auth_required = auth_required
        self._on_client_frame = on_client_frame
        self._server: asyncio.Server | None = None
        self._accepting = True
        self._sweeper: asyncio.Task[None] | None = None

    async def _sweep_forever(self) -> None:
        interval = self.sweep_interval_ms() / 1000
        while True:
            await asyncio.sleep(interval)
            try:
                self.sweep()
            except Exception:
                log.exception("connection sweep failed")

    def on_client_frame(self, frame: Frame, conn: ServerConnection) -> None:
        if self._on_client_frame is not None:
            self._on_client_frame(frame, conn)

    async def start(self, host: str, port: int) -> tuple[str, int]:
        loop = asyncio.get_running_loop()
        tls = self.ssl_context
        self._server = await loop.create_server(
            lambda: ServerConnection(self),
            host,
            port,
            reuse_address=True,
            backlog=1024,
            ssl=tls,
            ssl_handshake_timeout=_TLS_HANDSHAKE_TIMEOUT_S if tls is not None else None,
        )
        self._sweeper = loop.create_task(self._sweep_forever())
        sockname = self._server.sockets[0].getsockname()
        if tls is None and not is_loopback(host):
            log.warning(
                "listening on %s:%d without TLS: anyone who can reach it can read and send "
                "messages (set broker.tls_cert_file and broker.tls_key_file)",
                sockname[0],
                sockname[1],
            )
        if not self.auth_required and not is_loopback(host):
            log.warning(
                "listening on %s:%d without authentication: every client may do anything "
                "(set broker.auth_enabled, see docs/guide/security.md)",
                sockname[0],
                sockname[1],
            )
        return sockname[0], sockname[1]

    @property
    def accepting(self) -> bool:
        """False once the server stops accepting: a connection still arriving is closed."""
        return self._accepting

    async def stop_accepting(self) -> None:
        self._accepting = False
        if self._server is not None:
            self._server.close()

    @completes_when_cancelled
    async def drain(self, timeout_s: float) -> None:
        """Wait for in-flight requests to finish (graceful shutdown), then close."""
        tasks = [t for c in self._conns for t in c.tasks]
        if tasks:
            await asyncio.wait(tasks, timeout=timeout_s)
        if self._sweeper is not None:
            await cancel_and_wait(self._sweeper)
            self._sweeper = None
        for conn in [*self._conns, *self._lingering]:
            conn.close()
        if self._server is not None:
            await self._server.wait_closed()
