"""Delayed and transactional messages: throughput and timer lateness.

    python benchmarks/bench_special.py            # 1,000,000 delayed messages, 3 runs
    python benchmarks/bench_special.py --quick    # 100,000, 1 run

Each run starts its own `tidemq server` (sync flush) and:

* **timer**: schedules N messages of 100 B, in delayed batches of `--batch` (one record
  and one timer entry per batch), due spread evenly over the next `--window` seconds
  (default 60, as the issue asks: "due within a minute"); then waits for all of them.
  Reports schedule and delivery rates and the lateness of every delivered batch, measured
  on the broker: the delivered record's store time minus the due time it carries (the
  timer never delivers early, so lateness >= 0). Also a run of single-message sends
  (`--singles`) for the per-request cost.
* **timer burst**: N/2 messages all due at one instant: delivery throughput is the count
  over the last delivery's lateness.
* **transactions**: commit throughput for transactions of 1 message and of 100 messages
  (100 sends each, and 100 in one `send_batch`), with `--concurrency` transactions in
  flight from one client.

Prints the configuration and the median over runs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers
from tidemq import aio
from tidemq.client.cluster import ClusterClient
from tidemq.core.message import iter_records
from tidemq.core.properties import decode_properties
from tidemq.core.record import HEADER, RecordFlags, parse_header
from tidemq.protocol.commands import FetchRequest, FetchResponse

VALUE = b"x" * 100
QUEUES = 4


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else float("nan")


async def lateness(address: str, topic: str) -> tuple[int, list[float]]:
    """(messages delivered, lateness in ms of each delivered batch) from raw fetches."""
    cluster = ClusterClient(address)
    late: list[float] = []
    count = 0
    try:
        for q in range(QUEUES):
            offset = 0
            while True:
                req = FetchRequest(topic=topic, queue=q, offset=offset, max_bytes=8 << 20)
                resp, body = await cluster.request(address, req, FetchResponse)
                if not resp.record_sizes:
                    break
                for record in iter_records(body, resp.record_sizes):
                    header = parse_header(record)
                    if header.flags & RecordFlags.FROM_TIMER:
                        props = decode_properties(record[HEADER.size : header.payload_start])
                        late.append(header.store_time_ms - props.due)
                    count += header.count
                offset = resp.next_offset
    finally:
        await cluster.close()
    return count, late


async def bench_timer(address: str, total: int, batch: int, window_s: float) -> dict[str, Any]:
    topic = f"timer-{batch}-{time.monotonic_ns()}"
    async with aio.Admin(address) as admin:
        await admin.create_topic(topic, QUEUES)
    batches = total // batch
    values = [VALUE] * batch
    start_at = time.time() + 2.0  # everything is due after the scheduling has begun
    async with aio.Producer(address) as producer:
        t0 = time.perf_counter()
        sem = asyncio.Semaphore(64)

        async def one(i: int) -> None:
            async with sem:
                due = start_at + window_s * i / batches
                await producer.send_batch(topic, values, deliver_at=due, queue=i % QUEUES)

        await asyncio.gather(*(one(i) for i in range(batches)))
        schedule_s = time.perf_counter() - t0
    deadline = start_at + window_s + 120
    while True:
        delivered, late = await lateness(address, topic)
        if delivered >= batches * batch or time.time() > deadline:
            break
        await asyncio.sleep(1.0)
    out: dict[str, Any] = {
        "messages": batches * batch,
        "batch": batch,
        "window_s": window_s,
        "schedule_msg_per_s": batches * batch / schedule_s,
        "delivered": delivered,
        "lateness_ms_p50": percentile(late, 0.5),
        "lateness_ms_p99": percentile(late, 0.99),
        "lateness_ms_max": max(late, default=float("nan")),
        "early": sum(1 for x in late if x < 0),
    }
    if window_s == 0 and late:
        # All due at one instant: the last delivery's lateness is the time to deliver all.
        out["deliver_msg_per_s"] = batches * batch / max(max(late) / 1000, 1e-3)
    return out


async def bench_txn(
    address: str, size: int, seconds: float, concurrency: int, *, batched: bool = False
) -> dict[str, Any]:
    topic = f"txn-{size}-{time.monotonic_ns()}"
    async with aio.Admin(address) as admin:
        await admin.create_topic(topic, QUEUES)
    done = 0
    async with aio.TransactionProducer(address, "bench") as producer:
        stop = time.perf_counter() + seconds

        async def worker(w: int) -> None:
            nonlocal done
            while time.perf_counter() < stop:
                tx = await producer.begin()
                if batched:
                    await tx.send_batch(topic, [VALUE] * size, queue=w % QUEUES)
                else:
                    for i in range(size):
                        await tx.send(topic, VALUE, queue=(w + i) % QUEUES)
                await tx.commit()
                done += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(worker(w) for w in range(concurrency)))
        elapsed = time.perf_counter() - t0
    return {
        "messages_per_txn": size,
        "sends_per_txn": 1 if batched else size,
        "txn_per_s": done / elapsed,
        "msg_per_s": done * size / elapsed,
        "concurrency": concurrency,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--messages", type=int)
    parser.add_argument("--batch", type=int, default=100)
    parser.add_argument("--singles", type=int, default=20_000)
    parser.add_argument("--window", type=float, default=60.0)
    parser.add_argument("--runs", type=int)
    parser.add_argument("--txn-seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    total = args.messages or (100_000 if args.quick else 1_000_000)
    runs = args.runs or (1 if args.quick else 3)
    window = 10.0 if args.quick and args.window == 60.0 else args.window
    singles = args.singles // 4 if args.quick else args.singles
    config = {
        "messages": total,
        "batch": args.batch,
        "window_s": window,
        "singles": singles,
        "runs": runs,
        "txn_seconds": args.txn_seconds,
        "concurrency": args.concurrency,
        "flush": "sync",
        "cpus": os.cpu_count(),
        "versions": peers.versions(),
    }
    print("config:", json.dumps(config))
    results: dict[str, list[dict[str, Any]]] = {}
    for run in range(runs):
        server = peers.start_tidemq("sync")
        try:
            address = server.address
            cells = {
                "timer-batches": bench_timer(address, total, args.batch, window),
                "timer-singles": bench_timer(address, singles, 1, min(window, 10.0)),
                "timer-burst": bench_timer(address, total // 2, args.batch, 0.0),
                "txn-1": bench_txn(address, 1, args.txn_seconds, args.concurrency),
                "txn-100": bench_txn(address, 100, args.txn_seconds, args.concurrency),
                "txn-100-one-batch": bench_txn(
                    address, 100, args.txn_seconds, args.concurrency, batched=True
                ),
            }
            for name, coro in cells.items():
                out = asyncio.run(coro)
                results.setdefault(name, []).append(out)
                print(f"run {run + 1} {name}: {json.dumps(out, default=str)}", flush=True)
        finally:
            server.stop()
    print("\nmedians:")
    summary: dict[str, dict[str, float]] = {}
    for name, outs in results.items():
        keys = [
            k for k, v in outs[0].items() if isinstance(v, float | int) and not isinstance(v, bool)
        ]
        summary[name] = {k: statistics.median(o[k] for o in outs) for k in keys}
        print(f"  {name}: " + ", ".join(f"{k}={v:,.1f}" for k, v in summary[name].items()))
    if args.json:
        args.json.write_text(
            json.dumps(
                {"config": config, "runs": results, "median": summary}, indent=2, default=str
            )
        )


if __name__ == "__main__":
    main()
