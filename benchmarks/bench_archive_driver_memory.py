"""Does `archive` finish a ~2 GB topic with a 512 MiB driver? (issue 21: before executors
wrote the files, it needed about 3.6 GB of driver memory for 2 GB.)

Usage: ``python benchmarks/bench_archive_driver_memory.py [--gb G] [--size BYTES]
[--driver-memory M] [--json PATH]``

One `tidemq server` (a separate process, async flush, 127.0.0.1) is filled with G GB
(default 2) of random message values of BYTES (default 1,024) on 4 queues. A driver
process of its own (`local[2]`: the executor runs in the driver's JVM, so its heap bounds
the tasks too) with `spark.driver.memory=M` (default 512m) runs `run_archive` with its
defaults (AvailableNow, micro-batches of 100,000 messages) to the end. Reported: whether
it completed, the wall time and MB/s, the driver JVM's and the driver Python process's
peak RSS (VmHWM in /proc, read by the driver itself before it stops), and the rows and
bytes archived. A measurement script, not a test: it writes about G GB twice.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers
from bench_pipeline_archive import QUEUES, TOPIC, _fill

CHILD_TIMEOUT_S = 3600.0


def _peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _child(bootstrap: str, out: Path, memory: str) -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession  # noqa: PLC0415

    from tidemq.spark.pipelines.archive import run_archive  # noqa: PLC0415

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bench-archive-512m")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", memory)
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    jvm_pid = int(spark.sparkContext._jvm.java.lang.ProcessHandle.current().pid())  # type: ignore[union-attr]
    result: dict[str, Any] = {"completed": False}
    started = time.perf_counter()
    try:
        query = run_archive(
            spark, bootstrap=bootstrap, topics=[TOPIC], output=out / "out", checkpoint=out / "cp"
        )
        result["completed"] = query.exception() is None
        result["rows"] = sum(p["numInputRows"] for p in query.recentProgress)
    except Exception as exc:  # reported, not raised: the outcome is the figure
        result["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
    result["seconds"] = time.perf_counter() - started
    result["jvm_peak_rss_mib"] = _peak_rss_mib(jvm_pid)
    result["python_peak_rss_mib"] = _peak_rss_mib(os.getpid())
    result["output_bytes"] = sum(p.stat().st_size for p in (out / "out").rglob("*.parquet"))
    spark.stop()
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gb", type=float, default=2.0)
    parser.add_argument("--size", type=int, default=1024)
    parser.add_argument("--driver-memory", default="512m")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args.child[0], Path(args.child[1]), args.driver_memory)
        return
    import tidemq  # noqa: PLC0415

    messages = int(args.gb * 1e9 / args.size)
    work = Path(tempfile.mkdtemp(prefix="bench-archive-mem-"))
    try:
        with peers.start_tidemq("async", root=work) as server:
            with tidemq.Admin(server.address) as admin:
                admin.create_topic(TOPIC, QUEUES)
            filled = time.perf_counter()
            asyncio.run(_fill(server.address, messages, args.size))
            fill_s = time.perf_counter() - filled
            argv = [sys.executable, __file__, "--driver-memory", args.driver_memory]
            argv += ["--child", server.address, str(work / "archive")]
            proc = subprocess.run(
                argv, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S, check=False
            )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        result: dict[str, Any] = {"completed": False, "exit": proc.returncode}
        result["stderr"] = proc.stderr[-2000:]
    else:
        result = json.loads(lines[-1])
    result.update({"messages": messages, "size": args.size, "gb": messages * args.size / 1e9})
    result.update({"driver_memory": args.driver_memory, "fill_s": fill_s})
    mb = messages * args.size / 1e6
    rate = f"{mb / result['seconds']:.1f} MB/s" if "seconds" in result else "-"
    print(
        f"archive of {result['gb']:.2f} GB ({messages:,} x {args.size} B) with "
        f"spark.driver.memory={args.driver_memory}: completed={result['completed']}, "
        f"{result.get('seconds', 0):.0f} s ({rate}), peak RSS: driver JVM "
        f"{result.get('jvm_peak_rss_mib', 0):.0f} MiB, driver Python "
        f"{result.get('python_peak_rss_mib', 0):.0f} MiB; rows {result.get('rows', 0):,}; "
        f"load average {os.getloadavg()[0]:.2f}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
