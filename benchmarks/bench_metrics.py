"""What a Prometheus scrape every second and an open web console cost the data path
(issue 22).

Usage: ``python benchmarks/bench_metrics.py [--seconds S] [--runs R] [--topics T]
[--json PATH]``

One `tidemq server` (async flush) with its HTTP listener, `--topics` (100) topics with
traffic so that `/metrics` has series to render. Two workloads, each run with and without
an observer process, the two taking turns, `--runs` (3) times, `--seconds` (3) each, in
alternating order. The observer scrapes `/metrics` once a second (as Prometheus) and, every
other second, reads what the console's open Cluster and Topic pages refresh
(`/api/cluster`, `/api/topics/bench-metrics`):

* P1-like: batched produce (`send_batch` of 1,000 x 100 B, one topic), messages/s;
* P5-like: one message per round trip (`Producer.send`), p50 and p99 ack latency.

Medians over runs and the ratio with/without; the scrape's and the console reads' own
times (medians) and the scrape's size; CPU steal and load average over the run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers
import tidemq

VALUE = b"x" * 100


_SCRAPER = """
import sys, time, urllib.request
base = sys.argv[1]
def get(path):
    start = time.perf_counter()
    with urllib.request.urlopen(base + path, timeout=10) as answer:
        size = len(answer.read())
    return (time.perf_counter() - start) * 1000, size
tick = 0
while True:
    ms, size = get("/metrics")
    print(f"metrics {ms:.3f} {size}", flush=True)
    if tick % 2 == 0:
        for path in ("/api/cluster", "/api/topics/bench-metrics"):
            ms, size = get(path)
            print(f"console {ms:.3f} {size}", flush=True)
    tick += 1
    time.sleep(1.0)
"""


class Scraper:
    """A separate process (as Prometheus and a browser are) that GETs /metrics once a
    second and the console's refreshed reads every other second; their times, and the
    size of a scrape."""

    def __init__(self, url: str) -> None:
        self._url = url
        self.times_ms: list[float] = []
        self.console_ms: list[float] = []
        self.size = 0
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> Scraper:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _SCRAPER, self._url], stdout=subprocess.PIPE, text=True
        )
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._proc is not None
        self._proc.terminate()
        out, _ = self._proc.communicate(timeout=30)
        for line in out.splitlines():
            kind, ms, size = line.split()
            if kind == "metrics":
                self.times_ms.append(float(ms))
                self.size = int(size)
            else:
                self.console_ms.append(float(ms))


def batched(producer: tidemq.Producer, seconds: float) -> float:
    batch = [VALUE] * 1_000
    sent = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        producer.send_batch("bench-metrics", batch, queue=0)
        sent += len(batch)
    return sent / (time.perf_counter() - start)


def one_by_one(producer: tidemq.Producer, seconds: float) -> tuple[float, float]:
    latencies = []
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        t0 = time.perf_counter()
        producer.send("bench-metrics", VALUE, queue=1)
        latencies.append((time.perf_counter() - t0) * 1000)
    latencies.sort()
    return latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    j0 = peers.machine_jiffies()
    server = peers.start_tidemq("async", extra=["--http-port", "0"])
    results: dict[str, Any] = {}
    try:
        url = f"http://{server.http_address}"
        with tidemq.Admin(server.address) as admin, tidemq.Producer(server.address) as p:
            admin.create_topic("bench-metrics", 2)
            for n in range(args.topics):
                admin.create_topic(f"bench-metrics-{n}", 1)
                p.send(f"bench-metrics-{n}", VALUE)
            rows: dict[str, list[float]] = {}
            scrapes: list[float] = []
            console: list[float] = []
            size = 0
            for run in range(args.runs):
                # Taking turns in both orders: the log grows all along (no order bias).
                for scraped in (False, True) if run % 2 == 0 else (True, False):
                    tag = "scraped" if scraped else "quiet"
                    if scraped:
                        with Scraper(url) as scraper:
                            rate = batched(p, args.seconds)
                            p50, p99 = one_by_one(p, args.seconds)
                        scrapes += scraper.times_ms
                        console += scraper.console_ms
                        size = scraper.size
                    else:
                        rate = batched(p, args.seconds)
                        p50, p99 = one_by_one(p, args.seconds)
                    rows.setdefault(f"{tag}_rate", []).append(rate)
                    rows.setdefault(f"{tag}_p50", []).append(p50)
                    rows.setdefault(f"{tag}_p99", []).append(p99)
        results = {k: statistics.median(v) for k, v in rows.items()}
        results["scrape_ms"] = statistics.median(scrapes) if scrapes else 0.0
        results["scrape_bytes"] = size
        results["console_ms"] = statistics.median(console) if console else 0.0
    finally:
        server.stop()
    j = peers.machine_jiffies() - j0
    steal = 100 * j.steal / j.total if j.total else 0.0
    r = results
    print(f"batched produce: {r['quiet_rate']:,.0f} msg/s quiet, {r['scraped_rate']:,.0f} "
          f"with a scrape a second and the console open "
          f"({r['scraped_rate'] / r['quiet_rate']:.2f}x)")  # fmt: skip
    print(f"one per round trip: p50 {r['quiet_p50']:.3f} / p99 {r['quiet_p99']:.3f} ms quiet, "
          f"p50 {r['scraped_p50']:.3f} / p99 {r['scraped_p99']:.3f} ms observed")  # fmt: skip
    print(f"a scrape: {r['scrape_ms']:.1f} ms, {r['scrape_bytes']:,} bytes "
          f"({args.topics + 1} topics); a console read: {r['console_ms']:.1f} ms")  # fmt: skip
    print(f"CPU steal {steal:.1f}%, load average {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**results, "steal_pct": steal}, indent=2))


if __name__ == "__main__":
    main()
