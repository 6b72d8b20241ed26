"""Static topics (issue 17): remapping a topic that holds data, on real processes.

Usage: ``python benchmarks/bench_static_remap.py [--gib G] [--queues N] [--runs R]
[--json PATH]``

A `tidemq namesrv` and two `tidemq broker` processes (sync flush), a static topic with
`--queues` (8) logical queues on broker-a holding `--gib` (1.0) GiB (1 KiB values, batches
of 1,000), then:

1. Remap every queue onto broker-b with no load: time to complete, and bytes moved (the
   growth of each broker's commit-log directory during the remap; must be 0).
2. `--runs` (3) remaps back and forth under load: one thread per queue sends one message
   per round trip (`Producer.send`, keyed to its queue) all along; p50/p99 ack latency
   and the longest gap between two acks of one queue (the write pause) during each remap,
   against the same figures over as long a window with no remap; medians over runs.
3. Throughput before and after the first remap: batched produce (MB/s, 64 MiB) and a
   full read of 64 MiB with StreamConsumer; and the cost of a read that crosses a link
   boundary (seek to one offset before it, poll until the message after it) against the
   same read inside a link, median of 200 each.
4. A remap of the topic while `--delayed` (20,000) delayed messages (100 bytes, due in an
   hour, sent with `send_async`) wait on its write end: time to complete, and the delayed
   batches handed over to the new write end (all must arrive there).

CPU steal and load average over the run are printed with the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import itertools

import peers
import tidemq

TOPIC = "bench-static"
VALUE = 1024
BATCH = 1_000


def _start(name: str, args: list[str]) -> peers.Server:
    directory = Path(peers._tempdir(name, None))
    exe = peers.VENV_BIN / "tidemq"
    argv = [str(exe)] if exe.exists() else [sys.executable, "-m", "tidemq.cli.main"]
    argv += [*args, "--port", "0", "--log-level", "warning"]
    ready = re.compile(r"serving on (?P<address>\S+)")
    return peers.Server(name, argv, directory, ready=ready).start()


def _log_bytes(server: peers.Server) -> int:
    return sum(f.stat().st_size for f in server.directory.rglob("commitlog/*") if f.is_file())


def _fill(producer: tidemq.Producer, queues: int, total_bytes: int) -> int:
    value = os.urandom(VALUE)
    sent = 0
    while sent < total_bytes:
        for q in range(queues):
            producer.send_batch(TOPIC, [value] * BATCH, queue=q)
            sent += VALUE * BATCH
    return sent


class Load:
    """One thread per queue sending one message per round trip; ack times per queue."""

    def __init__(self, bootstrap: str, queues: int) -> None:
        self._stop = threading.Event()
        self.acks: dict[int, list[tuple[float, float]]] = {q: [] for q in range(queues)}
        self._producer = tidemq.Producer(bootstrap)
        self._threads = [
            threading.Thread(target=self._run, args=(q,), daemon=True) for q in range(queues)
        ]

    def _run(self, queue: int) -> None:
        out = self.acks[queue]
        while not self._stop.is_set():
            start = time.perf_counter()
            self._producer.send(TOPIC, b"x" * 100, queue=queue)
            out.append((start, time.perf_counter()))

    def __enter__(self) -> Load:
        for t in self._threads:
            t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(60)
        self._producer.close()

    def window(self, start: float, end: float) -> dict[str, float]:
        """Ack latency and the longest per-queue gap between acks in [start, end]."""
        latencies = [
            (done - sent) * 1000
            for acks in self.acks.values()
            for sent, done in acks
            if start <= done <= end
        ]
        gaps = []
        for acks in self.acks.values():
            done = [start] + [d for _, d in acks if start <= d <= end] + [end]
            gaps.append(max(b - a for a, b in itertools.pairwise(done)) * 1000)
        latencies.sort()
        return {
            "acks": len(latencies),
            "p50_ms": latencies[len(latencies) // 2] if latencies else 0.0,
            "p99_ms": latencies[int(len(latencies) * 0.99)] if latencies else 0.0,
            "longest_pause_ms": max(gaps),
        }


def _throughput(bootstrap: str, queues: int, target: str) -> dict[str, float]:
    """Batched produce of 64 MiB to the topic, then a read of those 64 MiB."""
    with tidemq.Admin(bootstrap) as admin:
        before = {q.queue: q.max_offset for q in admin.describe_topic(TOPIC).queue_info}
    with tidemq.Producer(bootstrap) as producer:
        start = time.perf_counter()
        sent = _fill(producer, queues, 64 << 20)
        produce_s = time.perf_counter() - start
    consumer = tidemq.StreamConsumer(bootstrap, start="none", max_bytes_per_queue=8 << 20)
    try:
        consumer.assign([(TOPIC, q) for q in range(queues)])
        for q in range(queues):
            consumer.seek(TOPIC, q, before[q])
        got = 0
        start = time.perf_counter()
        while got < sent:
            got += sum(len(b) for b in consumer.poll_batches(1000)) * VALUE
        read_s = time.perf_counter() - start
    finally:
        consumer.close()
    print(
        f"  {target}: produce {sent / produce_s / 1e6:.0f} MB/s, read {got / read_s / 1e6:.0f} MB/s"
    )
    return {"produce_mb_s": sent / produce_s / 1e6, "read_mb_s": got / read_s / 1e6}


def _crossing(bootstrap: str, boundary: int, inside: int, reps: int = 200) -> dict[str, float]:
    """ms to read from one offset before a point to one after it, at a link boundary and
    inside a link."""

    def timed(at: int) -> list[float]:
        out = []
        consumer = tidemq.StreamConsumer(bootstrap, start="none", max_bytes_per_queue=4096)
        try:
            consumer.assign([(TOPIC, 0)])
            for _ in range(reps):
                consumer.seek(TOPIC, 0, at - 1)
                start = time.perf_counter()
                seen = 0
                while seen < 2:
                    seen += len(consumer.poll(1000))
                out.append((time.perf_counter() - start) * 1000)
        finally:
            consumer.close()
        return out

    across = statistics.median(timed(boundary))
    within = statistics.median(timed(inside))
    return {"across_ms": across, "within_ms": within, "ratio": across / within}


def _remap_with_delayed(
    admin: tidemq.Admin, bootstrap: str, args: argparse.Namespace
) -> dict[str, float]:
    """Remap while delayed messages wait on the write ends; the hand-over's cost."""
    chains = admin.describe_topic(TOPIC).chains
    here = {c.links[-1].broker for c in chains}
    target = "broker-a" if here == {"broker-b"} else "broker-b"
    with tidemq.Producer(bootstrap) as producer:
        futures = [
            producer.send_async(TOPIC, b"d" * 100, queue=n % args.queues, delay=3600)
            for n in range(args.delayed)
        ]
        for f in futures:
            f.result()
    batches = sum(t.pending_batches for t in admin.timer_status(TOPIC).topics)
    start = time.perf_counter()
    report = admin.remap_topic(TOPIC, brokers=[target])
    took = (time.perf_counter() - start) * 1000
    handed = sum(s.delayed for s in report.switches)
    assert handed == batches, f"{handed} of {batches} delayed batches handed over"
    print(f"remap with {args.delayed} delayed messages ({batches} batches) waiting: "
          f"{took:.0f} ms, {handed} batches handed over")  # fmt: skip
    return {"messages": args.delayed, "batches": batches, "remap_ms": took}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--queues", type=int, default=8)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--delayed", type=int, default=20_000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    j0 = peers.machine_jiffies()
    ns = _start("namesrv", ["namesrv", "--host", "127.0.0.1"])
    a = _start("broker-a", ["broker", "--namesrv", ns.address, "--broker-name", "broker-a",
                            "--data-dir", "data", "--http-port", "-1"])  # fmt: skip
    b = _start("broker-b", ["broker", "--namesrv", ns.address, "--broker-name", "broker-b",
                            "--data-dir", "data", "--http-port", "-1"])  # fmt: skip
    results: dict[str, Any] = {}
    try:
        with tidemq.Admin(ns.address) as admin:
            while len(admin.cluster_status()) < 2:
                time.sleep(0.05)
            admin.create_topic(TOPIC, args.queues, static=True, brokers=["broker-a"])
            with tidemq.Producer(ns.address) as producer:
                start = time.perf_counter()
                filled = _fill(producer, args.queues, int(args.gib * (1 << 30)))
                fill_s = time.perf_counter() - start
            print(f"filled {filled / (1 << 30):.2f} GiB in {fill_s:.1f} s")
            results["before"] = _throughput(ns.address, args.queues, "before (broker-a)")

            sizes = (_log_bytes(a), _log_bytes(b))
            start = time.perf_counter()
            report = admin.remap_topic(TOPIC, brokers=["broker-b"])
            took = (time.perf_counter() - start) * 1000
            moved = _log_bytes(a) - sizes[0] + _log_bytes(b) - sizes[1]
            print(f"remap of {len(report.switches)} queues holding {filled / (1 << 30):.2f} "
                  f"GiB: {took:.0f} ms, {moved} bytes moved")  # fmt: skip
            results["remap_idle"] = {"ms": took, "bytes_moved": moved}
            boundary = report.switches[0].at
            results["after"] = _throughput(ns.address, args.queues, "after (broker-b)")
            results["crossing"] = _crossing(ns.address, boundary, boundary // 2)
            print(f"  read across a link boundary {results['crossing']['across_ms']:.2f} ms, "
                  f"inside a link {results['crossing']['within_ms']:.2f} ms")  # fmt: skip

            runs = []
            with Load(ns.address, args.queues) as load:
                time.sleep(1.0)  # the load gets going
                for n in range(args.runs):
                    quiet_start = time.perf_counter()
                    time.sleep(0.5)
                    quiet = load.window(quiet_start, time.perf_counter())
                    target = "broker-a" if n % 2 == 0 else "broker-b"
                    start = time.perf_counter()
                    admin.remap_topic(TOPIC, brokers=[target])
                    end = time.perf_counter()
                    time.sleep(0.5)  # the producers' retries land
                    during = load.window(start, max(end, start + 0.5))
                    during["remap_ms"] = (end - start) * 1000
                    runs.append({"quiet": quiet, "during": during})
                    print(f"  run {n}: remap {during['remap_ms']:.0f} ms; during: p50 "
                          f"{during['p50_ms']:.2f} p99 {during['p99_ms']:.2f} ms, longest "
                          f"pause {during['longest_pause_ms']:.0f} ms; quiet: p99 "
                          f"{quiet['p99_ms']:.2f} ms, longest gap "
                          f"{quiet['longest_pause_ms']:.0f} ms")  # fmt: skip
            results["under_load"] = runs
            med = {
                k: statistics.median(r["during"][k] for r in runs)
                for k in ("remap_ms", "p99_ms", "longest_pause_ms")
            }
            quiet_p99 = statistics.median(r["quiet"]["p99_ms"] for r in runs)
            print(f"medians over {args.runs} remaps under load: remap {med['remap_ms']:.0f} ms, "
                  f"p99 {med['p99_ms']:.2f} ms (quiet {quiet_p99:.2f} ms), longest write "
                  f"pause {med['longest_pause_ms']:.0f} ms")  # fmt: skip
            results["delayed"] = _remap_with_delayed(admin, ns.address, args)
    finally:
        for server in (b, a, ns):
            server.stop()
    j = peers.machine_jiffies() - j0
    steal = 100 * j.steal / j.total if j.total else 0.0
    print(f"CPU steal {steal:.1f}%, load average {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**results, "steal_pct": steal}, indent=2))


if __name__ == "__main__":
    main()
