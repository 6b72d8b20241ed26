"""Scale targets of issue #4 that bench_broker.py does not cover: many queues (P6), a restart
after kill -9 (P7) and two brokers on one machine (P8).

Usage: ``python benchmarks/bench_scale.py [--quick] [--runs N] [--seconds S] [--json PATH]
[--only p6,p7,p8] [--queues N] [--restart-bytes N] [--dir PATH]``

Every server is a separate process bound to 127.0.0.1 on a free port, with its files in a
temporary directory (under `--dir`, default the system temp dir); servers are stopped by
their PID afterwards, also on Ctrl+C and on errors (`peers.Server`). The flush mode is
`sync` throughout (acknowledge after fdatasync). Every message is 100 B; every batch is
256 of them (`send_batch_nowait`), with 32 batches in flight per producer.

* P1 baseline: bench_broker's workload 3 at 100 B (one producer, one queue, batches of
  256 with 32 in flight, values from its pool), on the same server as P6, taking turns
  with it, with the same producer and loop (`produce_spread`), so that P1 and P6 differ
  only in the queues. (bench_broker's `tq_produce` creates and deletes a topic around
  each run; on a broker holding thousands of queues each topic change costs tens of ms
  of broker CPU, which would blur the CPU per message measured here.) The producer's
  window per queue (32) equals what is in flight, so P1 and P6 both have 32 batches on
  the wire.
* P6: 10,000 queues (`--queues`), in topics of at most 1,000 queues (see
  `P6_QUEUES_PER_TOPIC`). One producer sends its batches to the queues in round robin.
  Measured: how long creating the queues takes; the broker's RSS (VmRSS) before, right
  after creating them (idle) and after traffic, as bytes per queue; how long a first
  one-message batch to every queue takes (not measured as throughput); msg/s and its
  ratio to P1 (median of the per-run ratios); broker CPU per message for both. When the routes
  of all the queues cannot be served (before long frame headers, the answer to GetRoutes
  had to fit 64 KiB), that is reported, topics are deleted until the routes fit, and the
  throughput is measured over the queues left (flagged as such).
* P7: a server whose checkpoints (the store's and the timer/transaction services') are
  pushed past the end of the run, so that everything written since its start is written
  since the last checkpoint; `--restart-bytes` of payload (1 GiB; 64 MiB with --quick)
  are written and acknowledged, the server is killed with SIGKILL and started again on
  the same data directory and port. Measured: the time from the restart command until the
  broker accepts a connection, answers a fetch of the last acknowledged message, and
  acknowledges a new produce. Checked: the queues hold exactly the acknowledged messages.
  For reference, the start of a server on an empty data directory (interpreter start,
  imports, an empty store) is timed too. The page cache still holds the log (kill -9 is
  not a machine crash, and dropping caches needs root).
* P8: a name server and 2 brokers (`tidemq namesrv`, `tidemq broker --namesrv` x2, each
  with its data directory) against one `tidemq server`; a topic of 4 queues, spread by
  `Admin.create_topic` over the brokers (queue q on broker q mod 2); 2 producer processes
  (multiprocessing, spawn), producer i sending to the queues q with q mod 2 = i (on
  the 2-broker side: all on broker i). Measured: aggregate msg/s (all messages over the
  span from the first start to the last end), the ratio 2 brokers / 1 broker (median of
  the per-run ratios; the two setups take turns, alternating which goes first), and the
  CPU time of every broker and producer process during the measurement. For the cause
  of a low ratio: how fdatasync of a 25.6 KiB write scales from 1 to 2 writers at once
  on the disk under the brokers.

Each figure is the median of `--runs` runs (default 3). Every load loop stops at a message
count or its time limit, whichever comes first. Results are printed and written to
benchmarks/results/scale.json.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import platform
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from types import FrameType
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_broker
import peers
from bench_broker import Series, human
from tidemq.aio import Admin, Producer
from tidemq.client.cluster import ClusterClient
from tidemq.core import limits
from tidemq.core.errors import TidemqError
from tidemq.protocol.commands import (
    CreateTopicRequest,
    DeleteTopicRequest,
    Empty,
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    TopicInfoMsg,
)

T = TypeVar("T")

RESULTS = Path(__file__).resolve().parent / "results" / "scale.json"

HOST = "127.0.0.1"
FLUSH = "sync"
LOG_LEVEL = "warning"
SERVING = re.compile(r"serving on (?P<address>\S+)")

# ----------------------------------------------------------------- the load (as P1)
SIZE = 100
BATCH = bench_broker.BATCH  # 256 messages per send_batch
IN_FLIGHT = bench_broker.TQ_BATCHES_IN_FLIGHT  # 32 batches in flight per producer
RUNS = 3
SECONDS = 5.0  # per throughput measurement
SECONDS_QUICK = 1.0
#: Per throughput measurement, whatever the time limit (2 GiB of 100 B messages).
MAX_MESSAGES = bench_broker.MAX_BYTES // SIZE
#: A measurement that has not ended this long after its time limit has failed.
MEASURE_GRACE_S = 120.0
#: Between starting a server (or creating topics) and reading its memory.
SETTLE_S = 1.0

# ----------------------------------------------------------------- P1 and P6: many queues
#: P1 runs on this (topic, queue), created before the P6 queues.
P1_QUEUE = ("p1", 0)
P6_QUEUES = 10_000
#: A topic's create answer lists every queue (~57 B each) in one frame header of at most
#: 64 KiB, so a topic of 1,000 queues is about the largest that can be created.
P6_QUEUES_PER_TOPIC = min(1_000, limits.MAX_QUEUES_PER_TOPIC)
#: Before measuring, each queue gets one batch of this many messages (first touch).
P6_TOUCH_BATCH = 1
P6_TOUCH_IN_FLIGHT = 64
P6_TOUCH_TIMEOUT_S = 600.0
P6_CREATE_TIMEOUT_S = 600.0
P6_TARGET_RATIO = 0.5  # of the P1 figure
P6_TARGET_BYTES_PER_QUEUE = 2048  # broker memory per idle queue, below

# ----------------------------------------------------------------- P7: restart after kill -9
P7_BYTES = 1 << 30
P7_BYTES_QUICK = 64 << 20
P7_QUEUES = 1
#: Longer than any run: after the checkpoint the store writes when it opens, none follows.
P7_CHECKPOINT_MS = 24 * 3600 * 1000
P7_WRITE_TIMEOUT_S = 900.0
#: Give up on a restarted server that does not answer within this.
P7_RESTART_TIMEOUT_S = 180.0
P7_POLL_S = 0.005  # between connection attempts to the restarting server
P7_FETCH_BYTES = 1 << 20
P7_TARGET_S = 5.0

# ----------------------------------------------------------------- P8: two brokers
P8_BROKERS = 2
P8_PRODUCERS = 2
P8_QUEUES_PER_PRODUCER = 2
P8_TARGET_RATIO = 1.6
#: Starting a worker process, and each of its steps short of the measurement itself.
P8_WORKER_TIMEOUT_S = 120.0
#: Brokers registered with the name server, and a new topic in its routes, within this.
P8_ROUTES_TIMEOUT_S = 30.0
P8_POLL_S = 0.05
#: Longest each fdatasync measurement of the disk under the brokers runs.
P8_DISK_SECONDS = 2.0
#: A producer process with no command for this long ends (its parent is gone).
P8_WORKER_IDLE_S = 1800.0


# --------------------------------------------------------------------------- small helpers


@dataclass(slots=True)
class Settings:
    quick: bool
    runs: int
    seconds: float
    root: Path | None
    queues: int
    restart_bytes: int
    only: set[str]


@dataclass(slots=True)
class Results:
    series: list[Series] = field(default_factory=list)
    cells: dict[str, Any] = field(default_factory=dict)
    targets: list[Target] = field(default_factory=list)


@dataclass(slots=True)
class Target:
    """One row of the final table."""

    name: str
    measured: str
    required: str
    met: bool | None  # None: not measured
    note: str = ""


def rss_bytes(pid: int) -> int:
    """The process's resident set (VmRSS of /proc/PID/status)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used."""
    return sum(peers.process_cpu(pid))


def tidemq_command() -> list[str]:
    exe = peers.VENV_BIN / "tidemq"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "tidemq.cli.main"]


def new_dir(name: str, root: Path | None) -> Path:
    return Path(tempfile.mkdtemp(prefix=f"bench-{name}-", dir=root))


def mib(n: float) -> str:
    return f"{n / (1 << 20):,.0f} MiB"


def median_or_none(values: Sequence[float]) -> float | None:
    return statistics.median(values) if values else None


def run_ratios(a: Series, b: Series) -> list[float]:
    return [x / y for x, y in zip(a.runs, b.runs, strict=False) if x is not None and y]


async def bounded(coro: Awaitable[T], seconds: float) -> T:
    async with asyncio.timeout(seconds):
        return await coro


# --------------------------------------------------------------------------- the load


@dataclass(slots=True)
class Produced:
    messages: int  # acknowledged
    seconds: float
    next_target: int  # where the round robin continues

    @property
    def rate(self) -> float:
        return bench_broker.rate(self.messages, self.seconds)


async def produce_spread(
    producer: Producer,
    targets: Sequence[tuple[str, int]],
    *,
    start: int = 0,
    max_messages: int,
    seconds: float,
    batch: int = BATCH,
    in_flight: int = IN_FLIGHT,
) -> Produced:
    """Batches of `batch` x 100 B to `targets` (topic, queue) in round robin, `in_flight`
    batches outstanding, until `max_messages` were sent or `seconds` have passed; counts
    what was acknowledged."""
    values = bench_broker.values_pool(SIZE)
    batches = [values[i : i + batch] for i in range(0, len(values), batch)]
    inflight: deque[asyncio.Future[Sequence[Any]]] = deque()
    sent = acked = 0
    b = start
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while sent < max_messages and time.perf_counter() < deadline:
        while len(inflight) < in_flight and sent < max_messages:
            topic, queue = targets[b % len(targets)]
            chunk = batches[b % len(batches)]
            inflight.append(await producer.send_batch_nowait(topic, chunk, queue=queue))
            b += 1
            sent += len(chunk)
        acked += len(await inflight.popleft())
    while inflight:
        acked += len(await inflight.popleft())
    return Produced(acked, time.perf_counter() - t0, b)


# --------------------------------------------------------------------------- P1 and P6


@dataclass(slots=True)
class QueueSet:
    """The P6 topics on one server."""

    topics: list[tuple[str, int]] = field(default_factory=list)  # (name, queues)
    create_seconds: list[float] = field(default_factory=list)
    error: str = ""  # why creating or routing all of them failed
    routable: list[tuple[str, int]] = field(default_factory=list)

    @property
    def created(self) -> int:
        return sum(n for _, n in self.topics)

    def targets(self) -> list[tuple[str, int]]:
        return [(t, q) for t, n in self.routable for q in range(n)]


def topic_sizes(total: int, per_topic: int) -> list[int]:
    """`total` queues in as few topics of at most `per_topic` as possible, evenly."""
    k = max(1, math.ceil(total / per_topic))
    return [total // k + (1 if i < total % k else 0) for i in range(k)]


async def create_queues(address: str, total: int) -> QueueSet:
    """Create the P6 topics with one CreateTopicRequest each, straight to the broker (no
    route lookups: those are checked apart, in `routable_queues`)."""
    qs = QueueSet()
    client = ClusterClient(address)
    try:
        for i, n in enumerate(topic_sizes(total, P6_QUEUES_PER_TOPIC)):
            name = f"p6-{i}"
            t = time.perf_counter()
            try:
                await client.call(address, CreateTopicRequest(name=name, queues=n), TopicInfoMsg)
            except TidemqError as exc:
                qs.error = f"creating topic {name} ({n} queues): {type(exc).__name__}: {exc}"
                break
            qs.create_seconds.append(time.perf_counter() - t)
            qs.topics.append((name, n))
    finally:
        await client.close()
    return qs


async def routes_error(address: str) -> str:
    """'' when a client can read the routes of every topic, else the error."""
    client = ClusterClient(address)
    try:
        await client.refresh_routes(force=True)
    except TidemqError as exc:
        return f"{type(exc).__name__}: {exc}"
    finally:
        await client.close()
    return ""


async def routable_queues(address: str, qs: QueueSet) -> None:
    """Keep the topics whose routes a client can read: delete the last topic until the
    routes answer fits (noting why it did not)."""
    kept = list(qs.topics)
    error = await routes_error(address)
    if error:
        qs.error = qs.error or f"routes of {qs.created:,} queues: {error}"
    client = ClusterClient(address)
    try:
        while error and kept:
            name, _ = kept.pop()
            await client.call(address, DeleteTopicRequest(name=name), Empty)
            error = await routes_error(address)
    finally:
        await client.close()
    qs.routable = kept


async def busy(pid: int, coro: Awaitable[T]) -> tuple[T, float]:
    """`coro`'s result, and the CPU seconds the process `pid` used meanwhile."""
    c0 = cpu_seconds(pid)
    value = await coro
    return value, cpu_seconds(pid) - c0


async def attempt(label: str, coro: Awaitable[T], seconds: float) -> T | None:
    """`coro`'s result, or None (printed) when it fails or overruns `seconds`."""
    try:
        async with asyncio.timeout(seconds):
            return await coro
    except Exception as exc:
        print(f"    {label} failed: {type(exc).__name__}: {exc}", flush=True)
        return None


async def p6_create(s: Settings, pid: int, address: str) -> tuple[QueueSet, dict[str, int]]:
    """Create the P6 queues; the broker's RSS before and right after (idle, after a
    settle); then keep the topics whose routes a client can read."""
    await asyncio.sleep(SETTLE_S)
    memory = {"before": rss_bytes(pid)}
    qs = await bounded(create_queues(address, s.queues), P6_CREATE_TIMEOUT_S)
    await asyncio.sleep(SETTLE_S)
    memory["idle"] = rss_bytes(pid)
    per_idle = (memory["idle"] - memory["before"]) / max(qs.created, 1)
    print(
        f"  created {qs.created:,} queues ({len(qs.topics)} topics) in "
        f"{sum(qs.create_seconds):.2f} s; broker RSS {mib(memory['before'])} -> "
        f"{mib(memory['idle'])} idle: {per_idle:,.0f} B per idle queue",
        flush=True,
    )
    await routable_queues(address, qs)
    if qs.error:
        print(f"  NOTE: {qs.error}", flush=True)
        print(f"  throughput measured over {len(qs.targets()):,} routable queues", flush=True)
    return qs, memory


async def p6_touch(producer: Producer, targets: Sequence[tuple[str, int]]) -> Produced:
    """One small batch to every queue: the producer's per-queue state and the broker's
    first append to each queue happen here, not in the measured runs."""
    touch = await bounded(
        produce_spread(
            producer,
            targets,
            max_messages=len(targets) * P6_TOUCH_BATCH,
            seconds=P6_TOUCH_TIMEOUT_S,
            batch=P6_TOUCH_BATCH,
            in_flight=P6_TOUCH_IN_FLIGHT,
        ),
        P6_TOUCH_TIMEOUT_S + MEASURE_GRACE_S,
    )
    print(
        f"  first touch: a {P6_TOUCH_BATCH}-message batch to each of {len(targets):,} queues "
        f"in {touch.seconds:.2f} s",
        flush=True,
    )
    return touch


async def p6_runs(
    s: Settings,
    server: peers.Server,
    producer: Producer,
    targets: Sequence[tuple[str, int]],
    *,
    p1: Series,
    p6: Series,
) -> None:
    """P1 (one queue) and P6 (`targets`; none: P1 only) taking turns, with the same
    producer and loop; P6's round robin goes on where the last run stopped. The broker's
    CPU time per message is kept with each figure."""
    timeout = s.seconds + MEASURE_GRACE_S
    cursor = 0
    for run in range(s.runs):
        one = produce_spread(producer, [P1_QUEUE], max_messages=MAX_MESSAGES, seconds=s.seconds)
        r1 = await attempt("P1", busy(server.pid, one), timeout)
        record(p1, r1)
        r6: tuple[Produced, float] | None = None
        if targets:
            many = produce_spread(
                producer, targets, start=cursor, max_messages=MAX_MESSAGES, seconds=s.seconds
            )
            r6 = await attempt("P6", busy(server.pid, many), timeout)
            cursor = r6[0].next_target if r6 else cursor
        record(p6, r6)
        print(
            f"    run {run + 1}/{s.runs}: P1 {human(p1.runs[-1])} msg/s "
            f"(broker CPU {cpu_text(p1.extra[-1])}), P6 {human(p6.runs[-1])} msg/s "
            f"(broker CPU {cpu_text(p6.extra[-1])}) = {ratio_text(p6.runs[-1], p1.runs[-1])}",
            flush=True,
        )


def record(series: Series, result: tuple[Produced, float] | None) -> None:
    """A run's msg/s and the broker's CPU time per message (None: the run failed)."""
    if result is None:
        series.runs.append(None)
        series.extra.append({})
        return
    produced, cpu = result
    series.runs.append(produced.rate)
    series.extra.append({"broker_cpu_us_per_msg": cpu / max(produced.messages, 1) * 1e6})


async def p6_cell(s: Settings, out: Results) -> None:
    """P1 and P6 on one sync server: the P1 topic, then memory around creating the P6
    queues, a first touch of every queue, then runs taking turns (P1 on its one queue,
    P6 over every routable queue)."""
    print(
        f"\n[P1 + P6] {s.queues:,} queues in topics of <= {P6_QUEUES_PER_TOPIC:,}; "
        f"{SIZE} B x {BATCH} per batch, {IN_FLIGHT} in flight",
        flush=True,
    )
    p1 = Series("P1", SIZE, "tidemq sync, 1 queue (bench_broker workload 3)", True)
    p6 = Series("P6", SIZE, "tidemq sync, queues in round robin", True)
    touch: Produced | None = None
    with peers.start_tidemq(FLUSH, root=s.root) as server:
        print(f"  server pid {server.pid} on {server.address}", flush=True)
        async with Admin(server.address) as admin:
            await admin.create_topic(P1_QUEUE[0], 1)
        qs, memory = await p6_create(s, server.pid, server.address)
        targets = qs.targets()
        p6.system = f"tidemq sync, {len(targets):,} queues in round robin"
        async with Producer(server.address) as producer:
            await produce_spread(producer, [P1_QUEUE], max_messages=BATCH, seconds=s.seconds)
            if targets:
                touch = await p6_touch(producer, targets)
                memory["touched"] = rss_bytes(server.pid)
            await p6_runs(s, server, producer, targets, p1=p1, p6=p6)
        memory["after_traffic"] = rss_bytes(server.pid)
    per_idle = (memory["idle"] - memory["before"]) / max(qs.created, 1)
    per_after = (memory["after_traffic"] - memory["before"]) / max(qs.created, 1)
    print(
        f"  broker RSS after traffic {mib(memory['after_traffic'])}: {per_after:,.0f} B per "
        "queue created",
        flush=True,
    )
    ratios = run_ratios(p6, p1)
    out.series += [p1, p6]
    out.cells["p6"] = {
        "queues_asked": s.queues,
        "queues_created": qs.created,
        "topics": qs.topics,
        "create_seconds": sum(qs.create_seconds),
        "create_seconds_per_topic": qs.create_seconds,
        "error": qs.error,
        "queues_routable": len(targets),
        "rss": memory,
        "bytes_per_idle_queue": per_idle,
        "bytes_per_queue_after_traffic": per_after,
        "touch_seconds": touch.seconds if touch else None,
        "ratio_runs": ratios,
        "ratio": median_or_none(ratios),
        "broker_cpu_us_per_msg": {"p1": median_cpu(p1), "p6": median_cpu(p6)},
    }
    out.targets += p6_targets(s, p1, p6, out.cells["p6"])


def median_cpu(series: Series) -> float | None:
    return median_or_none([e["broker_cpu_us_per_msg"] for e in series.extra if e])


def cpu_text(extra: dict[str, Any]) -> str:
    cpu = extra.get("broker_cpu_us_per_msg")
    return "-" if cpu is None else f"{cpu:.2f} us/msg"


def fmt(x: float | None, spec: str) -> str:
    return "-" if x is None else format(x, spec)


def ratio_text(a: float | None, b: float | None) -> str:
    return f"{a / b:.2f}x" if a is not None and b else "-"


def p6_targets(s: Settings, p1: Series, p6: Series, cell: dict[str, Any]) -> list[Target]:
    ratio = cell["ratio"]
    routable, created = cell["queues_routable"], cell["queues_created"]
    full = routable == s.queues
    cpu = cell["broker_cpu_us_per_msg"]
    cpu_note = (
        f"broker CPU per message: P1 {fmt(cpu['p1'], '.2f')} us, P6 {fmt(cpu['p6'], '.2f')} us"
    )
    rows = [
        Target(
            "P1 baseline",
            f"{human(p1.median())} msg/s, 1 queue ({spread(p1)})",
            "reference for P6",
            None,
        )
    ]
    measured = (
        f"{human(p6.median())} msg/s over {routable:,} queues = "
        f"{'-' if ratio is None else f'{ratio:.2f}'}x P1"
    )
    rows.append(
        Target(
            "P6 throughput",
            measured,
            f">= {P6_TARGET_RATIO:.2f}x P1 over {s.queues:,} queues",
            (ratio is not None and ratio >= P6_TARGET_RATIO) if full else False,
            cpu_note
            if full
            else f"only {routable:,} of {s.queues:,} queues usable: {cell['error']}; {cpu_note}",
        )
    )
    per_idle = cell["bytes_per_idle_queue"]
    rows.append(
        Target(
            "P6 memory",
            f"{per_idle:,.0f} B per idle queue ({created:,} queues created in "
            f"{cell['create_seconds']:.1f} s); {cell['bytes_per_queue_after_traffic']:,.0f} B "
            "per queue after traffic",
            f"< {P6_TARGET_BYTES_PER_QUEUE:,} B per idle queue",
            per_idle < P6_TARGET_BYTES_PER_QUEUE if created else None,
            "" if created == s.queues else f"{created:,} of {s.queues:,} queues created",
        )
    )
    return rows


def spread(series: Series) -> str:
    v = series.values()
    return f"{human(min(v))}-{human(max(v))}" if v else "-"


# --------------------------------------------------------------------------- P7


@dataclass(slots=True)
class P7Node:
    """One P7 server's data directory and port, kept across a kill -9 and restart."""

    root: Path
    port: int
    server: peers.Server | None = None

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def address(self) -> str:
        return f"{HOST}:{self.port}"

    def argv(self) -> list[str]:
        return [
            *tidemq_command(),
            "server",
            "--data-dir",
            str(self.data_dir),
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--flush",
            FLUSH,
            "--http-port",
            "-1",
            "--log-level",
            LOG_LEVEL,
            "--set",
            f"store.checkpoint_interval_ms={P7_CHECKPOINT_MS}",
            "--set",
            f"broker.service_checkpoint_interval_ms={P7_CHECKPOINT_MS}",
        ]

    def launch(self) -> float:
        """Start the server without waiting for it; returns the time of the command. Its
        own directory (its cwd, removed when it stops) is apart from the data."""
        server = peers.Server("tidemq-p7", self.argv(), new_dir("p7-proc", self.root), ready=None)
        t0 = time.perf_counter()
        self.server = server.start()
        return t0

    def kill9(self) -> None:
        """SIGKILL to the server's PID; wait for it to be gone (the data stays)."""
        server, self.server = self.server, None
        if server is None or server.proc is None:
            return
        os.kill(server.pid, signal.SIGKILL)
        server.proc.wait(peers.STOP_TIMEOUT_S)
        server.stop()  # reaps nothing more; removes only the process's own directory

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            self.server = None


async def wait_listening(node: P7Node, deadline: float) -> float:
    """Connect until the server accepts (it listens only once recovered); returns when."""
    while True:
        try:
            _, writer = await asyncio.open_connection(HOST, node.port)
        except OSError:
            server = node.server
            if server is None or server.proc is None or server.proc.poll() is not None:
                output = server.output() if server else ""
                raise RuntimeError(f"the P7 server exited: {output}") from None
            if time.perf_counter() > deadline:
                raise TimeoutError(
                    f"the P7 server did not listen in time: {node.address}"
                ) from None
            await asyncio.sleep(P7_POLL_S)
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return time.perf_counter()


async def fetch_at_end(address: str, topic: str) -> tuple[int, bool]:
    """(messages in the topic's queues, whether a fetch of each queue's last message
    answered it with the queue's end as its next offset)."""
    client = ClusterClient(address)
    total, ok = 0, True
    try:
        for q in range(P7_QUEUES):
            bounds = await client.call(
                address, ListOffsetsRequest(topic=topic, queue=q), ListOffsetsResponse
            )
            end = bounds.max_offset
            request = FetchRequest(
                topic=topic, queue=q, offset=max(end - 1, 0), max_bytes=P7_FETCH_BYTES
            )
            answer = await client.call(address, request, FetchResponse)
            if end:
                ok = ok and answer.status == "found" and answer.next_offset == end
            total += end
    finally:
        await client.close()
    return total, ok


async def p7_write(node: P7Node, topic: str, payload_bytes: int) -> tuple[Produced, int]:
    """Write `payload_bytes` of 100 B messages in batches; (what was acknowledged, log
    bytes appended)."""
    async with Admin(node.address) as admin:
        log_start = (await admin.broker_status(node.address)).log_end_position
    async with Producer(node.address) as producer:
        produced = await bounded(
            produce_spread(
                producer,
                [(topic, q) for q in range(P7_QUEUES)],
                max_messages=math.ceil(payload_bytes / SIZE),
                seconds=P7_WRITE_TIMEOUT_S,
            ),
            P7_WRITE_TIMEOUT_S + MEASURE_GRACE_S,
        )
    async with Admin(node.address) as admin:
        log_end = (await admin.broker_status(node.address)).log_end_position
    return produced, log_end - log_start


async def p7_restart(node: P7Node, topic: str, acked: int) -> dict[str, Any]:
    """Start the killed server again; time the steps until it serves reads and writes."""
    t0 = node.launch()
    deadline = t0 + P7_RESTART_TIMEOUT_S
    t_listen = await wait_listening(node, deadline)
    remaining = max(deadline - time.perf_counter(), 1.0)
    count, fetch_ok = await bounded(fetch_at_end(node.address, topic), remaining)
    t_fetch = time.perf_counter()
    async with Producer(node.address) as producer:
        receipt = await bounded(
            producer.send(topic, b"after-restart", queue=0), max(deadline - t_fetch, 1.0)
        )
    t_produce = time.perf_counter()
    return {
        "listening_s": t_listen - t0,
        "fetch_s": t_fetch - t0,
        "ready_s": t_produce - t0,
        "messages_after_restart": count,
        "acknowledged": acked,
        "fetch_ok": fetch_ok,
        "produce_offset": receipt.offset,
        "sane": count == acked and fetch_ok,
    }


async def p7_once(s: Settings) -> dict[str, Any]:
    """One P7 run on a fresh data directory: empty start, write, kill -9, timed restart."""
    node = P7Node(new_dir("p7", s.root), peers.free_port())
    topic = "p7"
    try:
        t0 = node.launch()
        empty_start = await wait_listening(node, t0 + P7_RESTART_TIMEOUT_S) - t0
        async with Admin(node.address) as admin:
            await admin.create_topic(topic, P7_QUEUES)
        produced, log_bytes = await p7_write(node, topic, s.restart_bytes)
        node.kill9()
        result = await p7_restart(node, topic, produced.messages)
        result.update(
            empty_start_s=empty_start,
            payload_bytes=produced.messages * SIZE,
            log_bytes=log_bytes,
            write_seconds=produced.seconds,
            write_rate=produced.rate,
        )
        return result
    finally:
        node.stop()
        shutil.rmtree(node.root, ignore_errors=True)


async def p7_cell(s: Settings, out: Results) -> None:
    print(
        f"\n[P7] restart after kill -9 with {mib(s.restart_bytes)} written since the last "
        f"checkpoint (store.checkpoint_interval_ms and broker.service_checkpoint_interval_ms "
        f"= {P7_CHECKPOINT_MS:,}); {P7_QUEUES} queue(s), fresh data directory per run",
        flush=True,
    )
    series = Series("P7", SIZE, "tidemq sync, restart after kill -9 until produce acked", True, "s")
    for run in range(s.runs):
        timeout = P7_WRITE_TIMEOUT_S + P7_RESTART_TIMEOUT_S * 2 + MEASURE_GRACE_S
        r = await attempt("P7", p7_once(s), timeout)
        series.runs.append(r["ready_s"] if r else None)
        series.extra.append(r or {})
        if r:
            check = "OK" if r["sane"] else "MISMATCH"
            print(
                f"    run {run + 1}/{s.runs}: wrote {mib(r['payload_bytes'])} of payload "
                f"(log +{mib(r['log_bytes'])}) in {r['write_seconds']:.1f} s "
                f"({human(r['write_rate'])} msg/s); after kill -9: listening "
                f"{r['listening_s']:.2f} s, fetch at the end {r['fetch_s']:.2f} s, produce "
                f"acked {r['ready_s']:.2f} s (empty start {r['empty_start_s']:.2f} s); "
                f"{r['acknowledged']:,} acknowledged, {r['messages_after_restart']:,} after "
                f"restart: {check}",
                flush=True,
            )
    out.series.append(series)
    ok = [e for e in series.extra if e]
    cell: dict[str, Any] = {
        "runs": series.extra,
        "ready_s": series.median(),
        "listening_s": median_or_none([e["listening_s"] for e in ok]),
        "empty_start_s": median_or_none([e["empty_start_s"] for e in ok]),
        "payload_bytes": median_or_none([e["payload_bytes"] for e in ok]),
        "all_sane": bool(ok) and all(e["sane"] for e in ok),
    }
    out.cells["p7"] = cell
    out.targets.append(p7_target(s, series, cell))


def p7_target(s: Settings, series: Series, cell: dict[str, Any]) -> Target:
    ready = series.median()
    if ready is None:
        return Target("P7 restart", "failed", f"<= {P7_TARGET_S:g} s", False)
    written = cell["payload_bytes"] or 0
    at_size = written >= P7_BYTES
    measured = (
        f"serving in {ready:.2f} s ({spread_s(series)}) after kill -9 with {mib(written)} "
        f"written; listening {cell['listening_s']:.2f} s, empty start "
        f"{cell['empty_start_s']:.2f} s"
    )
    notes = []
    if not at_size:
        notes.append(f"written {mib(written)}, not the target's {mib(P7_BYTES)}: not judged")
    if not cell["all_sane"]:
        notes.append("messages after restart differ from those acknowledged")
    met: bool | None = ready <= P7_TARGET_S if at_size else None
    if not cell["all_sane"]:
        met = False
    return Target(
        "P7 restart", measured, f"<= {P7_TARGET_S:g} s with {mib(P7_BYTES)}", met, "; ".join(notes)
    )


def spread_s(series: Series) -> str:
    v = series.values()
    return f"{min(v):.2f}-{max(v):.2f} s" if v else "-"


# --------------------------------------------------------------------------- P8


def producer_worker(conn: Connection) -> None:
    """A producer process: for each ("prepare", ...) from the parent, connect and warm up,
    answer "ready", wait for "go", measure, answer the result; None ends it."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us by PID
    factory, _ = bench_broker.client_loop_factory()
    with asyncio.Runner(loop_factory=factory) as runner:
        while conn.poll(P8_WORKER_IDLE_S):
            try:
                message = conn.recv()
            except EOFError:
                return
            if message is None:
                return
            try:
                conn.send(("done", runner.run(worker_session(conn, message))))
            except Exception as exc:
                conn.send(("error", f"{type(exc).__name__}: {exc}"))


@dataclass(frozen=True, slots=True)
class Job:
    """What one producer process sends in one P8 measurement."""

    bootstrap: str
    topic: str
    queues: list[int]
    seconds: float
    max_messages: int


async def worker_session(conn: Connection, job: Job) -> dict[str, float]:
    async with Producer(job.bootstrap) as producer:
        targets = [(job.topic, q) for q in job.queues]
        await bounded(
            produce_spread(
                producer, targets, max_messages=BATCH * len(targets), seconds=P8_WORKER_TIMEOUT_S
            ),
            P8_WORKER_TIMEOUT_S,
        )
        conn.send(("ready", None))
        if not conn.poll(P8_WORKER_TIMEOUT_S) or conn.recv() != ("go",):
            raise RuntimeError("no go from the parent")
        cpu0, start = time.process_time(), time.time()
        produced = await bounded(
            produce_spread(producer, targets, max_messages=job.max_messages, seconds=job.seconds),
            job.seconds + MEASURE_GRACE_S,
        )
        end = time.time()
        return {
            "messages": produced.messages,
            "seconds": produced.seconds,
            "start": start,
            "end": end,
            "cpu_seconds": time.process_time() - cpu0,
        }


class Workers:
    """P8_PRODUCERS producer processes (spawn), each driven through its own pipe; killed by
    PID if they do not end when asked."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.procs: list[multiprocessing.process.BaseProcess] = []
        self.conns: list[Connection] = []
        self.start()

    def start(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        try:
            for i in range(self.n):
                parent, child = ctx.Pipe()
                proc = ctx.Process(
                    target=producer_worker, args=(child,), name=f"bench-producer-{i}", daemon=True
                )
                proc.start()
                child.close()
                self.procs.append(proc)
                self.conns.append(parent)
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs if p.pid is not None]

    def expect(self, kind: str, seconds: float) -> list[Any]:
        out = []
        deadline = time.monotonic() + seconds
        for i, conn in enumerate(self.conns):
            if not conn.poll(max(deadline - time.monotonic(), 0.0)):
                raise TimeoutError(f"producer process {i}: no {kind!r} in {seconds:g} s")
            got, value = conn.recv()
            if got == "error":
                raise RuntimeError(f"producer process {i}: {value}")
            if got != kind:
                raise RuntimeError(f"producer process {i}: {got!r} instead of {kind!r}")
            out.append(value)
        return out

    def close(self) -> None:
        for conn in self.conns:
            with contextlib.suppress(OSError, ValueError):
                conn.send(None)
        for proc in self.procs:
            proc.join(peers.STOP_TIMEOUT_S)
            if proc.is_alive():
                proc.kill()
                proc.join(peers.STOP_TIMEOUT_S)
        for conn in self.conns:
            conn.close()
        self.procs, self.conns = [], []

    def restart(self) -> None:
        """After a failed measurement: whatever a process was doing, start afresh."""
        self.close()
        self.start()

    def __enter__(self) -> Workers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(slots=True)
class Setup:
    """Where P8's producers send: one `tidemq server`, or a name server and brokers."""

    key: str
    label: str
    bootstrap: str
    servers: list[peers.Server]  # every server process, for CPU time


def start_service(name: str, args: Callable[[Path], list[str]], root: Path | None) -> peers.Server:
    """A `tidemq` command with its own directory, waited for until it serves."""
    directory = new_dir(name, root)
    argv = [*tidemq_command(), *args(directory)]
    return peers.Server(f"tidemq-{name}", argv, directory, ready=SERVING).start()


def start_cluster(s: Settings, stack: contextlib.ExitStack) -> Setup:
    """`tidemq namesrv` and P8_BROKERS `tidemq broker --namesrv`, each its data dir."""
    ns_args = ["namesrv", "--host", HOST, "--port", "0", "--log-level", LOG_LEVEL]
    ns = stack.enter_context(start_service("namesrv", lambda _: ns_args, s.root))
    servers = [ns]
    for i in range(P8_BROKERS):
        name = f"broker-{chr(ord('a') + i)}"

        def args(directory: Path, name: str = name) -> list[str]:
            return [
                "broker",
                "--namesrv",
                ns.address,
                "--broker-name",
                name,
                "--host",
                HOST,
                "--port",
                "0",
                "--data-dir",
                str(directory / "data"),
                "--flush",
                FLUSH,
                "--log-level",
                LOG_LEVEL,
            ]

        servers.append(stack.enter_context(start_service(name, args, s.root)))
    label = f"{P8_BROKERS} brokers + namesrv"
    return Setup("cluster", label, ns.address, servers)


async def wait_registered(bootstrap: str, brokers: int) -> None:
    deadline = time.monotonic() + P8_ROUTES_TIMEOUT_S
    async with Admin(bootstrap) as admin:
        while len(await admin.cluster_status()) < brokers:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{brokers} brokers not registered in {P8_ROUTES_TIMEOUT_S} s")
            await asyncio.sleep(P8_POLL_S)


async def p8_topic(bootstrap: str, topic: str, queues: int) -> dict[int, str]:
    """Create the topic (spread over the brokers by Admin.create_topic); wait until the
    name server routes every queue; queue -> broker address."""
    async with Admin(bootstrap) as admin:
        info = await admin.create_topic(topic, queues)
    deadline = time.monotonic() + P8_ROUTES_TIMEOUT_S
    client = ClusterClient(bootstrap)
    try:
        while True:
            routes = await client.refresh_routes(force=True)
            if topic in routes and all(routes.broker_for(topic, q) for q in range(queues)):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"topic {topic} not routed in {P8_ROUTES_TIMEOUT_S} s")
            await asyncio.sleep(P8_POLL_S)
    finally:
        await client.close()
    return {q.queue: q.broker for q in info.queue_info}


def producer_queues(queues: int) -> list[list[int]]:
    """Producer i sends to the queues q with q mod P8_PRODUCERS = i: with P8_BROKERS =
    P8_PRODUCERS these are all on broker i."""
    return [[q for q in range(queues) if q % P8_PRODUCERS == i] for i in range(P8_PRODUCERS)]


async def p8_once(s: Settings, workers: Workers, setup: Setup, run: int) -> dict[str, Any]:
    """One P8 measurement: every producer process on its queues, started together."""
    queues = P8_PRODUCERS * P8_QUEUES_PER_PRODUCER
    topic = f"p8-{setup.key}-{run}"
    placement = await p8_topic(setup.bootstrap, topic, queues)
    assignment = producer_queues(queues)
    brokers_of = [sorted({placement[q] for q in qs}) for qs in assignment]
    try:
        for conn, qs in zip(workers.conns, assignment, strict=True):
            conn.send(Job(setup.bootstrap, topic, qs, s.seconds, MAX_MESSAGES))
        workers.expect("ready", P8_WORKER_TIMEOUT_S)
        pids = [srv.pid for srv in setup.servers] + workers.pids
        cpu0, t0 = {p: cpu_seconds(p) for p in pids}, time.perf_counter()
        machine0 = peers.machine_jiffies()
        for conn in workers.conns:
            conn.send(("go",))
        results = workers.expect("done", s.seconds + MEASURE_GRACE_S)
        wall = time.perf_counter() - t0
        cpu = {p: (cpu_seconds(p) - cpu0[p]) / wall for p in pids}
        used = peers.machine_jiffies() - machine0
        busy_j, iowait_j, total_j = used.busy, used.iowait, used.total
    finally:
        with contextlib.suppress(Exception):
            async with Admin(setup.bootstrap) as admin:
                await admin.delete_topic(topic)
    total = sum(r["messages"] for r in results)
    span = max(r["end"] for r in results) - min(r["start"] for r in results)
    return {
        "rate": bench_broker.rate(total, span),
        "per_producer": [bench_broker.rate(r["messages"], r["seconds"]) for r in results],
        "brokers_of_producer": brokers_of,
        "cpu_servers": {srv.name: cpu[srv.pid] for srv in setup.servers},
        "cpu_producers": [r["cpu_seconds"] / r["seconds"] for r in results],
        "cpu_ours": sum(cpu.values()) / (os.cpu_count() or 1),
        "cpu_machine_busy": busy_j / max(total_j, 1),
        "cpu_machine_iowait": iowait_j / max(total_j, 1),
    }


def p8_line(label: str, r: dict[str, Any] | None) -> str:
    if r is None:
        return f"{label} failed"
    servers = ", ".join(f"{n.removeprefix('tidemq-')} {c:.0%}" for n, c in r["cpu_servers"].items())
    producers = ", ".join(f"{c:.0%}" for c in r["cpu_producers"])
    return (
        f"{label} {human(r['rate'])} msg/s (CPU: {servers}; producers {producers}; "
        f"machine: ours {r['cpu_ours']:.0%}, all tenants {r['cpu_machine_busy']:.0%} busy "
        f"+ {r['cpu_machine_iowait']:.0%} iowait)"
    )


def start_p8_servers(s: Settings, stack: contextlib.ExitStack) -> tuple[Setup, Setup]:
    """One `tidemq server`, and a name server with P8_BROKERS brokers."""
    server = stack.enter_context(peers.start_tidemq(FLUSH, root=s.root))
    single = Setup("single", "1 broker (tidemq server)", server.address, [server])
    cluster = start_cluster(s, stack)
    every = single.servers + cluster.servers
    print(
        "  servers: " + ", ".join(f"{x.name} pid {x.pid} on {x.address}" for x in every),
        flush=True,
    )
    return single, cluster


def fdatasync_scaling(s: Settings) -> dict[str, float]:
    """The disk under the brokers: writes/s of one batch (25.6 KiB) each followed by
    fdatasync, by one writer and by P8_BROKERS writers at once (threads, a file each).
    Each broker's group commit is one such fdatasync: if the disk does not scale, brokers
    with sync flush cannot either."""
    chunk = BATCH * SIZE
    seconds = min(s.seconds, P8_DISK_SECONDS)

    def syncs() -> float:
        return bench_broker.fdatasync_bandwidth(s.root, chunk, seconds, bench_broker.MAX_BYTES)[1]

    one = syncs()
    with ThreadPoolExecutor(P8_BROKERS) as pool:
        many = sum(f.result() for f in [pool.submit(syncs) for _ in range(P8_BROKERS)])
    return {"one_writer_per_s": one, "many_writers_per_s": many, "ratio": many / one}


async def p8_runs(
    s: Settings, workers: Workers, sides: list[tuple[Setup, Series]], disk: list[dict[str, float]]
) -> None:
    """Each run measures every setup once, then the disk (`fdatasync_scaling`); which
    setup goes first alternates between runs, so drift hits them alike."""
    timeout = s.seconds + MEASURE_GRACE_S + 2 * P8_WORKER_TIMEOUT_S
    for run in range(s.runs):
        order = sides if run % 2 == 0 else sides[::-1]
        for setup, series in order:
            r = await attempt(setup.label, p8_once(s, workers, setup, run), timeout)
            if r is None:
                workers.restart()
            series.runs.append(r["rate"] if r else None)
            series.extra.append(r or {})
        disk.append(fdatasync_scaling(s))
        lines = [p8_line(setup.label, series.extra[-1] or None) for setup, series in sides]
        d = disk[-1]
        lines.append(
            f"disk: {BATCH * SIZE / 1024:.1f} KiB write + fdatasync {human(d['one_writer_per_s'])}"
            f"/s by 1 writer, {human(d['many_writers_per_s'])}/s by {P8_BROKERS} "
            f"({d['ratio']:.2f}x)"
        )
        print(f"    run {run + 1}/{s.runs}: " + ";\n      ".join(lines), flush=True)


async def p8_cell(s: Settings, out: Results) -> None:
    queues = P8_PRODUCERS * P8_QUEUES_PER_PRODUCER
    print(
        f"\n[P8] {P8_PRODUCERS} producer processes, {queues} queues, {SIZE} B x {BATCH} per "
        f"batch, {IN_FLIGHT} in flight each: 1 tidemq server vs {P8_BROKERS} brokers",
        flush=True,
    )
    with contextlib.ExitStack() as stack:
        single, cluster = start_p8_servers(s, stack)
        await wait_registered(cluster.bootstrap, P8_BROKERS)
        workers = stack.enter_context(Workers(P8_PRODUCERS))
        one = Series("P8", SIZE, f"{single.label}, {P8_PRODUCERS} producer processes", True)
        two = Series("P8", SIZE, f"{cluster.label}, {P8_PRODUCERS} producer processes", True)
        disk: list[dict[str, float]] = []
        await p8_runs(s, workers, [(single, one), (cluster, two)], disk)
    placement = next((e["brokers_of_producer"] for e in two.extra if e), None)
    print(f"  {cluster.label}: producer i's queues are on {placement}", flush=True)
    ratios = run_ratios(two, one)
    out.series += [one, two]
    out.cells["p8"] = {
        "ratio_runs": ratios,
        "ratio": median_or_none(ratios),
        "placement": placement,
        "disk_runs": disk,
        "disk_ratio": median_or_none([d["ratio"] for d in disk]),
    }
    out.targets.append(p8_target(one, two, out.cells["p8"]))


def p8_target(one: Series, two: Series, cell: dict[str, Any]) -> Target:
    ratio, disk = cell["ratio"], cell["disk_ratio"]
    return Target(
        "P8 2 brokers",
        f"{human(two.median())} msg/s on {P8_BROKERS} brokers = "
        f"{'-' if ratio is None else f'{ratio:.2f}'}x 1 broker ({human(one.median())} msg/s)",
        f">= {P8_TARGET_RATIO:g}x 1 broker",
        None if ratio is None else ratio >= P8_TARGET_RATIO,
        ""
        if disk is None
        else f"disk: {P8_BROKERS} fdatasync writers at once = {disk:.2f}x one writer (median)",
    )


# --------------------------------------------------------------------------- report


def print_targets(targets: list[Target], info: dict[str, Any]) -> list[dict[str, Any]]:
    print("\n" + "=" * 100)
    print(
        f"Targets of issue #4, tidemq {FLUSH} flush, {SIZE} B messages in batches of {BATCH}, "
        f"{IN_FLIGHT} in flight; medians of {info['runs']} runs"
    )
    header = f"{'target':<14} {'met':<5} {'measured (required)'}"
    print(header)
    print("-" * 100)
    for t in targets:
        met = {True: "yes", False: "NO", None: "-"}[t.met]
        print(f"{t.name:<14} {met:<5} {t.measured}")
        print(f"{'':<20} required: {t.required}")
        if t.note:
            print(f"{'':<20} note: {t.note}")
    return [asdict(t) for t in targets]


def environment(s: Settings, loop_name: str) -> dict[str, Any]:
    root = s.root or Path(tempfile.gettempdir())
    return {
        "python": sys.version.split()[0],
        "cpu": bench_broker.cpu_model(),
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "filesystem": bench_broker.filesystem_of(root),
        "directory": str(root),
        "client_loop": loop_name,
        "server_uvloop": bench_broker.server_uvloop(),
        "tidemq_flush": f"{FLUSH} (acknowledge after fdatasync)",
        "message_bytes": SIZE,
        "batch": BATCH,
        "batches_in_flight": IN_FLIGHT,
        "runs": s.runs,
        "seconds_per_run": s.seconds,
        "quick": s.quick,
        "p6_queues": s.queues,
        "p6_queues_per_topic": P6_QUEUES_PER_TOPIC,
        "p7_restart_bytes": s.restart_bytes,
        "p7_checkpoint_intervals_ms": P7_CHECKPOINT_MS,
        "p8": f"{P8_BROKERS} brokers vs 1, {P8_PRODUCERS} producer processes x "
        f"{P8_QUEUES_PER_PRODUCER} queues",
        "client_server_share_box": True,
        "loadavg_before": bench_broker.loadavg(),
    }


def print_environment(info: dict[str, Any]) -> None:
    print("Configuration")
    for k, v in info.items():
        print(f"  {k:<28} {v}")


# --------------------------------------------------------------------------- main


CELLS: dict[str, Callable[[Settings, Results], Awaitable[None]]] = {
    "p6": p6_cell,
    "p7": p7_cell,
    "p8": p8_cell,
}


async def run_cells(s: Settings, out: Results) -> None:
    for key, cell in CELLS.items():
        if key not in s.only:
            continue
        try:
            await cell(s, out)
        except Exception as exc:
            print(f"  {key.upper()} failed: {type(exc).__name__}: {exc}", flush=True)
            out.cells[key] = {"error": f"{type(exc).__name__}: {exc}"}
            out.targets.append(Target(key.upper(), f"failed: {exc}", "-", False))


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--quick", action="store_true", help="short runs: a smoke test")
    ap.add_argument("--runs", type=int, default=RUNS, help=f"runs per figure (default {RUNS})")
    ap.add_argument(
        "--seconds",
        type=float,
        default=None,
        help=f"per throughput run (default {SECONDS:g}, quick {SECONDS_QUICK:g})",
    )
    ap.add_argument("--json", type=Path, default=RESULTS, help=f"default {RESULTS}")
    ap.add_argument("--only", default=",".join(CELLS), help="comma-separated subset of p6,p7,p8")
    ap.add_argument("--queues", type=int, default=P6_QUEUES, help=f"P6 (default {P6_QUEUES:,})")
    ap.add_argument(
        "--restart-bytes",
        type=int,
        default=None,
        help=f"P7 payload written before kill -9 (default {P7_BYTES}, quick {P7_BYTES_QUICK})",
    )
    ap.add_argument("--dir", type=Path, default=None, help="where servers keep their files")
    args = ap.parse_args(argv)
    if args.seconds is None:
        args.seconds = SECONDS_QUICK if args.quick else SECONDS
    if args.restart_bytes is None:
        args.restart_bytes = P7_BYTES_QUICK if args.quick else P7_BYTES
    only = {x.strip().lower() for x in args.only.split(",") if x.strip()}
    if not only <= set(CELLS):
        ap.error(f"--only: choose from {','.join(CELLS)}")
    if args.runs < 1 or args.seconds <= 0 or args.queues < 1 or args.restart_bytes < SIZE:
        ap.error("--runs, --seconds, --queues and --restart-bytes must be positive")
    args.only = only
    return args


def _sigterm(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    s = Settings(
        args.quick, args.runs, args.seconds, args.dir, args.queues, args.restart_bytes, args.only
    )
    if s.root is not None:
        s.root.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, _sigterm)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    factory, loop_name = bench_broker.client_loop_factory()
    info = environment(s, loop_name)
    print_environment(info)
    out = Results()
    t_start = time.perf_counter()
    jiffies = peers.machine_jiffies()
    with contextlib.ExitStack() as stack:
        stack.callback(peers.stop_all)
        try:
            with asyncio.Runner(loop_factory=factory) as runner:
                runner.run(run_cells(s, out))
        except KeyboardInterrupt:
            print("\ninterrupted: stopping the servers", file=sys.stderr)
            raise
    info["loadavg_after"] = bench_broker.loadavg()
    info["wall_seconds"] = round(time.perf_counter() - t_start, 1)
    info["cpu_steal"] = round(bench_broker.steal_share(peers.machine_jiffies() - jiffies), 4)
    rows = print_targets(out.targets, info)
    print(
        f"\nload average before {info['loadavg_before']}, after {info['loadavg_after']}; "
        f"{info['wall_seconds']} s; CPU time stolen by the hypervisor: {info['cpu_steal']:.1%}"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(
        json.dumps(
            {
                "environment": info,
                "targets": rows,
                "cells": out.cells,
                "series": [asdict(x) for x in out.series],
            },
            indent=2,
            default=str,
        )
    )
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
