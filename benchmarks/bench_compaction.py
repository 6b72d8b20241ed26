"""Compact topics (issue 18): compaction throughput and space reclaimed, produce latency
during compaction, and key lookups against Redis GET, in one run.

Usage: ``python benchmarks/bench_compaction.py [--updates N] [--keys K] [--size B]
[--runs R] [--seconds S] [--json PATH]``

1. Store, no server: `--updates` (1,000,000; the issue's figure is 10,000,000) updates of
   `--size` (100) byte values over `--keys` (100,000) keys, in batches of 1,000, then one
   compaction run of the queue: MB/s and messages/s of input, bytes before and after.
   `--runs` times (fresh directory each), medians.
2. `tidemq server` (sync flush): the same stream into a compact topic, then one message
   per round trip (`Producer.send`) for `--seconds` without compaction and again while a
   compaction run of the topic goes on (`Admin.compact` from another thread): p50/p99.
3. Key lookups, one per round trip, for `--seconds` each, over the same keys: tidemq
   `Admin.get` and redis-py `GET` (redis-server, no persistence, the keys `SET` first),
   alternating, `--runs` rounds: p50/p99 and lookups/s, and the ratio.

CPU steal and load average over the run are printed with the figures.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers
import tidemq
from tidemq.core.batch import encode_values
from tidemq.store.config import FlushMode, StoreConfig
from tidemq.store.message_store import MessageStore
from tidemq.store.metadata import CleanupPolicy

BATCH = 1_000


def _keys(n: int) -> list[bytes]:
    return [b"key-%08d" % i for i in range(n)]


def store_run(updates: int, keys: int, size: int) -> dict[str, float]:
    """One compaction run of one queue holding `updates` updates over `keys` keys."""
    rng = random.Random(7)
    names = _keys(keys)
    value = bytes(size)
    with tempfile.TemporaryDirectory(prefix="bench-compaction-") as tmp:
        store = MessageStore.open(StoreConfig(data_dir=Path(tmp), flush_mode=FlushMode.ASYNC))
        try:
            store.create_topic("kv", 1, cleanup_policy=CleanupPolicy.COMPACT)
            now = int(time.time() * 1000)
            for start in range(0, updates, BATCH):
                n = min(BATCH, updates - start)
                batch_keys = [names[rng.randrange(keys)] for _ in range(n)]
                store.append("kv", 0, encode_values([value] * n, timestamp_ms=now, keys=batch_keys))
            store.flush()
            before = store.end_position
            t0 = time.perf_counter()
            result = store.compact("kv", 0)
            elapsed = time.perf_counter() - t0
            return {
                "seconds": elapsed,
                "input_mb_s": result.bytes_in / elapsed / 1e6,
                "messages_s": result.messages_in / elapsed,
                "bytes_before": before,
                "bytes_after": result.bytes_out,
                "messages_kept": result.messages_out,
            }
        finally:
            store.close()


def _percentiles(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {
        "p50_ms": ordered[len(ordered) // 2] * 1000,
        "p99_ms": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] * 1000,
        "per_s": len(ordered) / sum(ordered) if ordered else 0.0,
    }


def _timed(
    fn: Any, seconds: float, limit: int = 1_000_000, while_alive: threading.Thread | None = None
) -> list[float]:
    """Per-call latencies of `fn` for `seconds` (or until `while_alive` ends)."""
    out: list[float] = []
    deadline = time.perf_counter() + seconds
    for i in range(limit):
        t0 = time.perf_counter()
        fn(i)
        out.append(time.perf_counter() - t0)
        if time.perf_counter() >= deadline or (while_alive and not while_alive.is_alive()):
            break
    return out


def server_runs(args: argparse.Namespace) -> dict[str, Any]:
    names = _keys(args.keys)
    rng = random.Random(11)
    value = bytes(args.size)
    out: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        # No background compaction: the runs are the benchmark's own.
        server = stack.enter_context(
            peers.start_tidemq(
                "sync", extra=["--set", "broker.compaction_check_interval_ms=3600000"]
            )
        )
        admin = stack.enter_context(tidemq.Admin(server.address))
        producer = stack.enter_context(tidemq.Producer(server.address))
        admin.create_topic("bench-kv", 1, config={"cleanup.policy": "compact"})
        for start in range(0, args.updates, BATCH):
            n = min(BATCH, args.updates - start)
            batch_keys = [names[rng.randrange(args.keys)] for _ in range(n)]
            for k in batch_keys:
                producer.send_async("bench-kv", value, key=k)
            producer.flush()

        def send(i: int) -> None:
            producer.send("bench-kv", value, key=names[i % args.keys])

        out["produce_idle"] = _percentiles(_timed(send, args.seconds))
        runner = threading.Thread(target=admin.compact, args=("bench-kv",))
        t0 = time.perf_counter()
        runner.start()
        # Only sends made while the run goes on (the request returns when it is switched).
        during = _timed(send, 600.0, while_alive=runner)
        runner.join(600)
        out["produce_while_compacting"] = _percentiles(during)
        out["compaction_on_the_server_s"] = time.perf_counter() - t0
        out["get"], out["redis_get"], out["get_ratio"] = _lookups(args, admin, names, stack)
    return out


def _lookups(
    args: argparse.Namespace, admin: tidemq.Admin, names: list[bytes], stack: contextlib.ExitStack
) -> tuple[dict[str, float], dict[str, float] | str, float | None]:
    def get(i: int) -> None:
        admin.get("bench-kv", names[(i * 7919) % len(names)])

    try:
        import redis  # noqa: PLC0415 - optional peer

        rserver = stack.enter_context(peers.start_redis(appendonly=False))
        host, port = rserver.address.rsplit(":", 1)
        r: Any = redis.Redis(host=host, port=int(port))
        pipe = r.pipeline(transaction=False)
        for k in names:
            pipe.set(k, bytes(args.size))
        pipe.execute()
    except peers.PeerMissing as exc:
        return _percentiles(_timed(get, args.seconds)), f"missing: {exc}", None

    def rget(i: int) -> None:
        r.get(names[(i * 7919) % len(names)])

    ours: list[dict[str, float]] = []
    theirs: list[dict[str, float]] = []
    for _ in range(args.runs):
        ours.append(_percentiles(_timed(get, args.seconds)))
        theirs.append(_percentiles(_timed(rget, args.seconds)))
    r.close()
    med = {k: statistics.median(x[k] for x in ours) for k in ours[0]}
    rmed = {k: statistics.median(x[k] for x in theirs) for k in theirs[0]}
    ratio = statistics.median(a["per_s"] / b["per_s"] for a, b in zip(ours, theirs, strict=True))
    return med, rmed, ratio


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--updates", type=int, default=1_000_000)
    parser.add_argument("--keys", type=int, default=100_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    j0 = peers.machine_jiffies()
    runs = [store_run(args.updates, args.keys, args.size) for _ in range(args.runs)]
    store = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    print(
        f"compaction of {args.updates:,} updates over {args.keys:,} keys ({args.size} B): "
        f"{store['input_mb_s']:.1f} MB/s, {store['messages_s']:,.0f} msg/s of input, "
        f"{store['seconds']:.2f} s; {store['bytes_before'] / 1e6:.1f} MB -> "
        f"{store['bytes_after'] / 1e6:.1f} MB ({store['messages_kept']:,.0f} messages kept)"
    )
    served = server_runs(args)
    print(f"compaction on the server: {served['compaction_on_the_server_s']:.2f} s")
    for name in ("produce_idle", "produce_while_compacting", "get"):
        f = served[name]
        print(f"{name}: p50 {f['p50_ms']:.3f} ms, p99 {f['p99_ms']:.3f} ms, {f['per_s']:,.0f}/s")
    redis_get = served["redis_get"]
    if isinstance(redis_get, dict):
        print(
            f"redis GET: p50 {redis_get['p50_ms']:.3f} ms, p99 {redis_get['p99_ms']:.3f} ms, "
            f"{redis_get['per_s']:,.0f}/s; tidemq get / redis GET = {served['get_ratio']:.2f}"
        )
    else:
        print(f"redis GET: {redis_get}")
    j = peers.machine_jiffies() - j0
    steal = 100 * j.steal / j.total if j.total else 0.0
    print(f"CPU steal {steal:.1f}%, load average {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"store": store, **served, "steal_pct": steal}, indent=2))


if __name__ == "__main__":
    main()
