"""Spark batch read of an offloaded topic (issue 21): executors reading the tier's Parquet
files themselves (`readFromTier=auto`) against the same range through the broker
(`readFromTier=never`), in the same run.

Usage: ``python benchmarks/bench_spark_tier.py [--messages N] [--runs R] [--json PATH]``

One `tidemq server` (a separate process, sync flush) with a directory tier; a topic of 4
queues with `remote.storage.enable=true` and `local.retention.ms=0`, filled with N
(default 1,000,000) random 100 B messages in batches of 1,000, then offloaded whole
(`tier_offload`: the local copies go, the broker can serve them only from the tier), its
tier cache at 1 MiB (`--broker-cache-mib`) so that every read through it fetches from the
tier as a first read of history does (a warm 256 MiB cache would hold this whole topic). A
local SparkSession (`local[2]`) then reads every row, `write.format("noop")`, alternating
the two ways after one untimed warm-up of each; medians of R runs (default 3) in rows/s,
and the median of the per-run ratios. CPU steal and the load average are printed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers
import tidemq
from bench_spark import TOPIC, _fill, _session

QUEUES = 4


def _timed(spark: Any, address: str, mode: str, messages: int) -> float:
    df = (
        spark.read.format("tidemq")
        .option("bootstrap", address)
        .option("subscribe", TOPIC)
        .option("readFromTier", mode)
        .load()
    )
    started = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return messages / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--broker-cache-mib", type=int, default=1)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    tier = Path(tempfile.mkdtemp(prefix="bench-spark-tier-"))
    j0 = peers.machine_jiffies()
    try:
        extra = [
            *("--set", f"tiered.url=file://{tier}"),
            *("--set", "tiered.check_interval_ms=3600000"),
            # A first read of history: the broker's row-group cache does not hold it.
            *("--set", f"tiered.cache_bytes={args.broker_cache_mib * 1024 * 1024}"),
        ]
        with peers.start_tidemq("sync", extra=extra) as server:
            with tidemq.Admin(server.address) as admin:
                admin.create_topic(
                    TOPIC,
                    QUEUES,
                    config={"remote.storage.enable": "true", "local.retention.ms": "0"},
                )
                asyncio.run(_fill(server.address, args.messages, QUEUES, 1000))
                statuses = admin.tier_offload(TOPIC)
            queues = [q for s in statuses for q in s.queues]
            assert all(q.local_min == q.next_offset == q.remote_end for q in queues), queues
            spark = _session()
            try:
                for mode in ("auto", "never"):  # warm-up
                    _timed(spark, server.address, mode, args.messages)
                runs: dict[str, list[float]] = {"auto": [], "never": []}
                for _ in range(args.runs):
                    for mode in ("auto", "never"):
                        runs[mode].append(_timed(spark, server.address, mode, args.messages))
            finally:
                spark.stop()
    finally:
        shutil.rmtree(tier, ignore_errors=True)
    j = peers.machine_jiffies() - j0
    steal = 100 * j.steal / j.total if j.total else 0.0
    ratios = [a / b for a, b in zip(runs["auto"], runs["never"], strict=True)]
    results: dict[str, Any] = {
        "messages": args.messages,
        "from_tier_rows_s": statistics.median(runs["auto"]),
        "through_broker_rows_s": statistics.median(runs["never"]),
        "ratio": statistics.median(ratios),
        "steal_pct": steal,
    }
    print(
        f"Spark read of {args.messages:,} offloaded messages: from the tier's files "
        f"{results['from_tier_rows_s']:,.0f} rows/s, through the broker "
        f"{results['through_broker_rows_s']:,.0f} rows/s ({results['ratio']:.2f}x); median "
        f"of {args.runs}; CPU steal {steal:.1f}%, load average {os.getloadavg()[0]:.2f}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
