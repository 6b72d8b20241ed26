"""What the key index costs produce, and what a query by key takes.

Usage: ``python benchmarks/bench_key_index.py [--seconds S] [--runs R] [--flush MODE]
[--json PATH]``

One `tidemq server` (`--flush`, async by default: the disk is not what is measured), two
topics of one queue each, the same in all but `key.index` (true, the default, against
false). Keyed batched produce (`send_batch` of 256 x 100 B, every message with a
distinct key) and keyless batched produce, each on both topics, the topics taking turns
in alternating order, `--runs` (5) times, `--seconds` (2) each. Then the latency of
`Admin.query_messages` for a key held by one message, and for one held by 32 messages
(limit 32), over the index the runs built. Medians over runs; CPU steal and load average
over the run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers
import tidemq

VALUE = b"x" * 100
BATCH = 256
QUERIES = 200


def produce(producer: tidemq.Producer, topic: str, seconds: float, *, keyed: bool) -> float:
    sent = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        keys = [b"order-%d" % (sent + i) for i in range(BATCH)] if keyed else None
        producer.send_batch(topic, [VALUE] * BATCH, keys=keys, queue=0)
        sent += BATCH
    return sent / (time.perf_counter() - start)


def query_ms(admin: tidemq.Admin, topic: str, key: str, limit: int) -> tuple[float, float, int]:
    times = []
    found = 0
    for _ in range(QUERIES):
        t0 = time.perf_counter()
        found = len(admin.query_messages(topic, key, limit=limit))
        times.append((time.perf_counter() - t0) * 1000)
    times.sort()
    return times[len(times) // 2], times[int(len(times) * 0.99)], found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--flush", choices=["async", "sync"], default="async")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    j0 = peers.machine_jiffies()
    server = peers.start_tidemq(args.flush)
    rows: dict[str, list[float]] = {}
    results: dict[str, Any] = {}
    try:
        with tidemq.Admin(server.address) as admin, tidemq.Producer(server.address) as p:
            admin.create_topic("bench-kidx-on", 1)
            admin.create_topic("bench-kidx-off", 1, config={"key.index": "false"})
            for run in range(args.runs):
                order = ("on", "off") if run % 2 == 0 else ("off", "on")
                for keyed in (True, False):
                    for which in order:
                        rate = produce(p, f"bench-kidx-{which}", args.seconds, keyed=keyed)
                        tag = f"{'keyed' if keyed else 'keyless'}_{which}"
                        rows.setdefault(tag, []).append(rate)
            results = {k: statistics.median(v) for k, v in rows.items()}
            p.send_batch("bench-kidx-on", [VALUE] * 32, keys=[b"hot"] * 32, queue=0)
            p.send("bench-kidx-on", VALUE, key=b"cold")
            p.flush()
            for name, key in (("one", "cold"), ("hot32", "hot")):
                p50, p99, found = query_ms(admin, "bench-kidx-on", key, 32)
                results[f"query_{name}_p50_ms"], results[f"query_{name}_p99_ms"] = p50, p99
                results[f"query_{name}_found"] = found
            entries = sum(int(v * args.seconds) for v in rows["keyed_on"])
            results["indexed_messages_approx"] = entries
    finally:
        server.stop()
    j = peers.machine_jiffies() - j0
    steal = 100 * j.steal / j.total if j.total else 0.0
    r = results
    for kind in ("keyed", "keyless"):
        on, off = r[f"{kind}_on"], r[f"{kind}_off"]
        print(f"{kind} batched produce ({BATCH} x 100 B, {args.flush} flush): "
              f"{on:,.0f} msg/s indexed, {off:,.0f} with key.index=false "
              f"({on / off:.2f}x)")  # fmt: skip
    for name, what in (("one", "a key of 1 message"), ("hot32", "a key of 32 messages")):
        print(f"query_messages, {what}: p50 {r[f'query_{name}_p50_ms']:.2f} ms, "
              f"p99 {r[f'query_{name}_p99_ms']:.2f} ms ({r[f'query_{name}_found']} found, "
              f"~{r['indexed_messages_approx']:,} keys indexed)")  # fmt: skip
    print(f"CPU steal {steal:.1f}%, load average {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**results, "steal_pct": steal}, indent=2))


if __name__ == "__main__":
    main()
