"""The server connection's path for the only request of a read
(`ServerConnection._serve_one`): answered from the protocol callback by the server's
`answer_now`, or started as a task when it declines, without the waiting queue. Driven
with a fake transport (the transport is not tidemq's code), as test_server_limits.py does:
the answers, the inbound charge and the reading state must be what the general path
gives."""

from __future__ import annotations

from typing import Any

from tests.unit.test_server_limits import (
    FRAME_LIMIT,
    Blocking,
    connect,
    feed,
    responses,
    run,
    turns,
)

from tidemq.core.errors import QueueNotFound
from tidemq.net.server import ServerConnection, ServerLimits, TcpServer
from tidemq.protocol.codec import error_from_frame
from tidemq.protocol.commands import Empty
from tidemq.protocol.frame import Frame, FrameKind, encode_frame
from tidemq.testing.clock import ManualClock

#: Request codes the fake `answer_now` answers, refuses, fails on, or leaves to a task.
ANSWERED, REFUSED, BROKEN, DECLINED = 1, 2, 3, 4


class AnswerNow:
    """An `answer_now` that answers, refuses or fails by request code (None: declined,
    the dispatcher serves it)."""

    def __init__(self) -> None:
        self.seen: list[int] = []

    def __call__(self, frame: Frame, conn: ServerConnection) -> Any:
        self.seen.append(frame.correlation_id)
        if frame.code == REFUSED:
            raise QueueNotFound("queue 9 is not served here")
        if frame.code == BROKEN:
            raise RuntimeError("a bug")
        return Empty() if frame.code == ANSWERED else None


def _server(dispatcher: Blocking, **limits: int) -> tuple[TcpServer, AnswerNow]:
    answer_now = AnswerNow()
    server = TcpServer(
        dispatcher,
        ServerLimits(max_frame_bytes=FRAME_LIMIT, **limits),
        clock=ManualClock(),
        answer_now=answer_now,
    )
    return server, answer_now


def _request(code: int, corr: int, body: bytes = b"") -> bytes:
    return b"".join(encode_frame(FrameKind.REQUEST, code, corr, b"\x80", body))


@run
async def test_a_lone_request_is_answered_at_once_and_holds_nothing() -> None:
    dispatcher = Blocking()
    server, answer_now = _server(dispatcher)
    conn, transport = connect(server)
    for corr in range(1, 4):
        feed(conn, _request(ANSWERED, corr))
    assert answer_now.seen == [1, 2, 3]
    assert [f.correlation_id for f in responses(transport)] == [1, 2, 3]
    assert not conn.tasks
    assert not dispatcher.started
    assert server.inbound_bytes == 0
    assert transport.reading


@run
async def test_refusals_and_failures_are_answered_as_errors_and_the_connection_goes_on() -> None:
    server, _ = _server(Blocking())
    conn, transport = connect(server)
    feed(conn, _request(REFUSED, 1))
    feed(conn, _request(BROKEN, 2))
    feed(conn, _request(ANSWERED, 3))
    first, second, third = responses(transport)
    assert isinstance(error_from_frame(first), QueueNotFound)
    assert "internal error" in str(error_from_frame(second))
    assert not third.is_error
    assert third.correlation_id == 3
    assert server.inbound_bytes == 0
    assert transport.reading


@run
async def test_a_declined_request_runs_as_a_task_within_the_in_flight_limit() -> None:
    dispatcher = Blocking()
    server, answer_now = _server(dispatcher, max_in_flight=1)
    conn, transport = connect(server)
    feed(conn, _request(DECLINED, 1, b"x" * 100))
    await turns()
    assert answer_now.seen == [1]
    assert dispatcher.started == [1]
    assert not transport.reading  # the one slot is taken: backpressure, as on _pump's way
    assert server.inbound_bytes > 100  # charged until answered
    dispatcher.release(1)
    await turns()
    assert [f.correlation_id for f in responses(transport)] == [1]
    assert transport.reading
    assert server.inbound_bytes == 0
    # The next lone request is asked again, and answered at once.
    feed(conn, _request(ANSWERED, 2))
    assert answer_now.seen == [1, 2]
    assert [f.correlation_id for f in responses(transport)] == [1, 2]


@run
async def test_a_read_with_the_start_of_the_next_frame_keeps_that_part_charged() -> None:
    server, _ = _server(Blocking())
    conn, transport = connect(server)
    second = _request(ANSWERED, 2, b"y" * 50)
    feed(conn, _request(ANSWERED, 1) + second[:20])
    assert [f.correlation_id for f in responses(transport)] == [1]
    assert server.inbound_bytes == 20  # the partial frame, charged to the budget
    feed(conn, second[20:])
    assert [f.correlation_id for f in responses(transport)] == [1, 2]
    assert server.inbound_bytes == 0


@run
async def test_behind_a_running_request_a_lone_one_waits_its_turn() -> None:
    """Nothing overtakes: while a task runs, the next request is not answered at once but
    queued behind it (the general path), and answered after it."""
    dispatcher = Blocking()
    server, answer_now = _server(dispatcher)
    conn, transport = connect(server)
    feed(conn, _request(DECLINED, 1))
    await turns()
    feed(conn, _request(ANSWERED, 2))
    await turns()
    assert dispatcher.started == [1, 2]  # a task too: the first is still running
    assert answer_now.seen == [1]
    dispatcher.release(2)
    await turns()
    assert sorted(f.correlation_id for f in responses(transport)) == [1, 2]
    assert server.inbound_bytes == 0
