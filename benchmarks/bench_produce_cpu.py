"""Where a batch produce spends its CPU: workload 3 of `bench_broker.py` (batches of 256,
32 in flight, one queue) against one tidemq server, with the client's and the broker's CPU
per batch (user + system, from os.times() and /proc/PID/stat) and how busy the whole
machine was (/proc/stat) over each run.

Usage: ``python benchmarks/bench_produce_cpu.py [--size 1024] [--flush sync] [--runs 3]
[--seconds 3] [--prefault] [--dir PATH]``

For A/B comparisons of a change on the produce path: run it alternately on the old and
the new code (``PYTHONPATH=/path/to/old/src`` makes both the client and the server it
starts import the old code). A machine less than fully busy with both processes below a
core each points at waiting (the group-commit chain), not at CPU.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_broker as bb
import peers


async def run(args: argparse.Namespace, server: peers.Server, env: bb.Env) -> None:
    limits = bb.Limits(args.seconds, 500_000_000)
    for r in range(args.runs):
        touched = ""
        if args.prefault:
            rate = bb.touch_fresh_memory(bb.prefault_bytes())
            touched = f" (touched fresh memory at {bb.human(rate)}B/s)"
        s0, c0, m0 = peers.process_cpu(server.pid), os.times(), peers.machine_jiffies()
        t0 = time.perf_counter()
        rate = await bb.tq_produce(env, server.address, bb.W3, args.size, limits)
        elapsed = time.perf_counter() - t0
        s1, c1, m1 = peers.process_cpu(server.pid), os.times(), peers.machine_jiffies()
        batches = max(rate * elapsed / bb.BATCH, 1.0)
        used = m1 - m0
        busy = used.busy / max(used.total, 1)

        def us(seconds: float) -> str:
            return f"{seconds / batches * 1e6:.0f}"  # noqa: B023 - used at once

        print(
            f"run {r + 1}/{args.runs}: {bb.human(rate)} msg/s = "
            f"{bb.human(rate * args.size)}B/s; per batch: client "
            f"{us(c1.user - c0.user)} + {us(c1.system - c0.system)} us, broker "
            f"{us(s1[0] - s0[0])} + {us(s1[1] - s0[1])} us (user + system); "
            f"machine busy {busy:.0%}{touched}",
            flush=True,
        )


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    ap.add_argument("--size", type=int, default=1024, help="value bytes (default 1024)")
    ap.add_argument("--flush", choices=("sync", "async"), default="sync")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seconds", type=float, default=3.0, help="per run")
    ap.add_argument("--prefault", action="store_true", help="touch fresh memory before each run")
    ap.add_argument("--dir", type=Path, default=None, help="where the server keeps its files")
    args = ap.parse_args(argv)
    if args.runs < 1 or args.seconds <= 0 or args.size < 1:
        ap.error("--runs and --size must be >= 1 and --seconds > 0")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    factory, loop_name = bb.client_loop_factory()
    print(
        f"batches of {bb.BATCH} x {args.size} B, {bb.TQ_BATCHES_IN_FLIGHT} in flight, "
        f"--flush {args.flush}, {args.runs} runs of {args.seconds} s, client loop {loop_name}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(dir=args.dir) as directory:
        root = Path(directory)
        env = bb.Env(False, args.runs, args.seconds, root, False)
        with (
            peers.start_tidemq(args.flush, root=root) as server,
            asyncio.Runner(loop_factory=factory) as runner,
        ):
            runner.run(run(args, server, env))
    return 0


if __name__ == "__main__":
    sys.exit(main())
