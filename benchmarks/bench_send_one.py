"""One message per round trip (issue 15): tidemq against redis-py XADD, nats-py JetStream
publish and the loopback echo floor, in one run.

Usage: ``python benchmarks/bench_send_one.py [--runs N] [--seconds S] [--size B]
[--flush async|sync] [--modes M,...] [--json PATH] [--profile PATH]``

Starts one `tidemq server --flush FLUSH` (default async, so that the disk is not what is
measured), one `redis-server` (AOF, appendfsync everysec: the peers' default durability),
one `nats-server` with JetStream (file storage, one replica) and a Python echo server, each
its own process on 127.0.0.1, and sends `--size` (100) byte messages one at a time, each
waiting for its answer, with:

* `sync`: `tidemq.Producer.send` (the sync client: the asyncio producer on the client's
  background loop);
* `async`: `await tidemq.aio.Producer.send` on the default asyncio loop;
* `uvloop`: the same on uvloop, when installed;
* `redis`: redis-py `XADD` (the sync client), one at a time;
* `nats`: nats-py `await js.publish`, one at a time (on uvloop when installed);
* `echo`: a blocking socket sending `--size` bytes to a Python echo server process and
  reading them back (TCP_NODELAY): the floor under any one-per-round-trip figure;
* `echo+fdatasync` (with `--flush sync` only): the same, the echo server appending each
  message to a file and fdatasyncing it before answering: the floor under one durable
  message per round trip.

Per run and mode: msg/s, the client's CPU per round trip (`os.times` of this process,
user + system, every thread: the sync producer's background loop included) and the
server's (`/proc/PID/stat` of the `tidemq server`, `redis-server`, `nats-server` or echo
process: every thread of it). Modes take turns within each run (the order rotates from run
to run, so drift hits them alike); each figure at the end is the median of the runs, and
a ratio is the median of the per-run ratios. The CPU time the hypervisor stole during the
run (`/proc/stat`), the load average and the versions are printed with the table; a peer
that is not installed is reported as missing. `--json PATH` writes the results.

`--profile PATH` instead profiles: the client with cProfile over one sync and one async run
(`PATH.sync`, `PATH.async`, top functions printed), and the broker with py-spy (when
installed: `pip install py-spy`) during one sync run (`PATH.broker.txt`, collapsed stacks;
top functions printed).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import importlib
import importlib.util
import io
import json
import math
import os
import pstats
import random
import shutil
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers
import tidemq
from tidemq.aio import Admin
from tidemq.aio import Producer as AsyncProducer

WARMUP = 200
POOL = 64

TIDEMQ_MODES = ("sync", "async", "uvloop")
FLOORS = ("echo", "echo+fdatasync")
LABELS = {
    "sync": "tidemq Producer.send (sync client)",
    "async": "tidemq await Producer.send (asyncio)",
    "uvloop": "tidemq await Producer.send (uvloop)",
    "redis": "redis-py XADD (AOF everysec)",
    "nats": "nats-py js.publish (JetStream file)",
    "echo": "echo floor (2 Python processes)",
    "echo+fdatasync": "echo + fdatasync floor",
}
#: The issue's targets: tidemq's sync and asyncio producers at least as fast as redis-py.
TARGET_VS_REDIS = 1.0
TARGET_VS_FSYNC_FLOOR = 0.9
TARGET_CPU_US = 15.0


@dataclass(slots=True)
class Sample:
    """One mode in one run."""

    messages: int
    seconds: float
    client_user: float  # CPU seconds of this process
    client_system: float
    server_user: float  # CPU seconds of the server process
    server_system: float

    @property
    def rate(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else 0.0

    def us(self, seconds: float) -> float:
        return seconds / self.messages * 1e6 if self.messages else 0.0

    @property
    def client_us(self) -> float:
        return self.us(self.client_user + self.client_system)

    @property
    def server_us(self) -> float:
        return self.us(self.server_user + self.server_system)


@dataclass(slots=True)
class Mode:
    name: str
    server: peers.Server | None = None
    missing: str | None = None
    pid: int | None = None  # the server's, kept after it stopped
    samples: list[Sample | None] = field(default_factory=list)


class Meter:
    """Wall time and the CPU of this process and of the server `pid`, from start() to
    stop()."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.t0 = 0.0
        self.cpu0 = os.times()
        self.srv0 = (0.0, 0.0)

    def start(self) -> None:
        self.srv0 = peers.process_cpu(self.pid)
        self.cpu0 = os.times()
        self.t0 = time.perf_counter()

    def stop(self, messages: int) -> Sample:
        elapsed = time.perf_counter() - self.t0
        cpu = os.times()
        srv = peers.process_cpu(self.pid)
        return Sample(
            messages,
            elapsed,
            cpu.user - self.cpu0.user,
            cpu.system - self.cpu0.system,
            srv[0] - self.srv0[0],
            srv[1] - self.srv0[1],
        )


def values(size: int) -> list[bytes]:
    rng = random.Random(1)
    return [rng.randbytes(size) for _ in range(POOL)]


def split(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    return host, int(port)


def loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop]:
    if name == "uvloop":
        uvloop: Any = importlib.import_module("uvloop")
        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        return factory
    return asyncio.new_event_loop


def has_uvloop() -> bool:
    return importlib.util.find_spec("uvloop") is not None


# --------------------------------------------------------------------------- tidemq


async def make_topic(address: str) -> str:
    topic = f"p3-{uuid.uuid4().hex[:8]}"
    async with Admin(address) as admin:
        await admin.create_topic(topic, 1)
    return topic


def run_sync(server: peers.Server, seconds: float, size: int) -> Sample:
    topic = asyncio.run(make_topic(server.address))
    pool = values(size)
    meter = Meter(server.pid)
    with tidemq.Producer(server.address) as producer:
        send = producer.send
        for i in range(WARMUP):
            send(topic, pool[i % POOL])
        n = 0
        meter.start()
        deadline = meter.t0 + seconds
        while True:
            send(topic, pool[n % POOL])
            n += 1
            if n & 15 == 0 and time.perf_counter() >= deadline:
                break
        return meter.stop(n)


async def run_async(server: peers.Server, seconds: float, size: int) -> Sample:
    topic = await make_topic(server.address)
    pool = values(size)
    meter = Meter(server.pid)
    async with AsyncProducer(server.address) as producer:
        send = producer.send
        for i in range(WARMUP):
            await send(topic, pool[i % POOL])
        n = 0
        meter.start()
        deadline = meter.t0 + seconds
        while True:
            await send(topic, pool[n % POOL])
            n += 1
            if n & 15 == 0 and time.perf_counter() >= deadline:
                break
        return meter.stop(n)


# --------------------------------------------------------------------------- peers


def run_redis(server: peers.Server, seconds: float, size: int) -> Sample:
    import redis  # noqa: PLC0415 - optional peer

    host, port = split(server.address)
    r: Any = redis.Redis(host=host, port=port)
    key = f"p3-{uuid.uuid4().hex[:8]}"
    pool = values(size)
    meter = Meter(server.pid)
    try:
        xadd = r.xadd
        for i in range(WARMUP):
            xadd(key, {"v": pool[i % POOL]})
        n = 0
        meter.start()
        deadline = meter.t0 + seconds
        while True:
            xadd(key, {"v": pool[n % POOL]})
            n += 1
            if n & 15 == 0 and time.perf_counter() >= deadline:
                break
        return meter.stop(n)
    finally:
        with contextlib.suppress(Exception):
            r.delete(key)
        r.close()


async def run_nats(server: peers.Server, seconds: float, size: int) -> Sample:
    import nats  # noqa: PLC0415 - optional peer
    from nats.js.api import StorageType, StreamConfig  # noqa: PLC0415

    nc = await nats.connect(f"nats://{server.address}", allow_reconnect=False)
    stream = f"P3{uuid.uuid4().hex[:8]}"
    subject = f"bench.{stream}"
    pool = values(size)
    meter = Meter(server.pid)
    try:
        js = nc.jetstream()
        await js.add_stream(
            StreamConfig(name=stream, subjects=[subject], storage=StorageType.FILE, num_replicas=1)
        )
        try:
            publish = js.publish
            for i in range(WARMUP):
                await publish(subject, pool[i % POOL])
            n = 0
            meter.start()
            deadline = meter.t0 + seconds
            while True:
                await publish(subject, pool[n % POOL])
                n += 1
                if n & 15 == 0 and time.perf_counter() >= deadline:
                    break
            return meter.stop(n)
        finally:
            with contextlib.suppress(Exception):
                await js.delete_stream(stream)
    finally:
        await nc.close()


def run_echo(server: peers.Server, seconds: float, size: int) -> Sample:
    """Blocking sockets, TCP_NODELAY: send `size` bytes, read `size` bytes back."""
    pool = values(size)
    buf = bytearray(65536)
    view = memoryview(buf)
    meter = Meter(server.pid)
    with socket.create_connection(split(server.address)) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sendall, recv_into = sock.sendall, sock.recv_into

        def one(data: bytes) -> None:
            sendall(data)
            got = 0
            while got < size:
                k = recv_into(view)
                if not k:
                    raise ConnectionError("echo server closed")
                got += k

        for i in range(WARMUP):
            one(pool[i % POOL])
        n = 0
        meter.start()
        deadline = meter.t0 + seconds
        while True:
            one(pool[n % POOL])
            n += 1
            if n & 15 == 0 and time.perf_counter() >= deadline:
                break
        return meter.stop(n)


def one_run(mode: Mode, seconds: float, size: int) -> Sample:
    server = mode.server
    assert server is not None
    name = mode.name
    if name == "sync":
        return run_sync(server, seconds, size)
    if name == "redis":
        return run_redis(server, seconds, size)
    if name in FLOORS:
        return run_echo(server, seconds, size)
    coro: Callable[[peers.Server, float, int], Coroutine[Any, Any, Sample]]
    coro = run_nats if name == "nats" else run_async
    loop = "uvloop" if name == "uvloop" or (name == "nats" and has_uvloop()) else "asyncio"
    with asyncio.Runner(loop_factory=loop_factory(loop)) as runner:
        return runner.run(coro(server, seconds, size))


# --------------------------------------------------------------------------- servers


def start_servers(names: list[str], flush: str, stack: contextlib.ExitStack) -> dict[str, Mode]:
    modes = {name: Mode(name) for name in names}
    tidemq_server: peers.Server | None = None
    if any(n in TIDEMQ_MODES for n in names):
        tidemq_server = stack.enter_context(peers.start_tidemq(flush))
    for name, mode in modes.items():
        try:
            if name in TIDEMQ_MODES:
                mode.server = tidemq_server
                if name == "uvloop" and not has_uvloop():
                    mode.missing = "uvloop"
            elif name == "redis":
                mode.server = stack.enter_context(peers.start_redis(appendonly=True))
            elif name == "nats":
                mode.server = stack.enter_context(peers.start_nats())
            elif name == "echo":
                mode.server = stack.enter_context(peers.start_echo())
            elif name == "echo+fdatasync":
                mode.server = stack.enter_context(peers.start_echo(fsync=True))
            else:
                raise SystemExit(f"unknown mode {name!r}")
        except peers.PeerMissing as e:
            mode.missing = str(e)
        if mode.server is not None:
            mode.pid = mode.server.pid
    return modes


# --------------------------------------------------------------------------- report


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def ok(mode: Mode) -> list[Sample]:
    return [s for s in mode.samples if s is not None]


def ratios(a: Mode, b: Mode) -> list[float]:
    """Per-run ratios of a's rate to b's (runs where both have a figure)."""
    return [
        x.rate / y.rate
        for x, y in zip(a.samples, b.samples, strict=False)
        if x is not None and y is not None and y.rate > 0
    ]


def summary(mode: Mode) -> dict[str, Any]:
    samples = ok(mode)
    out: dict[str, Any] = {"mode": mode.name, "label": LABELS[mode.name]}
    if mode.missing:
        out["missing"] = mode.missing
    if not samples:
        return out
    rates = [s.rate for s in samples]
    out.update(
        rate=median(rates),
        rate_min=min(rates),
        rate_max=max(rates),
        client_us=median([s.client_us for s in samples]),
        client_user_us=median([s.us(s.client_user) for s in samples]),
        client_system_us=median([s.us(s.client_system) for s in samples]),
        server_us=median([s.server_us for s in samples]),
        server_user_us=median([s.us(s.server_user) for s in samples]),
        server_system_us=median([s.us(s.server_system) for s in samples]),
        server_pid=mode.pid,
        runs=[asdict(s) if s else None for s in mode.samples],
    )
    return out


def print_table(
    modes: dict[str, Mode], runs: int, size: int, flush: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    print(f"\nMedians of {runs} runs, {size} B, one message per round trip, tidemq --flush {flush}")
    print("CPU: microseconds per round trip, user+system (client: this process; server: its pid)")
    header = f"{'mode':<38} {'msg/s':>8} {'min-max':>15} {'client CPU':>16} {'server CPU':>16}"
    print(header)
    print("-" * len(header))
    rows = []
    for mode in modes.values():
        row = summary(mode)
        rows.append(row)
        if "rate" not in row:
            why = f"missing ({mode.missing})" if mode.missing else "failed"
            print(f"{LABELS[mode.name]:<38} {why}")
            continue
        spread = f"{row['rate_min']:,.0f}-{row['rate_max']:,.0f}"
        client = (
            f"{row['client_us']:.1f} ({row['client_user_us']:.0f}+{row['client_system_us']:.0f})"
        )
        server = (
            f"{row['server_us']:.1f} ({row['server_user_us']:.0f}+{row['server_system_us']:.0f})"
        )
        print(
            f"{LABELS[mode.name]:<38} {row['rate']:>8,.0f} {spread:>15} {client:>16} {server:>16}"
        )
    print("\nRatios of msg/s (median of the per-run ratios, min-max), same run:")
    out: list[dict[str, Any]] = []
    for name in TIDEMQ_MODES:
        mine = modes.get(name)
        if mine is None or not ok(mine):
            continue
        for peer, target in (
            ("redis", TARGET_VS_REDIS),
            ("nats", None),
            ("echo", None),
            ("echo+fdatasync", TARGET_VS_FSYNC_FLOOR if flush == "sync" else None),
        ):
            other = modes.get(peer)
            if other is None:
                continue
            rr = ratios(mine, other)
            if not rr:
                print(f"  {name:<7} / {peer:<15} -  ({other.missing or 'no figure'})")
                continue
            m = statistics.median(rr)
            goal = (
                f"   target >= {target}x: {'met' if m >= target else 'NOT met'}" if target else ""
            )
            print(f"  {name:<7} / {peer:<15} {m:6.3f}x  ({min(rr):.3f}-{max(rr):.3f}){goal}")
            out.append({"tidemq": name, "peer": peer, "median": m, "min": min(rr), "max": max(rr)})
    cpu_rows = [r for r in rows if r["mode"] in TIDEMQ_MODES and "rate" in r]
    if cpu_rows:
        print(f"\nCPU per round trip, target <= {TARGET_CPU_US:g} us each side:")
        for r in cpu_rows:
            print(
                f"  {r['mode']:<7} client {r['client_us']:5.1f} us"
                f" ({'met' if r['client_us'] <= TARGET_CPU_US else 'NOT met'}),"
                f" broker {r['server_us']:5.1f} us"
                f" ({'met' if r['server_us'] <= TARGET_CPU_US else 'NOT met'})"
            )
    return rows, out


# --------------------------------------------------------------------------- profile


def print_pstats(path: str, top: int = 15) -> None:
    out = io.StringIO()
    stats = pstats.Stats(path, stream=out)
    stats.strip_dirs().sort_stats("tottime").print_stats(top)
    lines = out.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if "ncalls" in line), 0)
    print("\n".join(lines[max(0, start - 2) :]))


def pyspy_binary() -> str | None:
    exe = peers.VENV_BIN / "py-spy"
    return str(exe) if exe.exists() else shutil.which("py-spy")


_FRAMEWORK = ("typer/", "click/", "<module>", "runners.py", "cli/", "threading.py")


def _frame(frame: str, *, line: bool) -> str:
    """`function (path/file.py:123)` -> `function (pkg/file.py[:123])`."""
    name, _, where = frame.partition(" (")
    where = where.rstrip(")")
    for marker in ("site-packages/", "/src/", "/lib/python3"):
        if marker in where:
            where = where.split(marker, 1)[1]
    if not line:
        where = where.split(":", 1)[0]
    return f"{name} ({where})"


def summarize_collapsed(path: Path, top: int = 15) -> None:
    """Top functions by own samples (with the line) and by samples under them, from
    py-spy's raw format (`frame;frame;... count`, a frame `function (file:line)`)."""
    own: Counter[str] = Counter()
    under: Counter[str] = Counter()
    total = 0
    for text in path.read_text().splitlines():
        stack, _, count = text.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        k = int(count)
        frames = [f for f in stack.split(";") if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        total += k
        own[_frame(frames[-1], line=True)] += k
        for f in {_frame(f, line=False) for f in frames}:
            if not any(m in f for m in _FRAMEWORK):
                under[f] += k
    if not total:
        print("  no samples")
        return
    print(f"  {total} samples; own (the leaf, with its line):")
    for f, k in own.most_common(top):
        print(f"    {k / total:6.1%}  {f}")
    print("  inclusive (the function and what it calls):")
    for f, k in under.most_common(top):
        print(f"    {k / total:6.1%}  {f}")


def pyspy(spy: str, pid: int, duration: int, out: Path) -> subprocess.Popen[str]:
    """py-spy on `pid`, sampling the thread that holds the GIL (`--gil`: where the
    process's Python time goes, wall-clock: a call that blocks or is preempted while
    holding the GIL counts), without pausing it (`--nonblocking`)."""
    argv = [spy, "record", "--pid", str(pid), "--duration", str(duration), "--rate", "500"]
    argv += ["--gil", "--nonblocking", "--format", "raw", "-o", str(out)]
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def profile(modes: dict[str, Mode], prefix: str, seconds: float, size: int) -> None:
    for name in ("sync", "async"):
        mode = modes.get(name)
        if mode is None or mode.server is None:
            continue
        prof = cProfile.Profile()
        prof.enable()
        sample = one_run(mode, seconds, size)
        prof.disable()
        prof.dump_stats(f"{prefix}.{name}")
        print(
            f"\nclient, cProfile of {sample.messages} {name} sends ({sample.rate:,.0f}/s under"
            f" the profiler) -> {prefix}.{name}; top by own time:"
        )
        print_pstats(f"{prefix}.{name}")
    mode = modes.get("sync")
    if mode is None or mode.server is None:
        return
    spy = pyspy_binary()
    if spy is None:
        print("\nbroker: not profiled: py-spy is not installed (pip install py-spy)")
        return
    duration = max(1, math.ceil(seconds))
    outs = {
        "broker": Path(f"{prefix}.broker.txt"),
        "client": Path(f"{prefix}.client.txt"),
    }
    procs = {
        "broker": pyspy(spy, mode.server.pid, duration, outs["broker"]),
        "client": pyspy(spy, os.getpid(), duration, outs["client"]),
    }
    time.sleep(0.5)  # attached before the load starts
    sample = one_run(mode, duration + 1.5, size)
    print(
        f"\npy-spy --gil during {sample.messages} sync sends ({sample.rate:,.0f}/s; per send"
        f" {sample.client_us:.1f} us client CPU, {sample.server_us:.1f} us broker CPU)"
    )
    for side, proc in procs.items():
        text, _ = proc.communicate(timeout=60)
        out = outs[side]
        if proc.returncode != 0 or not out.exists():
            print(f"\n{side}: py-spy failed (status {proc.returncode}): {text.strip()[-500:]}")
            continue
        print(f"\n{side} -> {out}:")
        summarize_collapsed(out)


# --------------------------------------------------------------------------- main


def default_modes(flush: str) -> str:
    names = ["sync", "async", "uvloop", "redis", "nats", "echo"]
    if flush == "sync":
        names.append("echo+fdatasync")
    return ",".join(names)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0].replace("\n", " "))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--flush", default="async", choices=("async", "sync"))
    ap.add_argument(
        "--modes",
        help="comma-separated subset of "
        + ",".join(LABELS)
        + " (default: all; echo+fdatasync with --flush sync only)",
    )
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--profile", help="profile the client (cProfile) and broker (py-spy)")
    args = ap.parse_args()
    if args.runs < 1 or args.seconds <= 0:
        ap.error("--runs must be >= 1 and --seconds > 0")
    names = [m.strip() for m in (args.modes or default_modes(args.flush)).split(",") if m.strip()]
    for name in names:
        if name not in LABELS:
            ap.error(f"unknown mode {name!r}")
    load_before = os.getloadavg()
    jiffies = peers.machine_jiffies()
    t_start = time.perf_counter()
    with contextlib.ExitStack() as stack:
        stack.callback(peers.stop_all)
        modes = start_servers(names, args.flush, stack)
        for mode in modes.values():
            where = (
                f"missing ({mode.missing})"
                if mode.missing
                else f"pid {mode.server.pid} on {mode.server.address}"
                if mode.server
                else "-"
            )
            print(f"  {mode.name:<15} {where}")
        print(f"load average {' '.join(f'{x:.2f}' for x in load_before)}", flush=True)
        if args.profile:
            profile(modes, args.profile, args.seconds, args.size)
            return
        active = [m for m in modes.values() if not m.missing]
        for run in range(args.runs):
            shift = run % len(active) if active else 0
            line = []
            for mode in active[shift:] + active[:shift]:
                try:
                    sample: Sample | None = one_run(mode, args.seconds, args.size)
                except Exception as e:  # one failed run of a peer is reported, not fatal
                    print(f"  {mode.name}: run {run + 1} failed: {e!r}", file=sys.stderr)
                    sample = None
                mode.samples.append(sample)
                if sample is not None:
                    line.append(
                        f"{mode.name} {sample.rate:,.0f}/s"
                        f" {sample.client_us:.0f}/{sample.server_us:.0f} us"
                    )
            print(f"run {run + 1}/{args.runs} (client/server CPU per msg): " + ", ".join(line))
            sys.stdout.flush()
    used = peers.machine_jiffies() - jiffies
    steal = used.steal / used.total if used.total > 0 else 0.0
    load_after = os.getloadavg()
    rows, ratio_rows = print_table(modes, args.runs, args.size, args.flush)
    vers = peers.versions()
    vers["python"] = sys.version.split()[0]
    print(
        f"\nCPU time stolen by the hypervisor during the run: {steal:.1%}; load average before"
        f" {' '.join(f'{x:.2f}' for x in load_before)}, after"
        f" {' '.join(f'{x:.2f}' for x in load_after)}; {os.cpu_count()} CPUs;"
        f" {time.perf_counter() - t_start:.0f} s"
    )
    print("versions: " + ", ".join(f"{k}={v}" for k, v in vers.items()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(
            json.dumps(
                {
                    "flush": args.flush,
                    "size": args.size,
                    "runs": args.runs,
                    "seconds": args.seconds,
                    "steal": steal,
                    "loadavg_before": load_before,
                    "loadavg_after": load_after,
                    "versions": vers,
                    "table": rows,
                    "ratios": ratio_rows,
                },
                indent=2,
            )
        )
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
