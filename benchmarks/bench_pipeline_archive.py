"""The `archive` pipeline against a plain Spark read-and-write of the same data, in the same
run, in local mode and on a standalone cluster (issue 21: target >= 0.8x).

Usage: ``python benchmarks/bench_pipeline_archive.py [--messages N] [--size BYTES]
[--runs R] [--modes local,standalone] [--json PATH]``

One `tidemq server` (a separate process, async flush, 127.0.0.1) holds N messages
(default 300,000) of random values of BYTES (default 1,024) on 4 queues, in batches of
256. Two drivers in turn, in this process: `local[2]`, then a standalone cluster (a master
and a worker with 2 cores and 2 GiB started from the pyspark package,
`tests/support/spark_standalone.py`; the driver in local mode has the same 2 GiB). In
each, after one untimed warm-up of both, R alternating runs (default 3) of:

* archive: `run_archive` with AvailableNow and its defaults (micro-batches of at most
  1,000,000 messages: N = 300,000 is one), a new output directory and checkpoint each
  run;
* archive in micro-batches of 100,000 messages (the other pipelines' default, and
  archive's before issue 21's speed-up): what more micro-batches cost;
* plain: ``spark.read.format("tidemq").option("subscribe", topic).load()
  .write.parquet(dir)`` (one batch job, zstd as archive writes).

Figures: MB/s of message values (N x BYTES / wall seconds), medians, and the medians of
the per-run ratios archive / plain. CPU steal and the load average are printed.
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
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests.support

from tests.support.spark_standalone import standalone_cluster

import peers

TOPIC = "bench-archive"
QUEUES = 4
BATCH = 256
MEMORY = "2g"


async def _fill(bootstrap: str, messages: int, size: int) -> None:
    from tidemq.aio import Producer  # noqa: PLC0415

    values = [os.urandom(size) for _ in range(BATCH)]
    async with Producer(bootstrap, idempotent=False) as producer:
        pending: list[Any] = []
        sent = 0
        i = 0
        while sent < messages:
            n = min(BATCH, messages - sent)
            pending.append(await producer.send_batch_nowait(TOPIC, values[:n], queue=i % QUEUES))
            sent += n
            i += 1
            if len(pending) >= 32:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)


def _session(master: str) -> Any:
    from pyspark.sql import SparkSession  # noqa: PLC0415

    import tidemq.spark  # noqa: PLC0415

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.master(master)
        .appName("bench-archive")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", MEMORY)
        .config("spark.executor.memory", MEMORY)
        .config("spark.executor.cores", "2")
        .config("spark.cores.max", "2")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.parquet.compression.codec", "zstd")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tidemq.spark.register(spark)
    return spark


def _archive(spark: Any, bootstrap: str, work: Path, *, small_batches: bool = False) -> float:
    from tidemq.spark.pipelines.archive import run_archive  # noqa: PLC0415
    from tidemq.spark.pipelines.streams import (  # noqa: PLC0415
        ARCHIVE_MAX_OFFSETS_PER_TRIGGER,
        DEFAULT_MAX_OFFSETS_PER_TRIGGER,
    )

    out = Path(tempfile.mkdtemp(prefix="archive-", dir=work))
    started = time.perf_counter()
    query = run_archive(
        spark,
        bootstrap=bootstrap,
        topics=[TOPIC],
        output=out / "out",
        checkpoint=out / "cp",
        max_offsets_per_trigger=(
            DEFAULT_MAX_OFFSETS_PER_TRIGGER if small_batches else ARCHIVE_MAX_OFFSETS_PER_TRIGGER
        ),
    )
    seconds = time.perf_counter() - started
    assert query.exception() is None
    shutil.rmtree(out, ignore_errors=True)
    return seconds


def _plain(spark: Any, bootstrap: str, work: Path) -> float:
    out = Path(tempfile.mkdtemp(prefix="plain-", dir=work))
    started = time.perf_counter()
    df = spark.read.format("tidemq").option("bootstrap", bootstrap).option("subscribe", TOPIC)
    df.load().write.mode("overwrite").parquet(str(out / "out"))
    seconds = time.perf_counter() - started
    shutil.rmtree(out, ignore_errors=True)
    return seconds


def _measure(master: str, bootstrap: str, work: Path, runs: int, mb: float) -> dict[str, Any]:
    spark = _session(master)
    seconds: dict[str, list[float]] = {"archive": [], "archive_100k": [], "plain": []}
    try:
        _archive(spark, bootstrap, work)  # warm-up
        _plain(spark, bootstrap, work)
        for _ in range(runs):
            seconds["archive"].append(_archive(spark, bootstrap, work))
            seconds["archive_100k"].append(_archive(spark, bootstrap, work, small_batches=True))
            seconds["plain"].append(_plain(spark, bootstrap, work))
    finally:
        spark.stop()
    rates = {way: [mb / s for s in values] for way, values in seconds.items()}
    out: dict[str, Any] = {}
    for way, values in rates.items():
        out[f"{way}_mb_s"] = statistics.median(values)
        out[f"{way}_mb_s_all"] = values
    for way in ("archive", "archive_100k"):
        pairs = zip(rates[way], rates["plain"], strict=True)
        out[f"{way}_ratio"] = statistics.median(a / p for a, p in pairs)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=300_000)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", default="local,standalone")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import tidemq  # noqa: PLC0415

    mb = args.messages * args.size / 1e6
    work = Path(tempfile.mkdtemp(prefix="bench-archive-"))
    j0 = peers.machine_jiffies()
    results: dict[str, Any] = {"messages": args.messages, "size": args.size, "mb": mb}
    try:
        with peers.start_tidemq("async") as server:
            with tidemq.Admin(server.address) as admin:
                admin.create_topic(TOPIC, QUEUES)
            asyncio.run(_fill(server.address, args.messages, args.size))
            for mode in args.modes.split(","):
                if mode == "local":
                    results[mode] = _measure("local[2]", server.address, work, args.runs, mb)
                    continue
                cluster_dir = Path(tempfile.mkdtemp(prefix="cluster-", dir=work))
                with standalone_cluster(cluster_dir, cores=2, memory=MEMORY) as cluster:
                    results[mode] = _measure(cluster.master, server.address, work, args.runs, mb)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    j = peers.machine_jiffies() - j0
    results["steal_pct"] = 100 * j.steal / j.total if j.total else 0.0
    for mode in args.modes.split(","):
        r = results[mode]
        print(
            f"{mode}: archive {r['archive_mb_s']:.1f} MB/s ({r['archive_ratio']:.2f}x), in "
            f"micro-batches of 100,000 {r['archive_100k_mb_s']:.1f} MB/s "
            f"({r['archive_100k_ratio']:.2f}x), plain read+write.parquet "
            f"{r['plain_mb_s']:.1f} MB/s"
        )
    print(
        f"{args.messages:,} messages of {args.size} B ({mb:.0f} MB); median of {args.runs}; "
        f"CPU steal {results['steal_pct']:.1f}%, load average {os.getloadavg()[0]:.2f}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
