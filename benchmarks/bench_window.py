"""P1 against the producer's window: batches in flight per queue, with sync flush.

Usage: ``python benchmarks/bench_window.py [--pairs N] [--runs N] [--seconds S]
[--windows 5,32] [--flush sync|async]``

Starts one `tidemq server` per measurement (`--flush sync` by default, so every
acknowledgement waits for the fdatasync that covers it) and sends batches of 256 x 100 B
to one queue with one idempotent producer whose `max_in_flight_per_queue` is the window,
keeping max(window, 8) batches in flight (`send_batch_nowait`). With sync flush each
group commit covers what arrived while the previous fdatasync ran, so the window decides
how much one fdatasync covers. Windows take turns within each pair (the machine is noisy:
an A/B in the same minutes means more than two separate runs); each printed figure is the
median of `--runs` runs, and the summary the median over the pairs.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from collections import deque
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers
import tidemq
from tidemq.aio import Admin, Producer

BATCH = 256
SIZE = 100


async def one_run(address: str, window: int, seconds: float) -> float:
    producer = Producer(address, max_in_flight_per_queue=window)
    values = [os.urandom(SIZE) for _ in range(BATCH)]
    try:
        await producer.send_batch("w", values, queue=0)  # route, connection, producer id
        inflight: deque[asyncio.Future[Any]] = deque()
        n = 0
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            while len(inflight) < max(window, 8):
                inflight.append(await producer.send_batch_nowait("w", values, queue=0))
                n += BATCH
            await inflight.popleft()
        for fut in inflight:
            await fut
        elapsed = time.perf_counter() - t0
    finally:
        await producer.close()
    return n / elapsed


async def measure(address: str, window: int, runs: int, seconds: float) -> float:
    async with Admin(address) as admin:
        await admin.create_topic("w", 1)
    return statistics.median([await one_run(address, window, seconds) for _ in range(runs)])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--windows", default="5,32")
    parser.add_argument("--flush", choices=("sync", "async"), default="sync")
    args = parser.parse_args()
    tidemq.tune_malloc()  # as bench_broker.py: what the guide recommends for producers
    windows = [int(w) for w in args.windows.split(",")]
    print(
        f"tidemq --flush {args.flush}; one producer, one queue, batches of {BATCH} x {SIZE} B; "
        f"{args.pairs} pairs x {args.runs} runs of {args.seconds:g} s per window",
        flush=True,
    )
    results: dict[int, list[float]] = {w: [] for w in windows}
    for pair in range(args.pairs):
        for window in windows:
            extra = ("--set", f"store.idempotence_window={max(window, 5)}")
            with peers.start_tidemq(args.flush, extra=extra) as server:
                rate = asyncio.run(measure(server.address, window, args.runs, args.seconds))
            results[window].append(rate)
            print(f"pair {pair + 1}: window {window:>2}: {rate:,.0f} msg/s", flush=True)
    base = statistics.median(results[windows[0]])
    for window in windows:
        rate = statistics.median(results[window])
        print(f"window {window:>2}: median {rate:,.0f} msg/s ({rate / base:.2f}x window "
              f"{windows[0]})")  # fmt: skip
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
