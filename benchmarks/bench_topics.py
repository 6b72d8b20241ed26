"""Many topics (issue 22, "a hundred thousand topics"): creating them, the first message to
a new queue, produce over many queues, and the broker's memory per idle queue.

Usage: ``python benchmarks/bench_topics.py [--topics N] [--singles N] [--memory-queues
N,N,...] [--seconds S] [--json PATH]``

On one `tidemq server` (async flush):

* `--topics` (100,000) one-queue topics with `Admin.create_topics` (one batch call; the
  target is <= 60 s), then `--singles` (10,000) more with one `create_topic` call each,
  on top of them (target <= 60 s);
* the first message to each of 500 topics never written, against the second message to
  the same topics (one message per round trip; medians; target: no slower);
* a whole route refresh (every topic) against one that holds the current routes' token
  and is told "unchanged" (medians of 5; the answer's encoded size);
* produce throughput with `send_async` of 100 B messages for `--seconds` (5) to one
  queue, and spread round robin over every one-queue topic (target >= 0.5x).

Then, for each count of `--memory-queues` (10,000,100,000,1,000,000), a fresh server with
that many idle queues (topics of 1,000 queues, created in batches): its resident memory
over that of an empty one, per queue (target <= 2 KiB at 1,000,000). CPU steal and load
average over the run.
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

import msgspec

import peers
import tidemq
from tidemq.client.cluster import ClusterClient
from tidemq.protocol.commands import GetRoutesRequest, GetRoutesResponse

VALUE = b"x" * 100
PROBES = 500
CHUNK = 10_000


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def create(address: str, topics: int, singles: int) -> dict[str, float]:
    with tidemq.Admin(address) as admin:
        start = time.perf_counter()
        for first in range(0, topics, CHUNK):
            batch = [tidemq.NewTopic(f"t{i}", 1) for i in range(first, min(topics, first + CHUNK))]
            admin.create_topics(batch)
        batch_s = time.perf_counter() - start
        start = time.perf_counter()
        for i in range(singles):
            admin.create_topic(f"s{i}", 1)
        singles_s = time.perf_counter() - start
    return {"batch_s": batch_s, "singles_s": singles_s}


async def _route_fetches(address: str) -> dict[str, float]:
    client = ClusterClient(address)
    try:
        full: list[float] = []
        unchanged: list[float] = []
        size = 0
        for _ in range(5):
            t0 = time.perf_counter()
            answer = await client.call(address, GetRoutesRequest(), GetRoutesResponse)
            full.append(time.perf_counter() - t0)
            size = len(msgspec.msgpack.encode(answer))
            t0 = time.perf_counter()
            again = await client.call(
                address, GetRoutesRequest(known=answer.generation), GetRoutesResponse
            )
            unchanged.append(time.perf_counter() - t0)
            assert again.unchanged
        return {
            "routes_full_ms": statistics.median(full) * 1000,
            "routes_unchanged_ms": statistics.median(unchanged) * 1000,
            "routes_full_bytes": size,
        }
    finally:
        await client.close()


def route_fetches(address: str) -> dict[str, float]:
    return asyncio.run(_route_fetches(address))


def first_messages(address: str, topics: int) -> dict[str, float]:
    names = [f"t{i}" for i in range(0, topics, max(1, topics // PROBES))][:PROBES]
    with tidemq.Producer(address) as producer:
        producer.send(f"t{topics - 1}", VALUE)  # routes and connection warmed
        first, second = [], []
        for name in names:
            t0 = time.perf_counter()
            producer.send(name, VALUE)
            first.append(time.perf_counter() - t0)
        for name in names:
            t0 = time.perf_counter()
            producer.send(name, VALUE)
            second.append(time.perf_counter() - t0)
    return {
        "first_ms": statistics.median(first) * 1000,
        "second_ms": statistics.median(second) * 1000,
    }


def throughput(address: str, topics: int, seconds: float) -> dict[str, float]:
    out = {}
    with tidemq.Producer(address) as producer:
        for label, spread in (("one_queue", 1), ("all_queues", topics)):
            sent = 0
            start = time.perf_counter()
            while time.perf_counter() - start < seconds:
                for _ in range(1_000):
                    producer.send_async(f"t{sent % spread}", VALUE)
                    sent += 1
            producer.flush()
            out[f"{label}_rate"] = sent / (time.perf_counter() - start)
    return out


def memory(queues: int) -> dict[str, float]:
    server = peers.start_tidemq("async")
    try:
        empty = rss_kib(server.pid)
        per_topic = 1_000
        with tidemq.Admin(server.address) as admin:
            for first in range(0, queues // per_topic, 100):
                count = min(100, queues // per_topic - first)
                admin.create_topics(
                    [tidemq.NewTopic(f"m{first + i}", per_topic) for i in range(count)]
                )
        full = rss_kib(server.pid)
    finally:
        server.stop()
    return {"queues": queues, "kib_per_queue": (full - empty) / queues, "rss_mib": full / 1024}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument("--singles", type=int, default=10_000)
    parser.add_argument("--memory-queues", default="10000,100000,1000000")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    j0 = peers.machine_jiffies()
    results: dict[str, Any] = {}
    server = peers.start_tidemq("async")
    try:
        results.update(create(server.address, args.topics, args.singles))
        results.update(route_fetches(server.address))
        results.update(first_messages(server.address, args.topics))
        results.update(throughput(server.address, args.topics, args.seconds))
    finally:
        server.stop()
    print(json.dumps(results), flush=True)  # kept if a memory run fails
    counts = [int(n) for n in args.memory_queues.split(",") if n]
    results["memory"] = []
    for n in counts:
        results["memory"].append(memory(n))
        print(json.dumps(results["memory"][-1]), flush=True)
    j = peers.machine_jiffies() - j0
    steal = 100 * j.steal / j.total if j.total else 0.0
    r = results
    print(f"{args.topics:,} topics with create_topics: {r['batch_s']:.1f} s; then "
          f"{args.singles:,} with one call each: {r['singles_s']:.1f} s")  # fmt: skip
    print(f"route refresh of every topic: {r['routes_full_ms']:.1f} ms "
          f"({r['routes_full_bytes'] / 1e6:.1f} MB); unchanged: "
          f"{r['routes_unchanged_ms']:.2f} ms")  # fmt: skip
    print(f"first message to a new queue: p50 {r['first_ms']:.3f} ms; second: "
          f"{r['second_ms']:.3f} ms ({r['first_ms'] / r['second_ms']:.2f}x)")  # fmt: skip
    print(f"send_async 100 B: one queue {r['one_queue_rate']:,.0f} msg/s, over "
          f"{args.topics:,} queues {r['all_queues_rate']:,.0f} msg/s "
          f"({r['all_queues_rate'] / r['one_queue_rate']:.2f}x)")  # fmt: skip
    for m in r["memory"]:
        print(f"{m['queues']:,} idle queues: {m['kib_per_queue']:.2f} KiB per queue "
              f"(RSS {m['rss_mib']:,.0f} MiB)")  # fmt: skip
    print(f"CPU steal {steal:.1f}%, load average {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**results, "steal_pct": steal}, indent=2))


if __name__ == "__main__":
    main()
