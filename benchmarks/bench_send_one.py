"""One message per round trip (P3), client side: send rate and the client's CPU per send.

Usage: ``python benchmarks/bench_send_one.py [--runs N] [--seconds S] [--size B]
[--flush async|sync] [--modes sync,async,uvloop] [--profile PATH]``

Starts one `tidemq server` (default `--flush async`, so that the disk is not what is
measured) and sends 100 B messages one at a time, each waiting for its receipt, with:

* `sync`: `tidemq.Producer.send` (the asyncio producer on the client's background loop);
* `async`: `await tidemq.aio.Producer.send` on the default asyncio loop;
* `uvloop`: the same on uvloop (what `bench_broker.py` workload 1 runs), when installed.

Per run it prints msg/s and the client process's CPU time per send, user + system
(`os.times`: every thread of this process; the server is another process, though the
kernel's loopback delivery of a request runs in the sender's system time). Each figure at the end is
the median of the runs, modes taking turns within a run. `--profile PATH` writes a
cProfile of one extra sync and async run instead (`PATH.sync`, `PATH.async`).
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import importlib
import os
import random
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers
import tidemq
from tidemq.aio import Admin
from tidemq.aio import Producer as AsyncProducer

WARMUP = 200
POOL = 64


def _cpu_since(start: os.times_result) -> tuple[float, float]:
    """(user, system) CPU seconds of this process since `start`."""
    now = os.times()
    return now.user - start.user, now.system - start.system


def values(size: int) -> list[bytes]:
    rng = random.Random(1)
    return [rng.randbytes(size) for _ in range(POOL)]


async def make_topic(address: str) -> str:
    topic = f"p3-{uuid.uuid4().hex[:8]}"
    async with Admin(address) as admin:
        await admin.create_topic(topic, 1)
    return topic


def run_sync(address: str, seconds: float, size: int) -> tuple[int, float, tuple[float, float]]:
    topic = asyncio.run(make_topic(address))
    pool = values(size)
    with tidemq.Producer(address) as producer:
        send = producer.send
        for i in range(WARMUP):
            send(topic, pool[i % POOL])
        n = 0
        cpu0, t0 = os.times(), time.perf_counter()
        deadline = t0 + seconds
        while True:
            send(topic, pool[n % POOL])
            n += 1
            if n & 15 == 0 and time.perf_counter() >= deadline:
                break
        elapsed, cpu = time.perf_counter() - t0, _cpu_since(cpu0)
    return n, elapsed, cpu


async def run_async(
    address: str, seconds: float, size: int
) -> tuple[int, float, tuple[float, float]]:
    topic = await make_topic(address)
    pool = values(size)
    async with AsyncProducer(address) as producer:
        send = producer.send
        for i in range(WARMUP):
            await send(topic, pool[i % POOL])
        n = 0
        cpu0, t0 = os.times(), time.perf_counter()
        deadline = t0 + seconds
        while True:
            await send(topic, pool[n % POOL])
            n += 1
            if n & 15 == 0 and time.perf_counter() >= deadline:
                break
        elapsed, cpu = time.perf_counter() - t0, _cpu_since(cpu0)
    return n, elapsed, cpu


def loop_factory(mode: str) -> Callable[[], asyncio.AbstractEventLoop]:
    if mode == "uvloop":
        uvloop: Any = importlib.import_module("uvloop")
        factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
        return factory
    return asyncio.new_event_loop


def one_run(
    mode: str, address: str, seconds: float, size: int
) -> tuple[int, float, tuple[float, float]]:
    if mode == "sync":
        return run_sync(address, seconds, size)
    with asyncio.Runner(loop_factory=loop_factory(mode)) as runner:
        return runner.run(run_async(address, seconds, size))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--size", type=int, default=100)
    ap.add_argument("--flush", default="async", choices=("async", "sync"))
    ap.add_argument("--modes", default="sync,async,uvloop")
    ap.add_argument("--profile", help="write cProfile stats of a sync and an async run here")
    args = ap.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if "uvloop" in modes and importlib.util.find_spec("uvloop") is None:
        modes.remove("uvloop")
    server = peers.start_tidemq(args.flush)
    try:
        print(f"tidemq server --flush {args.flush} at {server.address}, pid {server.pid}")
        print(f"load average {os.getloadavg()}")
        if args.profile:
            for mode in ("sync", "async"):
                prof = cProfile.Profile()
                prof.enable()
                n, _, _ = one_run(mode, server.address, args.seconds, args.size)
                prof.disable()
                prof.dump_stats(f"{args.profile}.{mode}")
                print(f"profiled {n} {mode} sends -> {args.profile}.{mode}")
            return
        rates: dict[str, list[float]] = {m: [] for m in modes}
        users: dict[str, list[float]] = {m: [] for m in modes}
        systems: dict[str, list[float]] = {m: [] for m in modes}
        for run in range(args.runs):
            line = []
            for mode in modes:
                n, elapsed, (user, system) = one_run(mode, server.address, args.seconds, args.size)
                rates[mode].append(n / elapsed)
                users[mode].append(user / n * 1e6)
                systems[mode].append(system / n * 1e6)
                line.append(
                    f"{mode} {n / elapsed:,.0f}/s {user / n * 1e6:.0f}+{system / n * 1e6:.0f} us"
                )
            print(f"run {run + 1}/{args.runs}: " + ", ".join(line), flush=True)
        print(f"\nmedians of {args.runs} runs ({args.size} B, --flush {args.flush}):")
        for mode in modes:
            user, system = statistics.median(users[mode]), statistics.median(systems[mode])
            print(
                f"  {mode:7s} {statistics.median(rates[mode]):8,.0f} msg/s"
                f"  client CPU {user:4.0f} us user + {system:4.0f} us system per send"
                f"  (rates {min(rates[mode]):,.0f}-{max(rates[mode]):,.0f})"
            )
        print(f"load average {os.getloadavg()}")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
