"""The server's per-connection and per-broker bounds (issue 16), against a fake transport
and a ManualClock: in-flight limit with backpressure, per-turn fairness, the inbound and
response byte budgets, the read / idle / write-stall timeouts, connection limits with a
refusal frame, and rate-limited logging. Nothing sleeps: time moves by `clock.advance`."""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest

from tidemq.core.errors import BrokerNotAvailable
from tidemq.core.log_limit import RateLimitedLog
from tidemq.net.budget import ResponseBudget
from tidemq.net.client import ClientConnection
from tidemq.net.server import ServerConnection, ServerLimits, TcpServer
from tidemq.protocol.codec import error_from_frame
from tidemq.protocol.commands import Empty, StatusRequest
from tidemq.protocol.frame import Frame, FrameDecoder, FrameKind, encode_frame
from tidemq.testing.clock import ManualClock

FRAME_LIMIT = 1 << 20
#: A test that hangs fails instead of eating the CI budget.
TEST_TIMEOUT_S = 10

T = TypeVar("T")


def run(fn: Callable[[], Awaitable[None]]) -> Callable[[], None]:
    """Run an async test on a fresh event loop (the project has no pytest-asyncio)."""

    @functools.wraps(fn)
    def wrapper() -> None:
        asyncio.run(asyncio.wait_for(fn(), TEST_TIMEOUT_S))

    return wrapper


class FakeTransport:
    """What ServerConnection uses of an asyncio transport, recorded."""

    def __init__(self, host: str = "10.0.0.1", port: int = 5000) -> None:
        self.peer = (host, port)
        self.written = bytearray()
        self.reading = True
        self.closed = False
        self.eof = False
        self.write_buffer = 0
        self.limits: tuple[int, int] | None = None

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self.peer if name == "peername" else default

    def set_write_buffer_limits(self, high: int, low: int) -> None:
        self.limits = (high, low)

    def pause_reading(self) -> None:
        assert self.reading
        self.reading = False

    def resume_reading(self) -> None:
        assert not self.reading
        self.reading = True

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def writelines(self, buffers: list[bytes | memoryview]) -> None:
        for b in buffers:
            self.written += b

    def write(self, data: bytes | memoryview) -> None:
        self.written += data

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def get_write_buffer_size(self) -> int:
        return self.write_buffer


class Blocking:
    """A dispatcher whose requests wait until the test releases them."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.gates: dict[int, asyncio.Event] = {}

    async def __call__(self, frame: Frame, conn: ServerConnection) -> tuple[Any, bytes]:
        self.started.append(frame.correlation_id)
        gate = self.gates.setdefault(frame.correlation_id, asyncio.Event())
        await gate.wait()
        return Empty(), b""

    def release(self, n: int) -> None:
        for corr in self.started[:n]:
            self.gates.setdefault(corr, asyncio.Event()).set()
        del self.started[:n]


def request(corr: int, body: bytes = b"") -> bytes:
    return b"".join(encode_frame(FrameKind.REQUEST, 0, corr, b"\x80", body))


def feed(conn: ServerConnection, data: bytes) -> None:
    """Deliver `data` as the event loop would: into the protocol's buffers."""
    view = memoryview(data)
    while view:
        buf = conn.get_buffer(-1)
        n = min(len(buf), len(view))
        buf[:n] = view[:n]
        conn.buffer_updated(n)
        view = view[n:]


def make_server(
    dispatcher: Callable[[Frame, ServerConnection], Awaitable[tuple[Any, bytes]]] | None = None,
    **limits: int,
) -> tuple[TcpServer, ManualClock]:
    clock = ManualClock()
    server = TcpServer(
        dispatcher or Blocking(),
        ServerLimits(max_frame_bytes=FRAME_LIMIT, **limits),
        clock=clock,
    )
    return server, clock


def connect(server: TcpServer, host: str = "10.0.0.1", port: int = 5000) -> tuple[
    ServerConnection, FakeTransport
]:  # fmt: skip
    conn = ServerConnection(server)
    transport = FakeTransport(host, port)
    conn.connection_made(transport)  # type: ignore[arg-type]
    return conn, transport


async def turns(n: int = 5) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def responses(transport: FakeTransport) -> list[Frame]:
    return FrameDecoder(FRAME_LIMIT).feed(bytes(transport.written))


# ------------------------------------------------------------------ requests in flight


@run
async def test_a_pipelined_flood_starts_at_most_max_in_flight_and_stops_reading() -> None:
    dispatcher = Blocking()
    server, _ = make_server(dispatcher, max_in_flight=8, requests_per_turn=100)
    conn, transport = connect(server)
    feed(conn, b"".join(request(i) for i in range(1, 601)))  # one read, 600 requests
    await turns()
    assert len(dispatcher.started) == 8
    assert not transport.reading  # backpressure: the rest stays in the kernel's buffers
    dispatcher.release(3)
    await turns()
    assert len(dispatcher.started) == 8  # three finished, three more started
    assert len(responses(transport)) == 3


@run
async def test_each_connection_starts_few_requests_per_loop_turn() -> None:
    dispatcher = Blocking()
    server, _ = make_server(dispatcher, max_in_flight=64, requests_per_turn=4)
    conn, _ = connect(server)
    feed(conn, b"".join(request(i) for i in range(1, 41)))
    await asyncio.sleep(0)  # the four started in the read callback have run to their wait
    assert len(dispatcher.started) == 4
    await turns(20)
    assert len(dispatcher.started) == 40


@run
async def test_inbound_budget_stops_connections_holding_unanswered_bytes() -> None:
    dispatcher = Blocking()
    server, _ = make_server(dispatcher, max_inbound_bytes=100_000, max_in_flight=64)
    a, ta = connect(server, port=1)
    b, tb = connect(server, port=2)
    feed(a, request(1, b"x" * 60_000))
    feed(b, request(2, b"y" * 60_000))
    await turns()
    assert server.inbound_bytes > 100_000
    assert not tb.reading  # over the budget: holding bytes, so it must wait
    dispatcher.release(2)
    await turns()
    assert server.inbound_bytes == 0
    assert ta.reading
    assert tb.reading


# ------------------------------------------------------------------ timeouts


@run
async def test_a_frame_begun_must_complete_within_the_read_timeout() -> None:
    server, clock = make_server(frame_read_timeout_ms=30_000)
    conn, transport = connect(server)
    frame = request(1, b"z" * 1000)
    feed(conn, frame[:-1])  # all but the last byte
    clock.advance(29_999)
    assert server.sweep() == 0
    clock.advance(1)
    assert server.sweep() == 1
    assert transport.closed
    assert server.counters["read-timeout"] == 1


@run
async def test_read_timeout_does_not_run_while_the_server_stops_reading() -> None:
    dispatcher = Blocking()
    server, clock = make_server(dispatcher, max_in_flight=1, frame_read_timeout_ms=1_000)
    conn, transport = connect(server)
    feed(conn, request(1) + request(2)[:5])  # one running, the next one begun
    await turns()
    assert not transport.reading
    clock.advance(5_000)
    assert server.sweep() == 0  # our pause, not the client's slowness
    dispatcher.release(1)
    await turns()
    assert transport.reading
    clock.advance(999)
    assert server.sweep() == 0  # its time starts again when reading resumes
    clock.advance(1)
    assert server.sweep() == 1


@run
async def test_idle_connections_close_but_a_parked_request_is_not_idle() -> None:
    dispatcher = Blocking()
    server, clock = make_server(dispatcher, idle_timeout_ms=60_000)
    _idle, t_idle = connect(server, port=1)
    parked, t_parked = connect(server, port=2)
    feed(parked, request(1))  # a long-poll fetch, say: in flight for minutes
    await turns()
    clock.advance(60_000)
    assert server.sweep() == 1
    assert t_idle.closed
    assert not t_parked.closed
    dispatcher.release(1)
    await turns()
    clock.advance(59_999)
    assert server.sweep() == 0
    clock.advance(1)
    assert server.sweep() == 1
    assert t_parked.closed
    assert server.counters["idle"] == 2


@run
async def test_a_client_that_does_not_read_its_answers_is_closed_after_the_stall_timeout() -> None:
    server, clock = make_server(write_stall_timeout_ms=10_000)
    conn, transport = connect(server)
    transport.write_buffer = 5 << 20
    conn.pause_writing()
    assert not transport.reading
    clock.advance(9_000)
    transport.write_buffer -= 1  # one byte left: progress, the stall starts again
    assert server.sweep() == 0
    clock.advance(9_999)
    assert server.sweep() == 0
    clock.advance(1)
    assert server.sweep() == 1
    assert server.counters["write-stall"] == 1


# ------------------------------------------------------------------ connection limits


@run
async def test_connections_per_address_are_limited_and_the_refusal_names_the_limit() -> None:
    server, clock = make_server(max_connections=10, max_connections_per_address=2)
    connect(server, port=1)
    connect(server, port=2)
    _refused, transport = connect(server, port=3)
    _other, other_t = connect(server, host="10.0.0.2", port=1)
    assert server.connections == 3
    assert not other_t.closed
    [frame] = responses(transport)
    assert frame.correlation_id == 0
    assert frame.is_error
    error = error_from_frame(frame)
    assert isinstance(error, BrokerNotAvailable)
    assert "max_connections_per_address" in str(error)
    assert "10.0.0.1" in str(error)
    assert transport.eof  # half-closed; closed by the sweep after the linger
    assert not transport.closed
    clock.advance(1_000)
    server.sweep()
    assert transport.closed
    assert server.counters["refused"] == 1


@run
async def test_the_total_connection_limit_refuses_with_its_own_name() -> None:
    server, _ = make_server(max_connections=2, max_connections_per_address=2)
    connect(server, host="10.0.0.1")
    connect(server, host="10.0.0.2")
    _, transport = connect(server, host="10.0.0.3")
    [frame] = responses(transport)
    assert "(broker.max_connections)" in str(error_from_frame(frame))


@run
async def test_refusals_beyond_the_linger_limit_close_at_once() -> None:
    server, _ = make_server(
        max_connections=1, max_connections_per_address=1, max_lingering_refusals=2
    )
    connect(server)
    lingering = [connect(server, port=p)[1] for p in (2, 3, 4)]
    assert [t.closed for t in lingering] == [False, False, True]


@run
async def test_the_client_reports_a_refusal_as_the_brokers_error() -> None:
    server = TcpServer(
        Blocking(),
        ServerLimits(max_frame_bytes=FRAME_LIMIT, max_connections=1, max_connections_per_address=1),
    )
    host, port = await server.start("127.0.0.1", 0)
    first = await ClientConnection.open(f"{host}:{port}", max_frame_bytes=FRAME_LIMIT)
    second = await ClientConnection.open(f"{host}:{port}", max_frame_bytes=FRAME_LIMIT)
    try:
        with pytest.raises(BrokerNotAvailable, match=r"refused.*broker\.max_connections\)"):
            await second.request(StatusRequest(), Empty, timeout_s=5)
        with pytest.raises(BrokerNotAvailable, match=r"broker\.max_connections\)"):
            await second.request(StatusRequest(), Empty, timeout_s=5)
    finally:
        first.close()
        second.close()
        await server.stop_accepting()
        await server.drain(1)


# ------------------------------------------------------------------ response budget


@run
async def test_a_fetch_gets_what_the_response_budget_has_left_and_waits_when_spent() -> None:
    budget = ResponseBudget(total_bytes=100, per_connection_bytes=60, min_grant_bytes=10)
    a, b = budget.connection(), budget.connection()

    async def take(conn: Any, wanted: int) -> int:
        return int(await conn.acquire(wanted))

    first = asyncio.create_task(take(a, 50))
    assert await first == 50
    second = asyncio.create_task(take(a, 50))
    assert await second == 10  # 60 per connection
    third = asyncio.create_task(take(a, 50))
    await turns()
    assert not third.done()  # less than min_grant free: waits
    a.settle(first, queued=True)  # written while the write buffer was full: still held
    await turns()
    assert not third.done()
    a.drained()
    assert await third == 50
    assert await take(b, 100) == 40  # the total: 100 - 10 (second) - 50 (third)
    a.close()
    assert budget.used_bytes == 40


# ------------------------------------------------------------------ logging


def test_repeated_events_log_one_line_per_interval_with_a_count(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    rlog = RateLimitedLog(logging.getLogger("test.flood"), clock, interval_ms=10_000)
    with caplog.at_level(logging.INFO, logger="test.flood"):
        for i in range(3993):
            rlog.log(logging.WARNING, "refused", "refusing client %d", i)
            clock.advance(1)
        rlog.log(logging.WARNING, "timeout", "another kind")
        clock.advance(10_000)
        rlog.log(logging.WARNING, "refused", "refusing client %d", 9999)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        "refusing client 0",
        "another kind",
        "refusing client 9999 (3992 more like this in the last 14 s)",
    ]


@run
async def test_one_address_cannot_take_the_whole_response_budget() -> None:
    budget = ResponseBudget(
        total_bytes=100, per_address_bytes=40, per_connection_bytes=30, min_grant_bytes=10
    )
    a1, a2 = budget.connection("10.0.0.1"), budget.connection("10.0.0.1")
    other = budget.connection("10.0.0.2")

    async def take(conn: Any, wanted: int) -> int:
        return int(await conn.acquire(wanted))

    assert await take(a1, 50) == 30
    assert await take(a2, 50) == 10  # 40 for the address
    assert budget.address_bytes("10.0.0.1") == 40
    assert await take(other, 50) == 30  # another address still gets its share
    a1.close()
    a2.close()
    assert budget.address_bytes("10.0.0.1") == 0
    assert budget.used_bytes == 30
