"""A real `tidemq server` under the abuse of issue 16, with small limits set by `--set`:

* a pipelined FETCH flood from clients that never read their answers,
* half frames (all but the last byte of a maximum-size frame),
* slowloris connections (a byte now and then) and a connection flood,
* one connection pipelining cheap requests as fast as it can.

Each test watches the server's resident memory (/proc/PID/status), checks that a normal
client keeps sub-second latency meanwhile, and that the abusers are cut off and their
memory given back. Abusers connect from 127.0.0.2 (still loopback) so that the
per-address limit separates them from the normal client on 127.0.0.1. Every loop is
bounded in count and time; longer variants run under TIDEMQ_SOAK=1 (`make soak`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import socket
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import msgspec
import pytest
from tests.support.server_process import server_process

from tidemq import aio
from tidemq.net.client import ClientConnection
from tidemq.protocol.codec import encode_request, error_from_frame
from tidemq.protocol.commands import (
    FetchRequest,
    FetchResponse,
    GetRoutesRequest,
    ProduceRequest,
    StatusRequest,
    StatusResponse,
)
from tidemq.protocol.frame import FrameDecoder

ABUSER_HOST = "127.0.0.2"
MiB = 1 << 20
START_TIMEOUT_S = 30
#: A server whose memory passes this is killed at once (the test fails, the machine lives).
RSS_KILL_BYTES = 1536 * MiB
#: What a normal client must get while the abuse goes on.
LATENCY_MAX_S = 1.0


@dataclass
class Server:
    proc: subprocess.Popen[bytes]
    address: str
    log: Path

    def rss_bytes(self) -> int:
        text = Path(f"/proc/{self.proc.pid}/status").read_text()
        found = re.search(r"^VmRSS:\s+(\d+) kB", text, re.MULTILINE)
        assert found, text
        return int(found.group(1)) * 1024

    def log_lines(self, pattern: str) -> int:
        return sum(1 for line in self.log.read_text().splitlines() if re.search(pattern, line))


@contextlib.contextmanager
def server(tmp_path: Path, **settings: int) -> Iterator[Server]:
    """`tidemq server` with `--set broker.KEY=VALUE` for each setting, on a free port."""
    sets = [a for k, v in settings.items() for a in ("--set", f"broker.{k}={v}")]
    with server_process(tmp_path, sets, start_timeout_s=START_TIMEOUT_S) as running:
        yield Server(running.proc, running.address, running.log)


class RssWatch:
    """Samples the server's RSS every 50 ms on a thread; kills it past RSS_KILL_BYTES."""

    def __init__(self, srv: Server) -> None:
        self._srv = srv
        self.baseline = srv.rss_bytes()
        self.peak = self.baseline
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> RssWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        while not self._stop.wait(0.05):
            with contextlib.suppress(OSError, AssertionError):
                rss = self._srv.rss_bytes()
                self.peak = max(self.peak, rss)
                if rss > RSS_KILL_BYTES:
                    self._srv.proc.kill()
                    return

    @property
    def growth_mib(self) -> float:
        return (self.peak - self.baseline) / MiB


def frame_bytes(request: msgspec.Struct, corr: int, body: bytes = b"") -> bytes:
    return b"".join(encode_request(request, corr, body))


def abuser(address: str, *, rcvbuf: int | None = None) -> socket.socket:
    host, port = address.rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if rcvbuf is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.bind((ABUSER_HOST, 0))
    sock.settimeout(5)
    sock.connect((host, int(port)))
    return sock


def send_until(sock: socket.socket, data: bytes, deadline: float) -> int:
    """Send what the kernel takes before `deadline`, without blocking past it."""
    sent = 0
    sock.setblocking(False)
    while sent < len(data) and time.monotonic() < deadline:
        try:
            sent += sock.send(data[sent : sent + MiB])
        except BlockingIOError:
            time.sleep(0.005)
        except OSError:
            break
    sock.settimeout(5)
    return sent


def closed_by_server(sock: socket.socket, deadline: float) -> bool:
    """Read (and drop) until the server closes the connection or the deadline passes."""
    while time.monotonic() < deadline:
        sock.settimeout(max(0.01, deadline - time.monotonic()))
        try:
            if not sock.recv(1 << 16):
                return True
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False
    return False


async def probe(
    address: str, duration_s: float, request: msgspec.Struct | None = None
) -> list[float]:
    """A normal client: requests (STATUS unless told) one after another; each one's
    latency."""
    latencies: list[float] = []
    request = request or StatusRequest()
    expected = FetchResponse if isinstance(request, FetchRequest) else StatusResponse
    conn = await ClientConnection.open(address, max_frame_bytes=32 * MiB)
    try:
        await conn.request(request, expected, timeout_s=10)  # warm up
        deadline = time.monotonic() + duration_s
        while time.monotonic() < deadline:
            start = time.monotonic()
            await conn.request(request, expected, timeout_s=10)
            latencies.append(time.monotonic() - start)
            await asyncio.sleep(0.01)
    finally:
        conn.close()
    return latencies


async def status(address: str) -> StatusResponse:
    conn = await ClientConnection.open(address, max_frame_bytes=4 * MiB)
    try:
        resp, _ = await conn.request(StatusRequest(), StatusResponse, timeout_s=10)
        return resp
    finally:
        conn.close()


async def wait_for_usage(address: str, key: str, at_least: int, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        value = (await status(address)).usage.get(key, 0)
        if value >= at_least or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.1)


def p99(latencies: list[float]) -> float:
    return statistics.quantiles(latencies, n=100)[98] if len(latencies) > 1 else latencies[0]


# ------------------------------------------------------------------ pipelined FETCH flood


def fetch_flood(tmp_path: Path, *, abusers: int, fetches: int) -> None:
    with server(
        tmp_path,
        max_response_bytes_per_connection=8 * MiB,
        max_response_bytes_per_address=24 * MiB,
        max_response_bytes=32 * MiB,
        write_stall_timeout_ms=3_000,
    ) as srv:

        async def setup() -> None:
            admin = aio.Admin(srv.address)
            await admin.create_topic("flood", 1)
            await admin.close()
            producer = aio.Producer(srv.address, linger_ms=1)
            for i in range(64):  # 4 MiB to fetch, again and again
                await producer.send_batch("flood", [bytes([i]) * 64_000], queue=0)
            await producer.close()

        asyncio.run(setup())
        request = FetchRequest(topic="flood", queue=0, offset=0, max_bytes=16 * MiB)
        flood = b"".join(frame_bytes(request, corr) for corr in range(1, fetches + 1))
        with RssWatch(srv) as rss:
            socks = [abuser(srv.address, rcvbuf=64 << 10) for _ in range(abusers)]
            for sock in socks:
                sock.sendall(flood)  # and never read an answer
            # A consumer on another address fetches meanwhile: the abusers' address may
            # hold 24 MiB of the 32, so its 4 MiB answers always find room.
            latencies = asyncio.run(probe(srv.address, 4.0, request))
            stalls = asyncio.run(wait_for_usage(srv.address, "write-stall", abusers, 60))
            after = asyncio.run(status(srv.address))
        for sock in socks:
            sock.close()
        print(
            f"fetch flood: {abusers} x {fetches} FETCH of 16 MiB; RSS {rss.baseline / MiB:.0f}"
            f" -> peak {rss.peak / MiB:.0f} MiB; probe max {max(latencies) * 1000:.0f} ms, "
            f"p99 {p99(latencies) * 1000:.0f} ms over {len(latencies)}; usage {after.usage}"
        )
        assert srv.proc.poll() is None
        # 8 MiB of answers per connection, 32 MiB in all, plus one batch per fetch.
        # (The abusers cannot all be served at once: 3 at a time, each cut off after the
        # stall timeout, which is what the 60 s wait above is for in the soak variant.)
        assert rss.growth_mib < 256
        assert max(latencies) < LATENCY_MAX_S
        assert stalls >= abusers  # cut off: they did not read their answers
        assert after.usage["response_bytes"] == 0
        assert after.limits["max_response_bytes"] == 32 * MiB


def test_pipelined_fetch_flood_is_bounded_and_cut_off(tmp_path: Path) -> None:
    fetch_flood(tmp_path, abusers=4, fetches=600)


@pytest.mark.slow
def test_pipelined_fetch_flood_soak(tmp_path: Path, soak: bool) -> None:
    if not soak:
        pytest.skip("TIDEMQ_SOAK=1 runs the long variant")
    fetch_flood(tmp_path, abusers=32, fetches=2_000)


# ------------------------------------------------------------------ half frames


def test_half_frames_are_bounded_and_dropped_after_the_read_timeout(tmp_path: Path) -> None:
    connections = 200
    with server(
        tmp_path,
        max_message_bytes=MiB,
        max_fetch_bytes=MiB,
        frame_read_timeout_ms=2_000,
        max_inbound_bytes=16 * MiB,
    ) as srv:
        body = b"h" * (MiB + 60_000)  # with the header: just under the frame limit
        almost = frame_bytes(ProduceRequest(topic="t", queue=0), 1, body)[:-1]
        baseline = srv.rss_bytes()
        peaks: list[int] = []
        for attack in (1, 2):  # the second must not need more memory than the first
            with RssWatch(srv) as rss:
                deadline = time.monotonic() + 10
                socks = [abuser(srv.address) for _ in range(connections)]
                sent = sum(send_until(sock, almost, deadline) for sock in socks)
                latencies = asyncio.run(probe(srv.address, 1.0))
                close_by = time.monotonic() + 10
                closed = sum(closed_by_server(sock, close_by) for sock in socks)
                for sock in socks:
                    sock.close()
                timeouts = asyncio.run(
                    wait_for_usage(srv.address, "read-timeout", attack * connections, 5)
                )
                time.sleep(0.5)  # let the allocator hand the buffers back
                after = srv.rss_bytes()
            peaks.append(rss.peak)
            print(
                f"half frames, attack {attack}: {connections} x {len(almost)} bytes "
                f"({sent / MiB:.0f} MiB sent); RSS {baseline / MiB:.0f} -> peak "
                f"{rss.peak / MiB:.0f} -> {after / MiB:.0f} MiB; probe max "
                f"{max(latencies) * 1000:.0f} ms; closed {closed}, read timeouts {timeouts}"
            )
            # Unbounded, the frames alone are over 200 MiB.
            assert (rss.peak - baseline) / MiB < 100
            assert max(latencies) < LATENCY_MAX_S
            assert closed == connections
            assert timeouts == attack * connections
            assert (after - baseline) / MiB < 64
        assert peaks[1] <= peaks[0] + 16 * MiB  # memory stopped growing


# ------------------------------------------------------------------ slowloris, connection flood


def test_slowloris_connections_are_closed_by_the_read_timeout(tmp_path: Path) -> None:
    with server(tmp_path, frame_read_timeout_ms=2_000) as srv:
        frame = frame_bytes(StatusRequest(), 1)
        socks = [abuser(srv.address) for _ in range(100)]
        start = time.monotonic()
        closed: set[int] = set()
        for i in range(len(frame) - 1):  # a byte every 300 ms: never a whole frame
            if time.monotonic() - start > 8 or len(closed) == len(socks):
                break
            for n, sock in enumerate(socks):
                if n not in closed:
                    try:
                        sock.send(frame[i : i + 1])
                    except OSError:
                        closed.add(n)
            time.sleep(0.3)
        latency = max(asyncio.run(probe(srv.address, 0.5)))
        ended = sum(closed_by_server(s, time.monotonic() + 3) for s in socks)
        for sock in socks:
            sock.close()
        print(f"slowloris: 100 connections, closed {ended} after {time.monotonic() - start:.1f} s")
        assert ended == 100
        assert latency < LATENCY_MAX_S


def test_a_connection_flood_is_refused_with_a_clear_error_and_one_log_line(
    tmp_path: Path,
) -> None:
    with server(
        tmp_path,
        max_connections=100,
        max_connections_per_address=40,
        connection_idle_timeout_ms=2_000,
    ) as srv:
        socks = [abuser(srv.address) for _ in range(300)]
        # The normal client, from another address, is not locked out.
        latencies = asyncio.run(probe(srv.address, 0.5))
        refusals = []
        for sock in socks[40:]:
            data = b""
            with contextlib.suppress(OSError):
                while chunk := sock.recv(4096):
                    data += chunk
            refusals.append(data)
        kept = socks[:40]
        ended = sum(closed_by_server(s, time.monotonic() + 5) for s in kept)  # idle
        for sock in socks:
            sock.close()
        usage = asyncio.run(status(srv.address)).usage
        frames = [FrameDecoder(MiB).feed(data) for data in refusals]
        messages = {str(error_from_frame(f[0])) for f in frames if f}
        print(f"connection flood: 300 from one address; usage {usage}; {messages}")
        assert all(len(f) == 1 for f in frames)  # every refused client got the error
        assert len(messages) == 1
        assert "broker.max_connections_per_address" in messages.pop()
        assert usage["refused"] == 260
        assert ended == 40
        assert max(latencies) < LATENCY_MAX_S
        assert srv.log_lines("refusing") <= 2  # not 260: one line per 10 s


# ------------------------------------------------------------------ pipelining fairness


def pipelining(tmp_path: Path, requests: int, **settings: int) -> tuple[float, float]:
    """The normal client's p99 latency (s) without and with the pipelining client."""
    with server(tmp_path, **settings) as srv:
        sock = abuser(srv.address)
        # GET_ROUTES: answered on the event loop from memory, the cheapest request there is.
        cheap = GetRoutesRequest()
        flood = b"".join(frame_bytes(cheap, corr) for corr in range(1, requests + 1))
        answered = 0
        deadline = time.monotonic() + 60

        def write() -> None:
            send_until(sock, flood, deadline)

        def read() -> None:
            nonlocal answered
            decoder = FrameDecoder(MiB)
            sock.settimeout(5)
            while answered < requests and time.monotonic() < deadline:
                try:
                    data = sock.recv(1 << 16)
                except TimeoutError:
                    return
                if not data:
                    return
                answered += len(decoder.feed(data))

        quiet = asyncio.run(probe(srv.address, 1.0))
        threads = [threading.Thread(target=write), threading.Thread(target=read)]
        start = time.monotonic()
        for t in threads:
            t.start()
        busy = asyncio.run(probe(srv.address, 3.0))
        for t in threads:
            t.join(70)
        took = time.monotonic() - start
        sock.close()
        print(
            f"pipelining {requests} GET_ROUTES: answered {answered} in {took:.1f} s; normal client"
            f" p99 {p99(quiet) * 1000:.1f} ms quiet, {p99(busy) * 1000:.1f} ms during "
            f"(max {max(busy) * 1000:.0f} ms, {len(busy)} requests)"
        )
        assert answered == requests
        return p99(quiet), p99(busy)


def test_one_pipelining_client_does_not_starve_the_others(tmp_path: Path) -> None:
    _, busy = pipelining(tmp_path, 20_000)
    assert busy < 0.25  # 450 ms before requests_per_turn and the in-flight limit held


@pytest.mark.slow
def test_pipelining_fairness_soak(tmp_path: Path, soak: bool) -> None:
    if not soak:
        pytest.skip("TIDEMQ_SOAK=1 runs the long variant")
    _, busy = pipelining(tmp_path, 200_000)
    assert busy < 0.25


def test_abusers_do_not_share_the_normal_clients_address() -> None:
    # The tests rely on 127.0.0.2 being loopback (Linux routes all of 127/8 to lo).
    sock = socket.socket()
    try:
        sock.bind((ABUSER_HOST, 0))
    finally:
        sock.close()
    assert os.uname().sysname == "Linux"
