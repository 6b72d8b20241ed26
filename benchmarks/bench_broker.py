"""The broker over TCP against Redis Streams and NATS JetStream, back to back in one run.

Usage: ``python benchmarks/bench_broker.py [--quick] [--runs N] [--json PATH]
[--only 1,2,3,4,5,ceilings] [--seconds S] [--dir PATH] [--pin]``

Every server is a separate process bound to 127.0.0.1 with a temporary directory of its
own (under `--dir`, default the system temp dir: the real disk, never tmpfs); the clients
run in this process (uvloop when installed, for every asyncio client alike). Servers:

* tidemq: `tidemq server --flush sync` and `--flush async` (the CLI defaults otherwise:
  async flush every 500 ms);
* Redis: `appendonly yes, appendfsync everysec` ("AOF"), and for the packed and
  redis-benchmark peers of workload 3 also one without persistence; RDB snapshots off;
* NATS: JetStream, file storage, one replica.

Workloads, at 100 B and 1 KiB (values random, from a pool of 1024):

1. one message per round trip: `await producer.send()` each time; peers redis-py `XADD`,
   nats-py `js.publish`, one at a time.
2. 256 in flight: 256 `send_nowait` then `gather`, window after window (the producer
   batches what one loop tick sends); peers redis-py pipeline of 256 `XADD`, nats-py
   `gather` of 256 `js.publish`.
3. batches of 256: `send_batch` (one record, one index entry each) with 8 batches in
   flight (the producer keeps at most 5 on the wire per queue); peers `redis-benchmark -c 8
   -P 256 XADD` (the C client) and redis-py "packed": one `XADD` entry holding 256
   messages, 8 entries per pipeline.
4. consume 100 B from the start of a pre-filled queue (1,000,000 messages; 200,000 with
   --quick) with `StreamConsumer`; tidemq is filled with batches of 256 (one entry each),
   Redis with single entries; peers redis-py `XREAD COUNT 256` and `XREADGROUP COUNT 256` +
   `XACK`.
5. latency at a fixed 10,000 msg/s for 5 s (2 s with --quick), 100 B: produce-ack and end
   to end (the send time is in the payload; the consumer runs in this process, long
   polling), tidemq sync (and async, for reference); peer Redis AOF: redis.asyncio `XADD`
   + `XREAD BLOCK`. Open loop, in 1 ms ticks: the ~10 messages due at a tick are sent
   whether or not earlier ones were answered (tidemq: one `send_nowait` each; Redis: one
   pipeline per tick); a latency starts at the send call.

Machine ceilings, measured in the same run: buffered `os.write` + `fdatasync` of 256 KiB
(256 x 1 KiB: the Python group-commit ceiling for 1 KiB messages) and of 25.6 KiB (256 x
100 B), fdatasync latency after a 4 KiB append, loopback TCP (a Python socket pair
streaming 64 KiB `sendall`s), and loopback round trips of 200 B between two Python
processes (the floor under workload 1).

Each figure is the median of `--runs` runs (default 5; 3 with --quick) with the min-max;
systems take turns within each run, so drift hits them alike. A tidemq figure's ratio to a
peer is the median of the per-run ratios. Every loop stops at a message count, a byte
count or its time limit (2 s; 0.5 s with --quick), whichever comes first. A peer whose
server binary or Python client is missing is skipped. Results are printed and written to
benchmarks/results/broker.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib
import json
import mmap
import os
import platform
import random
import signal
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import FrameType
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np

import peers
import tidemq
from tidemq.aio import Admin, Producer, StreamConsumer
from tidemq.core.malloc_tuning import MMAP_THRESHOLD, TRIM_THRESHOLD

RESULTS = Path(__file__).resolve().parent / "results" / "broker.json"
SIZES = (100, 1024)
PIPELINE = 256
BATCH = 256
BATCHES_IN_FLIGHT = 8
#: tidemq's producer keeps up to 32 batches in flight per queue (its default window, what
#: the broker remembers per producer and queue); with sync flush a group commit covers what
#: is in flight, so the benchmark keeps the window full, as an application would.
TQ_BATCHES_IN_FLIGHT = 32
POOL = 1024  # distinct random values per size, cycled through
WARMUP_MESSAGES = 200
CONSUME_SIZE = 100
CONSUME_MESSAGES = 5_000_000  # P4: "from the start of a 5,000,000-message queue"
CONSUME_MESSAGES_QUICK = 1_000_000
LATENCY_RATE = 10_000
LATENCY_SIZE = 100
TICK_S = 0.001  # the latency workload's pacing tick
MAX_BYTES = 2 << 30  # per measurement, so no loop fills the disk or Redis' memory
REDIS_BENCHMARK_CLIENTS = BATCHES_IN_FLIGHT

W1, W2, W3, W4, W5 = "1", "2", "3", "4", "5"
WORKLOAD_TITLES = {
    W1: "1 one per round trip",
    W2: "2 256 in flight",
    W3: "3 batches of 256",
    W4: "4 consume, batch 256",
}


# --------------------------------------------------------------------------- results


@dataclass(slots=True)
class Series:
    """One system in one workload cell: a figure per run (None: that run failed)."""

    workload: str
    size: int
    system: str
    tidemq: bool
    unit: str = "msg/s"
    runs: list[float | None] = field(default_factory=list)
    extra: list[dict[str, Any]] = field(default_factory=list)

    def values(self) -> list[float]:
        return [v for v in self.runs if v is not None]

    def median(self) -> float | None:
        v = self.values()
        return statistics.median(v) if v else None


@dataclass(slots=True)
class Limits:
    seconds: float
    max_messages: int
    max_bytes: int = MAX_BYTES

    def messages(self, size: int) -> int:
        return max(1, min(self.max_messages, self.max_bytes // max(size, 1)))


@dataclass(slots=True)
class Env:
    quick: bool
    runs: int
    seconds: float
    root: Path | None
    pin: bool
    prefault: bool = True
    tidemq: dict[str, peers.Server] = field(default_factory=dict)
    redis_aof: peers.Server | None = None
    redis_none: peers.Server | None = None
    nats: peers.Server | None = None
    redis_benchmark: str | None = None
    skipped: dict[str, str] = field(default_factory=dict)
    counter: int = 0

    def name(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}-{self.counter}"


def values_pool(size: int, seed: int = 7) -> list[bytes]:
    rng = random.Random(seed + size)
    return [rng.randbytes(size) for _ in range(POOL)]


def split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def human(x: float | None) -> str:
    if x is None:
        return "-"
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= div:
            return f"{x / div:.3g}{suffix}"
    return f"{x:.3g}"


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    i = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[i]


def rate(messages: int, seconds: float) -> float:
    return messages / seconds if seconds > 0 else 0.0


# --------------------------------------------------------------------------- machine ceilings


def fdatasync_bandwidth(
    root: Path | None, chunk: int, seconds: float, max_bytes: int
) -> tuple[float, float]:
    """(bytes/s, syncs/s): `chunk`-byte os.write, each followed by fdatasync, to a new file."""
    fd, path = tempfile.mkstemp(prefix="bench-fsync-", dir=root)
    data = os.urandom(chunk)
    try:
        os.sync()
        n = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while n * chunk < max_bytes:
            os.write(fd, data)
            os.fdatasync(fd)
            n += 1
            if time.perf_counter() >= deadline:
                break
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(path)
    return n * chunk / elapsed, n / elapsed


def fdatasync_latency(root: Path | None, seconds: float, max_syncs: int) -> list[float]:
    """Seconds per fdatasync after a 4 KiB append."""
    fd, path = tempfile.mkstemp(prefix="bench-fsync-", dir=root)
    data = os.urandom(4096)
    out: list[float] = []
    try:
        deadline = time.perf_counter() + seconds
        while len(out) < max_syncs and time.perf_counter() < deadline:
            os.write(fd, data)
            t = time.perf_counter()
            os.fdatasync(fd)
            out.append(time.perf_counter() - t)
    finally:
        os.close(fd)
        os.unlink(path)
    return sorted(out)


def loopback_bandwidth(seconds: float, max_bytes: int) -> float:
    """Bytes/s over a 127.0.0.1 TCP connection: one thread sendall()s 64 KiB, this one
    recv_into()s."""
    chunk = 64 << 10
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    sender = socket.create_connection(listener.getsockname())
    receiver, _ = listener.accept()
    listener.close()
    stop = threading.Event()
    data = os.urandom(chunk)

    def send() -> None:
        with contextlib.suppress(OSError):
            while not stop.is_set():
                sender.sendall(data)

    thread = threading.Thread(target=send, daemon=True)
    buf = bytearray(chunk)
    view = memoryview(buf)
    try:
        thread.start()
        receiver.recv_into(view)  # started
        total = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while total < max_bytes:
            got = receiver.recv_into(view)
            if not got:
                break
            total += got
            if time.perf_counter() >= deadline:
                break
        elapsed = time.perf_counter() - t0
    finally:
        stop.set()
        with contextlib.suppress(OSError):
            sender.shutdown(socket.SHUT_RDWR)
        sender.close()
        receiver.close()
        thread.join(5)
    return total / elapsed


_ECHO_SERVER = """
import socket, sys
s = socket.socket(); s.bind(("127.0.0.1", 0)); s.listen(1)
print(s.getsockname()[1], flush=True)
c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
while d := c.recv(65536):
    c.sendall(d)
"""


def loopback_round_trips(seconds: float, max_round_trips: int) -> float:
    """Round trips/s of 200 bytes between this process and an echo server process
    (blocking sockets, TCP_NODELAY): the floor under any one-per-round-trip figure."""
    proc = subprocess.Popen([sys.executable, "-c", _ECHO_SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            data = b"x" * 200
            n = 0
            t0 = time.perf_counter()
            deadline = t0 + seconds
            while n < max_round_trips:
                sock.sendall(data)
                got = 0
                while got < len(data):
                    chunk = sock.recv(65536)
                    if not chunk:
                        raise ConnectionError("echo server closed")
                    got += len(chunk)
                n += 1
                if n & 63 == 0 and time.perf_counter() >= deadline:
                    break
            elapsed = time.perf_counter() - t0
    finally:
        proc.kill()
        proc.wait()
    return n / elapsed


def touch_fresh_memory(size: int) -> float:
    """Write one byte in every page of a new anonymous `size`-byte mapping, unmap it, and
    return the bytes/s.

    Why the benchmark does this: this machine is a KVM guest whose balloon reports free
    pages to the host (virtio-balloon free page reporting), and the host takes a reported
    page back, so the guest's next first write to it faults in the host: 18 GiB took
    18 s to touch the first time and 5.5 s right after. A run that writes gigabytes
    into new page cache (workload 3 with 1 KiB values) pays that on most of its pages:
    the tidemq broker's system time per 256 KiB batch tripled after its page cache outgrew
    the warm pool (about 3.5 GB), and its rate fell by a third, while the write + fdatasync
    ceiling, which deletes its file after each GiB, reuses warm pages. Touching as much
    memory as a run may write, right before the run (every system's alike), hands it
    pages the host has backed; the host takes them back again within minutes."""
    size = size // mmap.PAGESIZE * mmap.PAGESIZE
    if size <= 0:
        return 0.0
    t0 = time.perf_counter()
    with mmap.mmap(-1, size) as m:
        pages = np.frombuffer(m, dtype=np.uint8)
        pages[:: mmap.PAGESIZE] = 1
        del pages  # the mapping cannot close while a view exports it
    return size / (time.perf_counter() - t0)


def prefault_bytes() -> int:
    """What a run may write at most (MAX_BYTES), within a quarter of available memory."""
    try:
        with open("/proc/meminfo") as f:
            fields = dict(line.split(":", 1) for line in f)
        available = int(fields["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return 0
    return min(MAX_BYTES, available // 4)


def measure_ceilings(env: Env, series: list[Series]) -> dict[str, Any]:
    print("\n[ceilings] disk and loopback", flush=True)
    seconds = min(env.seconds, 1.0)
    fs_1k = Series("ceiling", 1024, "write 256 KiB + fdatasync", False, "B/s")
    fs_100 = Series("ceiling", 100, "write 25.6 KiB + fdatasync", False, "B/s")
    lo = Series("ceiling", 0, "loopback TCP, 64 KiB sendall", False, "B/s")
    rt = Series("ceiling", 200, "loopback round trips, 2 processes", False, "1/s")
    touch = Series("ceiling", 0, "first write to fresh memory (1 GiB)", False, "B/s")
    lat: list[list[float]] = []
    for _ in range(env.runs):
        touch.runs.append(touch_fresh_memory(min(1 << 30, prefault_bytes())))
        fs_1k.runs.append(fdatasync_bandwidth(env.root, 256 * 1024, seconds, 1 << 30)[0])
        fs_100.runs.append(fdatasync_bandwidth(env.root, 256 * 100, seconds, 1 << 30)[0])
        lo.runs.append(loopback_bandwidth(seconds, 16 << 30))
        rt.runs.append(loopback_round_trips(seconds, 1_000_000))
        lat.append(fdatasync_latency(env.root, seconds / 2, 20_000))
    series += [fs_1k, fs_100, lo, rt, touch]
    p50 = statistics.median(percentile(x, 0.5) for x in lat)
    p99 = statistics.median(percentile(x, 0.99) for x in lat)
    out = {
        "fdatasync_256KiB_Bps": fs_1k.median(),
        "fdatasync_256KiB_msgs_1KiB": (fs_1k.median() or 0) / 1024,
        "fdatasync_25600B_Bps": fs_100.median(),
        "fdatasync_25600B_msgs_100B": (fs_100.median() or 0) / 100,
        "loopback_Bps": lo.median(),
        "loopback_round_trips_per_s": rt.median(),
        "fdatasync_4KiB_p50_ms": p50 * 1000,
        "fdatasync_4KiB_p99_ms": p99 * 1000,
        "first_touch_Bps": touch.median(),
    }
    print(
        f"  write 256 KiB + fdatasync: {human(fs_1k.median())}B/s "
        f"(= {human(out['fdatasync_256KiB_msgs_1KiB'])} msg/s of 1 KiB); "
        f"25.6 KiB + fdatasync: {human(fs_100.median())}B/s "
        f"(= {human(out['fdatasync_25600B_msgs_100B'])} msg/s of 100 B)\n"
        f"  fdatasync after 4 KiB: p50 {p50 * 1000:.2f} ms, p99 {p99 * 1000:.2f} ms; "
        f"loopback TCP {human(lo.median())}B/s; "
        f"round trips (200 B, 2 Python processes) {human(rt.median())}/s\n"
        f"  first write to fresh memory: {human(touch.median())}B/s "
        f"({human(min(touch.values(), default=0))}-{human(max(touch.values(), default=0))})",
        flush=True,
    )
    return out


# --------------------------------------------------------------------------- tidemq


async def tq_topic(address: str, prefix: str, env: Env) -> str:
    topic = env.name(prefix)
    async with Admin(address) as admin:
        await admin.create_topic(topic, 1)
    return topic


async def tq_drop(address: str, topic: str) -> None:
    with contextlib.suppress(Exception):
        async with Admin(address) as admin:
            await admin.delete_topic(topic)


async def tq_produce(env: Env, address: str, workload: str, size: int, lim: Limits) -> float:
    """msg/s into a fresh one-queue topic (1: send, 2: send_nowait x 256, 3: send_batch)."""
    topic = await tq_topic(address, f"w{workload}-{size}", env)
    values = values_pool(size)
    mask = POOL - 1
    producer = Producer(address)
    try:
        for i in range(WARMUP_MESSAGES):
            await producer.send(topic, values[i & mask])
        cap = lim.messages(size)
        n = 0
        t0 = time.perf_counter()
        deadline = t0 + lim.seconds
        if workload == W1:
            send = producer.send
            while n < cap:
                await send(topic, values[n & mask])
                n += 1
                if n & 15 == 0 and time.perf_counter() >= deadline:
                    break
        elif workload == W2:
            send_nowait = producer.send_nowait
            while n < cap:
                futures = [
                    await send_nowait(topic, values[(n + i) & mask]) for i in range(PIPELINE)
                ]
                await asyncio.gather(*futures)
                n += PIPELINE
                if time.perf_counter() >= deadline:
                    break
        else:
            batches = [values[i : i + BATCH] for i in range(0, POOL, BATCH)]
            inflight: deque[asyncio.Future[Any]] = deque()
            b = 0
            while n < cap and time.perf_counter() < deadline:
                while len(inflight) < TQ_BATCHES_IN_FLIGHT:
                    batch = batches[b % len(batches)]
                    inflight.append(await producer.send_batch_nowait(topic, batch))
                    b += 1
                    n += BATCH
                await inflight.popleft()
            for fut in inflight:
                await fut
        elapsed = time.perf_counter() - t0
    finally:
        await producer.close()
        await tq_drop(address, topic)
    return rate(n, elapsed)


async def tq_prefill(address: str, topic: str, size: int, total: int) -> None:
    values = values_pool(size)
    batches = [values[i : i + BATCH] for i in range(0, POOL, BATCH)]
    async with Producer(address) as producer:
        inflight: deque[asyncio.Future[Any]] = deque()
        n = 0
        b = 0
        while n < total:
            while len(inflight) < TQ_BATCHES_IN_FLIGHT and n < total:
                batch = batches[b % len(batches)][: total - n]
                inflight.append(await producer.send_batch_nowait(topic, batch))
                b += 1
                n += len(batch)
            await inflight.popleft()
        for fut in inflight:
            await fut


async def tq_consume(
    address: str, topic: str, total: int, seconds: float, *, columnar: bool = False
) -> float:
    """msg/s reading one queue from its start: `poll` (a Message per message) or, with
    `columnar`, `poll_batches` (numpy offsets and memoryview data over the received
    bytes, as a bulk reader hands them to Arrow or numpy; no object per message)."""
    consumer = StreamConsumer(address, start="earliest")
    try:
        consumer.assign([(topic, 0)])
        await consumer.seek_to_beginning()  # connection and routes, outside the clock
        n = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while n < total and time.perf_counter() < deadline:
            if columnar:
                batches = await consumer.poll_batches(1000)
                if not batches:
                    break
                n += sum(len(b) for b in batches)
                continue
            batch = await consumer.poll(1000)
            if not batch:
                break
            n += len(batch)
        elapsed = time.perf_counter() - t0
    finally:
        await consumer.close()
    return rate(n, elapsed)


# --------------------------------------------------------------------------- redis


def redis_client(server: peers.Server) -> Any:
    import redis  # noqa: PLC0415 - optional peer

    host, port = split(server.address)
    return redis.Redis(host=host, port=port)


def redis_produce(env: Env, server: peers.Server, workload: str, size: int, lim: Limits) -> float:
    """1: XADD per round trip; 2: pipeline of 256 XADD; 3: packed (8 entries x 256
    messages per pipeline)."""
    r = redis_client(server)
    key = env.name(f"w{workload}-{size}")
    values = values_pool(size)
    try:
        for i in range(WARMUP_MESSAGES):
            r.xadd(key, {"v": values[i % POOL]})
        t0 = time.perf_counter()
        n = _redis_loop(r, key, workload, values, cap=lim.messages(size), deadline=t0 + lim.seconds)
        elapsed = time.perf_counter() - t0
    finally:
        with contextlib.suppress(Exception):
            r.delete(key)
        r.close()
    return rate(n, elapsed)


def _redis_loop(
    r: Any, key: str, workload: str, values: list[bytes], *, cap: int, deadline: float
) -> int:
    mask = POOL - 1
    n = 0
    if workload == W1:
        xadd = r.xadd
        while n < cap:
            xadd(key, {"v": values[n & mask]})
            n += 1
            if n & 15 == 0 and time.perf_counter() >= deadline:
                break
        return n
    blobs = [b"".join(values[i : i + BATCH]) for i in range(0, POOL, BATCH)]
    while n < cap:
        pipe = r.pipeline(transaction=False)
        if workload == W2:
            for i in range(PIPELINE):
                pipe.xadd(key, {"v": values[(n + i) & mask]})
            n += PIPELINE
        else:
            for i in range(BATCHES_IN_FLIGHT):
                pipe.xadd(key, {"v": blobs[i % len(blobs)]})
            n += BATCH * BATCHES_IN_FLIGHT
        pipe.execute()
        if time.perf_counter() >= deadline:
            break
    return n


class RedisBenchmark:
    """`redis-benchmark -c 8 -P 256 -n N XADD key * f <value>`, N sized from the last run
    so that a run takes about `seconds`."""

    def __init__(self, binary: str) -> None:
        self.binary = binary
        self.guess: dict[tuple[str, int], float] = {}

    def run(self, env: Env, server: peers.Server, size: int, lim: Limits) -> float:
        host, port = split(server.address)
        key = env.name(f"rb-{size}")
        guess = self.guess.get((server.name, size), 200_000.0)
        n = int(min(lim.messages(size), max(guess * lim.seconds, 20 * PIPELINE)))
        value = "__rand_int__" + "x" * (size - 12)  # -r: distinct values
        argv = [
            self.binary,
            "-h",
            host,
            "-p",
            str(port),
            "-c",
            str(REDIS_BENCHMARK_CLIENTS),
            "-P",
            str(PIPELINE),
            "-n",
            str(n),
            "-r",
            "1000000000",
            "--csv",
            "XADD",
            key,
            "*",
            "f",
            value,
        ]
        try:
            out = subprocess.run(
                argv,
                capture_output=True,
                text=True,
                timeout=lim.seconds * 20 + 60,
                check=True,
                start_new_session=True,
            )
        finally:
            with contextlib.suppress(Exception):
                r = redis_client(server)
                r.delete(key)
                r.close()
        rps = parse_redis_benchmark(out.stdout)
        self.guess[(server.name, size)] = rps
        return rps


def parse_redis_benchmark(text: str) -> float:
    """The requests per second from `--csv` output (the first numeric field of the last
    data line)."""
    for line in reversed(text.strip().splitlines()):
        fields = [f.strip('"') for f in line.split('","')]
        for f in fields[1:]:
            try:
                return float(f)
            except ValueError:
                continue
    raise ValueError(f"cannot parse redis-benchmark output: {text[-300:]!r}")


def redis_prefill(server: peers.Server, key: str, size: int, total: int) -> None:
    r = redis_client(server)
    values = values_pool(size)
    try:
        n = 0
        while n < total:
            pipe = r.pipeline(transaction=False)
            for i in range(min(PIPELINE, total - n)):
                pipe.xadd(key, {"v": values[(n + i) % POOL]})
            pipe.execute()
            n += min(PIPELINE, total - n)
    finally:
        r.close()


def redis_consume(
    env: Env, server: peers.Server, key: str, total: int, seconds: float, *, group: bool
) -> float:
    r = redis_client(server)
    try:
        name = env.name("g")
        if group:
            r.xgroup_create(key, name, id="0")
        r.ping()
        n = 0
        last: bytes | str = "0-0"
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while n < total and time.perf_counter() < deadline:
            if group:
                resp = r.xreadgroup(name, "c1", {key: ">"}, count=BATCH)
            else:
                resp = r.xread({key: last}, count=BATCH)
            if not resp:
                break
            entries = resp[0][1]
            if not entries:
                break
            if group:
                r.xack(key, name, *[e[0] for e in entries])
            else:
                last = entries[-1][0]
            n += len(entries)
        elapsed = time.perf_counter() - t0
        if group:
            r.xgroup_destroy(key, name)
    finally:
        r.close()
    return rate(n, elapsed)


# --------------------------------------------------------------------------- nats


async def nats_produce(
    env: Env, server: peers.Server, workload: str, size: int, lim: Limits
) -> float:
    import nats  # noqa: PLC0415 - optional peer
    from nats.js.api import StorageType, StreamConfig  # noqa: PLC0415

    nc = await nats.connect(f"nats://{server.address}", allow_reconnect=False)
    stream = env.name(f"W{workload}S{size}")
    subject = f"bench.{stream}"
    values = values_pool(size)
    mask = POOL - 1
    try:
        js = nc.jetstream()
        await js.add_stream(
            StreamConfig(name=stream, subjects=[subject], storage=StorageType.FILE, num_replicas=1)
        )
        try:
            for i in range(WARMUP_MESSAGES):
                await js.publish(subject, values[i & mask])
            cap = lim.messages(size)
            n = 0
            t0 = time.perf_counter()
            deadline = t0 + lim.seconds
            if workload == W1:
                publish = js.publish
                while n < cap:
                    await publish(subject, values[n & mask])
                    n += 1
                    if n & 15 == 0 and time.perf_counter() >= deadline:
                        break
            else:
                while n < cap:
                    await asyncio.gather(
                        *(js.publish(subject, values[(n + i) & mask]) for i in range(PIPELINE))
                    )
                    n += PIPELINE
                    if time.perf_counter() >= deadline:
                        break
            elapsed = time.perf_counter() - t0
        finally:
            with contextlib.suppress(Exception):
                await js.delete_stream(stream)
    finally:
        await nc.close()
    return rate(n, elapsed)


# --------------------------------------------------------------------------- latency


@dataclass(slots=True)
class Latency:
    sent: int
    acked: int
    received: int
    seconds: float
    ack: list[float]  # seconds, sorted
    e2e: list[float]

    def summary(self) -> dict[str, float]:
        return {
            "rate": self.sent / self.seconds if self.seconds else 0.0,
            "sent": self.sent,
            "acked": self.acked,
            "received": self.received,
            "ack_p50_ms": percentile(self.ack, 0.5) * 1000,
            "ack_p99_ms": percentile(self.ack, 0.99) * 1000,
            "ack_p999_ms": percentile(self.ack, 0.999) * 1000,
            "ack_max_ms": (self.ack[-1] if self.ack else float("nan")) * 1000,
            "e2e_p50_ms": percentile(self.e2e, 0.5) * 1000,
            "e2e_p99_ms": percentile(self.e2e, 0.99) * 1000,
            "e2e_p999_ms": percentile(self.e2e, 0.999) * 1000,
            "e2e_max_ms": (self.e2e[-1] if self.e2e else float("nan")) * 1000,
        }


Due = list[tuple[bytes, int]]  # (payload, send time in perf_counter ns)


async def paced(
    total: int, seconds: float, send_due: Callable[[Due], Awaitable[None]], size: int
) -> tuple[int, float]:
    """Offer LATENCY_RATE messages per second until `total` or `seconds` (+1 s grace): every
    TICK_S the messages due so far (10 at 10,000 msg/s) go to `send_due` as one list,
    answered or not (open loop)."""
    pad = os.urandom(max(0, size - 8))
    perf_ns = time.perf_counter_ns
    t0 = time.perf_counter()
    deadline = t0 + seconds + 1.0
    i = 0
    while i < total:
        now = time.perf_counter()
        if now >= deadline:
            break
        due = min(total, int((now - t0) * LATENCY_RATE) + 1)
        items: Due = []
        while i < due:
            ns = perf_ns()
            items.append((struct.pack("<q", ns) + pad, ns))
            i += 1
        await send_due(items)
        # Ticks of at least TICK_S: a shorter sleep returns at once and the loop would spin,
        # taking the CPU from the clients measured.
        await asyncio.sleep(max(TICK_S, t0 + i / LATENCY_RATE - time.perf_counter()))
    return i, time.perf_counter() - t0


async def wait_for(predicate: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not predicate() and time.monotonic() < deadline:
        await asyncio.sleep(0.01)


async def tq_latency(env: Env, address: str, seconds: float) -> Latency:
    """Each due message is one `send_nowait` (the producer batches what one loop tick
    sends); the consumer long-polls in a task of its own."""
    topic = await tq_topic(address, "lat", env)
    total = int(LATENCY_RATE * seconds)
    ack: list[float] = []
    e2e: list[float] = []
    producer = Producer(address)
    consumer = StreamConsumer(address, start="latest")
    perf_ns = time.perf_counter_ns
    done = asyncio.Event()

    async def consume() -> None:
        while len(e2e) < total and not done.is_set():
            for m in await consumer.poll(200):
                now = perf_ns()
                sent = struct.unpack_from("<q", m.value or bytes(8))[0]
                if sent:
                    e2e.append((now - sent) / 1e9)

    def on_ack(ns: int, fut: asyncio.Future[Any]) -> None:
        if not fut.cancelled() and fut.exception() is None:
            ack.append((perf_ns() - ns) / 1e9)

    async def send_due(items: Due) -> None:
        for payload, ns in items:
            fut = await producer.send_nowait(topic, payload)
            fut.add_done_callback(functools.partial(on_ack, ns))

    reader: asyncio.Task[None] | None = None
    try:
        consumer.assign([(topic, 0)])
        for _ in range(WARMUP_MESSAGES // 10):
            await producer.send(topic, bytes(8))
        await consumer.seek_to_end()
        reader = asyncio.get_running_loop().create_task(consume())
        sent, elapsed = await paced(total, seconds, send_due, LATENCY_SIZE)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds * 2 + 10):
                await producer.flush()
        await wait_for(lambda: len(e2e) >= sent, 5.0)
    finally:
        done.set()
        if reader is not None:
            with contextlib.suppress(Exception):
                await reader
        await consumer.close()
        await producer.close()
        await tq_drop(address, topic)
    return Latency(sent, len(ack), len(e2e), elapsed, sorted(ack), sorted(e2e))


async def redis_latency(env: Env, server: peers.Server, seconds: float) -> Latency:
    """The messages due at a wake-up go out as one pipeline of XADDs (what the tidemq
    producer does with one loop tick's sends), each pipeline in a task of its own on a
    pool of up to 16 connections; the consumer is `XREAD BLOCK` on its own connection."""
    import redis.asyncio as aioredis  # noqa: PLC0415 - optional peer

    host, port = split(server.address)
    pool = aioredis.BlockingConnectionPool(host=host, port=port, max_connections=16, timeout=None)
    writer: Any = aioredis.Redis(connection_pool=pool)
    reader_client: Any = aioredis.Redis(host=host, port=port)
    key = env.name("lat")
    total = int(LATENCY_RATE * seconds)
    ack: list[float] = []
    e2e: list[float] = []
    perf_ns = time.perf_counter_ns
    done = asyncio.Event()
    last_id: bytes | str = "0-0"
    tasks: set[asyncio.Task[None]] = set()

    async def consume() -> None:
        nonlocal last_id
        while len(e2e) < total and not done.is_set():
            resp = await reader_client.xread({key: last_id}, count=BATCH, block=200)
            now = perf_ns()
            for _, entries in resp or ():
                for entry_id, fields in entries:
                    sent = struct.unpack_from("<q", fields[b"v"])[0]
                    if sent:
                        e2e.append((now - sent) / 1e9)
                    last_id = entry_id

    async def pipeline(items: Due) -> None:
        pipe = writer.pipeline(transaction=False)
        for payload, _ in items:
            pipe.xadd(key, {"v": payload})
        await pipe.execute()
        now = perf_ns()
        ack.extend((now - ns) / 1e9 for _, ns in items)

    async def send_due(items: Due) -> None:
        task = asyncio.get_running_loop().create_task(pipeline(items))
        tasks.add(task)
        task.add_done_callback(tasks.discard)

    reader: asyncio.Task[None] | None = None
    try:
        for _ in range(WARMUP_MESSAGES // 10):
            await writer.xadd(key, {"v": bytes(8)})
        last_id = (await writer.xinfo_stream(key))["last-generated-id"]
        reader = asyncio.get_running_loop().create_task(consume())
        sent, elapsed = await paced(total, seconds, send_due, LATENCY_SIZE)
        if tasks:
            await asyncio.wait(tasks, timeout=seconds * 2 + 10)
        await wait_for(lambda: len(e2e) >= sent, 5.0)
    finally:
        done.set()
        if reader is not None:
            with contextlib.suppress(Exception):
                await reader
        for task in tasks:
            task.cancel()
        with contextlib.suppress(Exception):
            await writer.delete(key)
        await writer.aclose()
        await reader_client.aclose()
        await pool.aclose()
    return Latency(sent, len(ack), len(e2e), elapsed, sorted(ack), sorted(e2e))


# --------------------------------------------------------------------------- driver

Runner = Callable[[], Awaitable[float]]


def sync_runner(fn: Callable[[], float]) -> Runner:
    async def run() -> float:
        return fn()

    return run


async def measure(
    env: Env, cell: list[tuple[Series, Runner]], timeout_s: float, *, prefault: bool = False
) -> None:
    """Run every contender once per run, in turn; record msg/s (None on failure).
    `prefault`: touch fresh memory before each (`touch_fresh_memory`)."""
    for run in range(env.runs):
        for s, runner in cell:
            if prefault and env.prefault:
                touch_fresh_memory(prefault_bytes())
            try:
                async with asyncio.timeout(timeout_s):
                    value = await runner()
            except Exception as exc:
                print(f"    {s.system}: run {run + 1} failed: {type(exc).__name__}: {exc}")
                value = None
            s.runs.append(value)
        line = ", ".join(f"{s.system} {human(s.runs[-1])}" for s, _ in cell)
        print(f"    run {run + 1}/{env.runs}: {line}", flush=True)


def redis_label(server: peers.Server) -> str:
    return "AOF everysec" if server.name == "redis-aof" else "no persistence"


TIDEMQ_LABEL = {W1: "send", W2: "send_nowait x256", W3: f"send_batch 256 x{TQ_BATCHES_IN_FLIGHT}"}
REDIS_LABEL = {W1: "XADD", W2: "pipeline 256 XADD", W3: "packed XADD 256 msgs x8"}
NATS_LABEL = {W1: "js.publish", W2: "gather 256 js.publish"}


def produce_cell(
    env: Env, workload: str, size: int, lim: Limits, rb: RedisBenchmark | None
) -> list[tuple[Series, Runner]]:
    cell: list[tuple[Series, Runner]] = []
    for flush, server in env.tidemq.items():
        cell.append(
            (
                Series(workload, size, f"tidemq {flush} flush ({TIDEMQ_LABEL[workload]})", True),
                functools.partial(tq_produce, env, server.address, workload, size, lim),
            )
        )
    redis_servers = [env.redis_aof] if workload != W3 else [env.redis_aof, env.redis_none]
    for rs in redis_servers:
        if rs is None:
            continue
        cell.append(
            (
                Series(
                    workload, size, f"redis-py {REDIS_LABEL[workload]} ({redis_label(rs)})", False
                ),
                sync_runner(functools.partial(redis_produce, env, rs, workload, size, lim)),
            )
        )
        if workload == W3 and rb is not None:
            name = f"redis-benchmark -c {REDIS_BENCHMARK_CLIENTS} -P 256 XADD ({redis_label(rs)})"
            cell.append(
                (
                    Series(workload, size, name, False),
                    sync_runner(functools.partial(rb.run, env, rs, size, lim)),
                )
            )
    if env.nats is not None and workload in NATS_LABEL:
        cell.append(
            (
                Series(workload, size, f"nats-py {NATS_LABEL[workload]} (file)", False),
                functools.partial(nats_produce, env, env.nats, workload, size, lim),
            )
        )
    return cell


async def throughput_workloads(env: Env, only: set[str]) -> list[Series]:
    out: list[Series] = []
    limits = {
        W1: Limits(env.seconds, 1_000_000),
        W2: Limits(env.seconds, 50_000_000),
        W3: Limits(env.seconds, 500_000_000),
    }
    rb = RedisBenchmark(env.redis_benchmark) if env.redis_benchmark else None
    timeout = env.seconds * 20 + 120
    for workload in (W1, W2, W3):
        if workload not in only:
            continue
        for size in SIZES:
            print(f"\n[{WORKLOAD_TITLES[workload]}] {size} B", flush=True)
            cell = produce_cell(env, workload, size, limits[workload], rb)
            # Only batches write gigabytes of new page cache (or Redis memory) per run.
            await measure(env, cell, timeout, prefault=workload == W3)
            out += [s for s, _ in cell]
    return out


async def consume_workload(env: Env) -> list[Series]:
    total = CONSUME_MESSAGES_QUICK if env.quick else CONSUME_MESSAGES
    seconds = max(env.seconds * 5, 5.0)
    print(f"\n[{WORKLOAD_TITLES[W4]}] {CONSUME_SIZE} B, {total:,} messages", flush=True)
    cell: list[tuple[Series, Runner]] = []
    server = env.tidemq.get("async") or next(iter(env.tidemq.values()))
    topic = await tq_topic(server.address, "consume", env)
    rs = env.redis_aof
    key = env.name("consume")
    try:
        t = time.perf_counter()
        await tq_prefill(server.address, topic, CONSUME_SIZE, total)
        print(f"  prefilled tidemq in {time.perf_counter() - t:.1f} s", flush=True)
        cell.append(
            (
                Series(W4, CONSUME_SIZE, f"tidemq StreamConsumer ({server.name})", True),
                functools.partial(tq_consume, server.address, topic, total, seconds),
            )
        )
        cell.append(
            (
                Series(W4, CONSUME_SIZE, f"tidemq poll_batches ({server.name})", True),
                functools.partial(tq_consume, server.address, topic, total, seconds, columnar=True),
            )
        )
        if rs is not None:
            t = time.perf_counter()
            redis_prefill(rs, key, CONSUME_SIZE, total)
            print(f"  prefilled redis in {time.perf_counter() - t:.1f} s", flush=True)
            for group, label in ((False, "XREAD COUNT 256"), (True, "XREADGROUP COUNT 256 + XACK")):
                cell.append(
                    (
                        Series(W4, CONSUME_SIZE, f"redis-py {label} ({redis_label(rs)})", False),
                        sync_runner(
                            functools.partial(
                                redis_consume, env, rs, key, total, seconds, group=group
                            )
                        ),
                    )
                )
        await measure(env, cell, seconds * 4 + 60)
    finally:
        await tq_drop(server.address, topic)
        if rs is not None:
            with contextlib.suppress(Exception):
                r = redis_client(rs)
                r.delete(key)
                r.close()
    return [s for s, _ in cell]


async def latency_workload(env: Env) -> list[Series]:
    seconds = 2.0 if env.quick else 5.0
    print(f"\n[5 latency] {LATENCY_RATE:,} msg/s for {seconds:g} s, {LATENCY_SIZE} B", flush=True)
    contenders: list[tuple[Series, Callable[[], Awaitable[Latency]]]] = []
    for flush in ("sync", "async"):
        server = env.tidemq.get(flush)
        if server is not None:
            contenders.append(
                (
                    Series(W5, LATENCY_SIZE, f"tidemq {flush} flush", True, "ms"),
                    functools.partial(tq_latency, env, server.address, seconds),
                )
            )
    if env.redis_aof is not None:
        name = "redis.asyncio XADD pipeline/tick + XREAD BLOCK (AOF)"
        contenders.append(
            (
                Series(W5, LATENCY_SIZE, name, False, "ms"),
                functools.partial(redis_latency, env, env.redis_aof, seconds),
            )
        )
    for run in range(env.runs):
        parts = []
        for s, runner in contenders:
            try:
                async with asyncio.timeout(seconds * 4 + 60):
                    result = (await runner()).summary()
                s.runs.append(result["e2e_p99_ms"])
                s.extra.append(result)
                parts.append(
                    f"{s.system}: ack p50/p99 {result['ack_p50_ms']:.2f}/{result['ack_p99_ms']:.2f}"
                    f", e2e {result['e2e_p50_ms']:.2f}/{result['e2e_p99_ms']:.2f} ms"
                )
            except Exception as exc:
                print(f"    {s.system}: run {run + 1} failed: {type(exc).__name__}: {exc}")
                s.runs.append(None)
                s.extra.append({})
        print(f"    run {run + 1}/{env.runs}: " + "; ".join(parts), flush=True)
    return [s for s, _ in contenders]


# --------------------------------------------------------------------------- report


def run_ratios(a: Series, b: Series) -> list[float]:
    return [x / y for x, y in zip(a.runs, b.runs, strict=False) if x is not None and y]


def ratio_text(series: list[Series]) -> dict[int, list[tuple[str, float, float, float]]]:
    """For each tidemq series (by index): (peer, median, min, max) of per-run ratios."""
    out: dict[int, list[tuple[str, float, float, float]]] = {}
    for i, s in enumerate(series):
        if not s.tidemq or s.workload in ("ceiling", W5):
            continue
        for p in series:
            if p.tidemq or p.workload != s.workload or p.size != s.size:
                continue
            rr = run_ratios(s, p)
            if rr:
                out.setdefault(i, []).append((p.system, statistics.median(rr), min(rr), max(rr)))
    return out


def short_peer(system: str) -> str:
    return (
        system.replace("redis-benchmark -c 8 -P 256 XADD", "redis-benchmark")
        .replace("pipeline 256 XADD", "pipeline")
        .replace("packed XADD 256 msgs x8", "packed")
        .replace("gather 256 js.publish", "gather")
        .replace("AOF everysec", "AOF")
        .replace("no persistence", "none")
        .replace("XREADGROUP COUNT 256 + XACK", "XREADGROUP+XACK")
        .replace("XREAD COUNT 256", "XREAD")
    )


def print_throughput(series: list[Series], ceilings: dict[str, Any]) -> list[dict[str, Any]]:
    ratios = ratio_text(series)
    rows: list[dict[str, Any]] = []
    if not any(s.workload in (W1, W2, W3, W4) for s in series):
        return rows
    print("\n" + "=" * 100)
    print(
        "Throughput: median of runs (min-max), MB/s of payload; a tidemq figure's ratio to a peer"
    )
    print("is the median of the per-run ratios (min-max)")
    header = (
        f"{'workload':<22} {'size':>5}  {'system':<52} {'msg/s':>7} {'min-max':>13} {'MB/s':>7}"
    )
    print(header)
    print("-" * len(header))
    last = None
    for i, s in enumerate(series):
        if s.workload in ("ceiling", W5):
            continue
        v = s.values()
        median = s.median()
        mbs = (median or 0) * s.size / 1e6
        title = WORKLOAD_TITLES[s.workload] if (s.workload, s.size) != last else ""
        last = (s.workload, s.size)
        spread = f"{human(min(v))}-{human(max(v))}" if v else "-"
        print(
            f"{title:<22} {s.size:>5}  {s.system:<52} {human(median):>7} {spread:>13} {mbs:>7.1f}"
        )
        row: dict[str, Any] = {
            "workload": s.workload,
            "size": s.size,
            "system": s.system,
            "median": median,
            "min": min(v) if v else None,
            "max": max(v) if v else None,
            "mb_s": mbs,
            "ratios": {},
        }
        for peer, med_r, lo_r, hi_r in ratios.get(i, []):
            print(f"{'':<30}  -> {med_r:.3g}x {short_peer(peer)} ({lo_r:.2g}-{hi_r:.2g})")
            row["ratios"][peer] = {"median": med_r, "min": lo_r, "max": hi_r}
        if s.tidemq and s.workload == W3 and median:
            key = "fdatasync_256KiB_msgs_1KiB" if s.size == 1024 else "fdatasync_25600B_msgs_100B"
            ceiling = ceilings.get(key)
            if ceiling:
                r = median / ceiling
                print(f"{'':<30}  -> {r:.3g}x group-commit ceiling (256 msgs/write + fdatasync)")
                row["ratios"]["group_commit_ceiling"] = {"median": r}
        rows.append(row)
    return rows


def print_latency(series: list[Series]) -> list[dict[str, Any]]:
    lat = [s for s in series if s.workload == W5]
    rows: list[dict[str, Any]] = []
    if not lat:
        return rows
    print(
        f"\nLatency at {LATENCY_RATE:,} msg/s, {LATENCY_SIZE} B: ms, median over runs of each run's"
    )
    print("percentile (e2e p99 min-max over runs); rate = achieved msg/s")
    h = (
        f"{'system':<52} {'ack p50':>8} {'ack p99':>8} {'e2e p50':>8} {'e2e p99':>8} "
        f"{'p99 min-max':>13} {'rate':>6}"
    )
    print(h)
    print("-" * len(h))
    summaries: dict[str, dict[str, float]] = {}
    for s in lat:
        ok = [e for e in s.extra if e]
        if not ok:
            print(f"{s.system:<52} failed")
            continue
        summary = {k: statistics.median(e[k] for e in ok) for k in ok[0]}
        summaries[s.system] = summary
        p99s = [e["e2e_p99_ms"] for e in ok]
        spread = f"{min(p99s):.2f}-{max(p99s):.2f}"
        print(
            f"{s.system:<52} {summary['ack_p50_ms']:>8.2f} {summary['ack_p99_ms']:>8.2f} "
            f"{summary['e2e_p50_ms']:>8.2f} {summary['e2e_p99_ms']:>8.2f} {spread:>13} "
            f"{human(summary['rate']):>6}"
        )
        rows.append({"workload": W5, "size": s.size, "system": s.system, **summary})
    peer = next((summaries.get(s.system) for s in lat if not s.tidemq), None)
    if peer:
        for s in lat:
            mine = summaries.get(s.system)
            if s.tidemq and mine:
                ack = mine["ack_p99_ms"] / peer["ack_p99_ms"]
                e2e = mine["e2e_p99_ms"] / peer["e2e_p99_ms"]
                print(
                    f"  {s.system}: p99 {ack:.3g}x redis (ack), {e2e:.3g}x (e2e); lower is better"
                )
    return rows


# --------------------------------------------------------------------------- environment


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def filesystem_of(path: Path) -> str:
    real = str(path.resolve())
    best = ("", "unknown", "unknown")
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return "unknown"
    for line in mounts:
        dev, mnt, fstype, *_ = line.split()
        inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= len(best[0]):
            best = (mnt, fstype, dev)
    return f"{best[1]} ({best[2]} on {best[0]})"


def loadavg() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def steal_share(used: peers.Jiffies) -> float:
    """The share of the CPUs' time the hypervisor gave to other guests over `used`: on a
    shared virtual machine, the first suspect when every system is slower than usual."""
    return used.steal / used.total if used.total > 0 else 0.0


def client_loop_factory() -> tuple[Callable[[], asyncio.AbstractEventLoop] | None, str]:
    """The client processes' event loop (uvloop when installed). Also sets the malloc
    thresholds the user guide recommends for producers of large batches (every client of
    the run, tidemq's and the peers', is in this process and gets them)."""
    tidemq.tune_malloc()
    try:
        uvloop: Any = importlib.import_module("uvloop")
    except ImportError:
        return None, "asyncio"
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory, "uvloop"


def server_uvloop() -> bool:
    """The CLI server runs uvloop when its interpreter (this venv's) can import it."""
    exe = peers.VENV_BIN / "python"
    python = str(exe) if exe.exists() else sys.executable
    code = "import importlib.util,sys; sys.exit(0 if importlib.util.find_spec('uvloop') else 1)"
    return subprocess.run([python, "-c", code], check=False).returncode == 0


def environment(env: Env, loop_name: str) -> dict[str, Any]:
    root = env.root or Path(tempfile.gettempdir())
    return {
        "python": sys.version.split()[0],
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "filesystem": filesystem_of(root),
        "directory": str(root),
        "client_loop": loop_name,
        "client_malloc": "tidemq.tune_malloc(): glibc mmap threshold "
        f"{MMAP_THRESHOLD >> 20} MiB, trim threshold {TRIM_THRESHOLD >> 20} MiB",
        "server_uvloop": server_uvloop(),
        "tidemq_flush": "sync and async (async: fdatasync every flush_interval_ms=500)",
        "redis_persistence": "appendonly yes, appendfsync everysec, save ''; "
        "workload 3 also without persistence",
        "nats_persistence": "JetStream file storage, R1 (2.9: no fsync per message)",
        "client_server_share_box": True,
        "pinned": "servers on CPU 1, clients on CPU 0" if env.pin else "no",
        "prefault": f"{prefault_bytes() >> 20} MiB of fresh memory touched before each run "
        "of workload 3"
        if env.prefault
        else "no",
        "runs": env.runs,
        "seconds_per_run": env.seconds,
        "quick": env.quick,
        "pipeline": PIPELINE,
        "batch": BATCH,
        "batches_in_flight": {"tidemq": TQ_BATCHES_IN_FLIGHT, "redis": BATCHES_IN_FLIGHT},
        "versions": peers.versions(),
        "skipped": env.skipped,
        "loadavg_before": loadavg(),
    }


def print_environment(info: dict[str, Any]) -> None:
    print("Configuration")
    for k, v in info.items():
        text = v
        if k == "versions":
            text = ", ".join(f"{a}={b}" for a, b in v.items())
        if k == "skipped":
            text = ", ".join(f"{a}: skipped: not installed ({b})" for a, b in v.items()) or "none"
        print(f"  {k:<24} {text}")


# --------------------------------------------------------------------------- main


def start_servers(env: Env, stack: contextlib.ExitStack, only: set[str]) -> None:
    cpus = [1] if env.pin and (os.cpu_count() or 1) > 1 else None
    for flush in ("sync", "async"):
        env.tidemq[flush] = stack.enter_context(peers.start_tidemq(flush, root=env.root, cpus=cpus))
    need_redis = bool(only & {W1, W2, W3, W4, W5})
    missing = peers.redis_available()
    if missing:
        env.skipped["redis"] = missing
        print(f"redis: skipped: not installed ({missing})")
    elif need_redis:
        env.redis_aof = stack.enter_context(
            peers.start_redis(appendonly=True, root=env.root, cpus=cpus)
        )
        if W3 in only:
            env.redis_none = stack.enter_context(
                peers.start_redis(appendonly=False, root=env.root, cpus=cpus)
            )
        env.redis_benchmark = peers.redis_benchmark_binary()
        if env.redis_benchmark is None:
            env.skipped["redis-benchmark"] = "redis-benchmark binary"
            print("redis-benchmark: skipped: not installed")
    missing = peers.nats_available()
    if missing:
        env.skipped["nats"] = missing
        print(f"nats: skipped: not installed ({missing})")
    elif only & {W1, W2}:
        env.nats = stack.enter_context(peers.start_nats(root=env.root, cpus=cpus))
    print(
        "servers: "
        + ", ".join(
            f"{s.name} pid {s.pid} on {s.address}"
            for s in [*env.tidemq.values(), env.redis_aof, env.redis_none, env.nats]
            if s is not None
        ),
        flush=True,
    )


async def run_all(env: Env, only: set[str], ceilings: dict[str, Any]) -> list[Series]:
    series: list[Series] = []
    if "ceilings" in only:
        ceilings.update(measure_ceilings(env, series))
    series += await throughput_workloads(env, only)
    if W4 in only:
        series += await consume_workload(env)
    if W5 in only:
        series += await latency_workload(env)
    return series


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="shorter runs, 3 by default")
    ap.add_argument("--runs", type=int, default=None, help="runs per figure (default 5, quick 3)")
    ap.add_argument("--seconds", type=float, default=None, help="per run (default 2, quick 0.5)")
    ap.add_argument("--json", type=Path, default=RESULTS, help=f"default {RESULTS}")
    ap.add_argument(
        "--only",
        default="ceilings,1,2,3,4,5",
        help="comma-separated subset of ceilings,1,2,3,4,5",
    )
    ap.add_argument("--dir", type=Path, default=None, help="where servers keep their files")
    ap.add_argument("--pin", action="store_true", help="servers on CPU 1, this process on 0")
    ap.add_argument(
        "--no-prefault",
        action="store_true",
        help="do not touch fresh memory before each run of workload 3 (see touch_fresh_memory)",
    )
    args = ap.parse_args(argv)
    if args.runs is None:
        args.runs = 3 if args.quick else 5
    if args.seconds is None:
        args.seconds = 0.5 if args.quick else 2.0
    if args.runs < 1 or args.seconds <= 0:
        ap.error("--runs must be >= 1 and --seconds > 0")
    return args


def _sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    only = {x.strip() for x in args.only.split(",") if x.strip()}
    env = Env(args.quick, args.runs, args.seconds, args.dir, args.pin, not args.no_prefault)
    if args.dir is not None:
        args.dir.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _sigterm)
    # Ctrl+C stops the run (and its servers) even when started from a shell that set
    # SIGINT to be ignored (a background job of a script).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if env.pin and (os.cpu_count() or 1) > 1:
        os.sched_setaffinity(0, {0})
    factory, loop_name = client_loop_factory()
    ceilings: dict[str, Any] = {}
    series: list[Series] = []
    t_start = time.perf_counter()
    jiffies = peers.machine_jiffies()
    with contextlib.ExitStack() as stack:
        stack.callback(peers.stop_all)
        info = environment(env, loop_name)
        start_servers(env, stack, only)
        info["skipped"] = env.skipped
        info["server_pids"] = {
            s.name: s.pid
            for s in [*env.tidemq.values(), env.redis_aof, env.redis_none, env.nats]
            if s is not None
        }
        print_environment(info)
        try:
            with asyncio.Runner(loop_factory=factory) as runner:
                series = runner.run(run_all(env, only, ceilings))
        except KeyboardInterrupt:
            print("\ninterrupted: stopping the servers", file=sys.stderr)
            raise
    info["loadavg_after"] = loadavg()
    info["cpu_steal"] = round(steal_share(peers.machine_jiffies() - jiffies), 4)
    info["wall_seconds"] = round(time.perf_counter() - t_start, 1)
    rows = print_throughput(series, ceilings) + print_latency(series)
    print(
        f"\nload average before {info['loadavg_before']}, after {info['loadavg_after']}; "
        f"CPU time stolen by the hypervisor during the run: {info['cpu_steal']:.1%}"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "environment": info,
                "ceilings": ceilings,
                "table": rows,
                "series": [asdict(s) for s in series],
            },
            indent=2,
        )
    )
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
