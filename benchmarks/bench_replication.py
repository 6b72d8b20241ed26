"""Replication's cost (issue 23): P1 with replication factor 3 and min_insync_replicas 2
against factor 1, in the same run, and the ack latency added at 10,000 msg/s.

Usage: ``python benchmarks/bench_replication.py [--runs N] [--seconds S] [--json PATH]``

Every server is a separate process on 127.0.0.1 with its files in a temporary directory,
stopped by its PID afterwards (`peers.Server`): an etcd (Debian's `etcd`), a name server,
and either one plain broker (factor 1) or three members of a replica group (`tidemq
broker --group`, factor 3, all on this one machine and disk). Flush mode sync throughout.

* P1: one producer, batches of 256 x 100 B, 32 in flight (`bench_scale.produce_spread`),
  for `--seconds`; msg/s, and its ratio factor 3 / factor 1 (median of per-run ratios).
* Latency at 10,000 msg/s: batches of 100 x 100 B sent every 10 ms for `--seconds`,
  each batch's time from send to acknowledgement; p50 and p99 per factor.

The two setups take turns in each run (alternating which goes first). Machine CPU steal
over each measurement is reported (`peers.machine_jiffies`). Results go to
benchmarks/results/replication.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import bench_scale
import peers
from tidemq import aio

RESULTS = Path(__file__).resolve().parent / "results" / "replication.json"
SERVING = re.compile(r"serving on (?P<address>\S+)")
RATE_BATCH = 100
RATE_INTERVAL_S = 0.01  # 100 x 100 B every 10 ms: 10,000 msg/s
FAST = ["--set", "broker.broker_heartbeat_interval_ms=200", "--set", "broker.broker_ttl_ms=1500"]


def _tidemq(args: list[str], root: Path, name: str) -> peers.Server:
    argv = [sys.executable, "-m", "tidemq.cli.main", *args]
    return peers.Server(name, argv, root, ready=SERVING).start()


def _etcd(root: Path) -> tuple[peers.Server, str]:
    binary = shutil.which("etcd")
    if binary is None:
        raise peers.PeerMissing("etcd is not installed: run `make etcd`")
    client, peer = peers.free_port(), peers.free_port()
    url = f"http://127.0.0.1:{client}"
    argv = [binary, "--data-dir", str(root / "etcd"), "--listen-client-urls", url]
    argv += ["--advertise-client-urls", url, "--listen-peer-urls", f"http://127.0.0.1:{peer}"]
    argv += ["--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}"]
    argv += ["--initial-cluster", f"default=http://127.0.0.1:{peer}"]
    server = peers.Server("etcd", argv, root, ready=None).start(probe=("127.0.0.1", client))
    return server, url


@contextmanager
def setup(factor: int) -> Iterator[str]:
    """A name server and the brokers of one replication factor; yields the bootstrap."""
    root = Path(tempfile.mkdtemp(prefix=f"bench-rf{factor}-"))
    started: list[peers.Server] = []
    try:
        ns = _tidemq(["namesrv", "--port", "0", "--log-level", "warning", *FAST], root, "ns")
        started.append(ns)
        common = ["--namesrv", ns.address, "--http-port", "-1", "--flush", "sync"]
        common += ["--log-level", "warning", *FAST]
        if factor == 1:
            args = ["broker", "--data-dir", str(root / "b0"), "--port", "0", *common]
            started.append(_tidemq(args, root, "b0"))
        else:
            etcd, endpoint = _etcd(root)
            started.append(etcd)
            for i in range(factor):
                args = ["broker", "--data-dir", str(root / f"m{i}"), "--broker-name", f"m{i}"]
                args += ["--port", str(peers.free_port()), "--group", "g", "--etcd", endpoint]
                args += [*common, "--set", "replication.min_insync_replicas=2"]
                started.append(_tidemq(args, root, f"m{i}"))
        yield ns.address
    finally:
        for server in reversed(started):
            server.stop()
        shutil.rmtree(root, ignore_errors=True)


async def _ready(bootstrap: str) -> None:
    """Create the topic once the name server routes a broker that can take writes."""
    deadline = time.monotonic() + 60
    while True:
        try:
            async with aio.Admin(bootstrap) as admin:
                await admin.create_topic("p1", 1)
            producer = aio.Producer(bootstrap)
            try:
                await producer.send("p1", b"warm", queue=0)
            finally:
                await producer.close()
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.2)  # the group is electing and catching up


async def _p1(bootstrap: str, seconds: float) -> float:
    producer = aio.Producer(bootstrap)
    try:
        done = await bench_scale.produce_spread(
            producer, [("p1", 0)], max_messages=bench_scale.MAX_MESSAGES, seconds=seconds
        )
    finally:
        await producer.close()
    return done.messages / done.seconds


async def _latency(bootstrap: str, seconds: float) -> list[float]:
    producer = aio.Producer(bootstrap)
    values = [b"x" * 100] * RATE_BATCH
    out: list[float] = []
    pending: set[asyncio.Task[None]] = set()

    async def one() -> None:
        t0 = time.perf_counter()
        await producer.send_batch("p1", values, queue=0)
        out.append(time.perf_counter() - t0)

    try:
        start = time.perf_counter()
        n = 0
        while time.perf_counter() - start < seconds:
            task = asyncio.ensure_future(one())
            pending.add(task)
            task.add_done_callback(pending.discard)
            n += 1
            await asyncio.sleep(max(0.0, start + n * RATE_INTERVAL_S - time.perf_counter()))
        await asyncio.gather(*pending)
    finally:
        await producer.close()
    return out


def _measure(factor: int, seconds: float) -> dict[str, Any]:
    with setup(factor) as bootstrap:
        asyncio.run(_ready(bootstrap))
        before = peers.machine_jiffies()
        rate = asyncio.run(_p1(bootstrap, seconds))
        lat = sorted(asyncio.run(_latency(bootstrap, seconds)))
        used = peers.machine_jiffies() - before
    return {
        "msg_s": rate,
        "p50_ms": 1000 * lat[len(lat) // 2],
        "p99_ms": 1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))],
        "steal": used.steal / used.total if used.total else 0.0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--json", type=Path, default=RESULTS)
    args = parser.parse_args()
    runs: list[dict[int, dict[str, Any]]] = []
    for run in range(args.runs):
        order = (1, 3) if run % 2 == 0 else (3, 1)
        runs.append({f: _measure(f, args.seconds) for f in order})
        r = runs[-1]
        print(
            f"run {run}: rf1 {r[1]['msg_s']:,.0f} msg/s, rf3 {r[3]['msg_s']:,.0f} msg/s "
            f"({r[3]['msg_s'] / r[1]['msg_s']:.2f}x); at 10k msg/s p50/p99 "
            f"rf1 {r[1]['p50_ms']:.1f}/{r[1]['p99_ms']:.1f} ms, "
            f"rf3 {r[3]['p50_ms']:.1f}/{r[3]['p99_ms']:.1f} ms; "
            f"steal {max(r[1]['steal'], r[3]['steal']):.1%}"
        )

    def med(f: int, key: str) -> float:
        return float(statistics.median(r[f][key] for r in runs))

    summary = {
        "rf1_msg_s": med(1, "msg_s"),
        "rf3_msg_s": med(3, "msg_s"),
        "ratio": statistics.median(r[3]["msg_s"] / r[1]["msg_s"] for r in runs),
        "rf1_p50_ms": med(1, "p50_ms"),
        "rf1_p99_ms": med(1, "p99_ms"),
        "rf3_p50_ms": med(3, "p50_ms"),
        "rf3_p99_ms": med(3, "p99_ms"),
        "runs": runs,
    }
    print(
        f"median of {args.runs}: P1 rf3/rf1 {summary['ratio']:.2f}x "
        f"({summary['rf3_msg_s']:,.0f} vs {summary['rf1_msg_s']:,.0f} msg/s); "
        f"ack latency at 10k msg/s p50 {summary['rf1_p50_ms']:.1f} -> "
        f"{summary['rf3_p50_ms']:.1f} ms, p99 {summary['rf1_p99_ms']:.1f} -> "
        f"{summary['rf3_p99_ms']:.1f} ms"
    )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(summary, indent=2, default=str))


if __name__ == "__main__":
    main()
