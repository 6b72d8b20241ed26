"""Spark batch read of tidemq against the ceiling of PySpark's Python Data Source API.

Usage: ``python benchmarks/bench_spark.py [--quick] [--messages N] [--queues Q]
[--batch B] [--runs R] [--ceiling-rows K] [--dir PATH] [--json PATH]``

One `tidemq server` (a separate process, async flush, on 127.0.0.1) is filled with N
messages of 100 B (default 5,000,000; 500,000 with --quick) over Q queues (default 4),
produced with `send_batch` in batches of B (default 1,000: one commit-log record each).
A local SparkSession (`local[2]`, the test configuration of conventions.md §5) then
measures, alternating, in the same run:

* tidemq: `spark.read.format("tidemq")` over the whole topic (one partition per queue);
* ceiling: a Python data source with the same schema and partitions whose `read()`
  yields one pre-built `pyarrow.RecordBatch` of K rows (default 65,536, about what one
  8 MiB fetch holds) again and again from memory: no I/O and no decoding, only what
  Spark's Python Data Source API itself costs.

Each run is `df.write.format("noop").mode("overwrite").save()` (every row is read and
materialised in the JVM, nothing is written). The JVM keeps its default JIT (the tests'
`-XX:TieredStopAtLevel=1` trades throughput for start-up); `BENCH_JVM_OPTS` replaces the
driver's Java options (default `-Xss16m`). After one untimed warm-up of each, each
figure is the median of R runs (default 3), in rows/s; the ratio is the median of the
per-run ratios tidemq / ceiling. Target: 80% of the ceiling. Also printed: the CPU
seconds per million rows that every process of the run used (this one, the JVM, Spark's
Python workers, the server), which a busy machine disturbs less than the rates. Results
are printed and written to benchmarks/results/spark.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyspark
from pyspark.sql import SparkSession
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

sys.path.insert(0, str(Path(__file__).resolve().parent))

import tidemq.spark
from peers import start_tidemq
from tidemq import Admin
from tidemq.aio import Producer as AsyncProducer
from tidemq.core.arrow import source_schema
from tidemq.spark.source import spark_schema

RESULTS = Path(__file__).resolve().parent / "results" / "spark.json"
TOPIC = "bench-spark"
MESSAGE_BYTES = 100
TARGET = 0.80


# --------------------------------------------------------------------------- the ceiling


class _Slice(InputPartition):
    def __init__(self, index: int, rows: int, batch_rows: int) -> None:
        super().__init__(index)
        self.rows = rows
        self.batch_rows = batch_rows


def _prebuilt_batch(rows: int) -> Any:
    """A RecordBatch of the tidemq source's schema, as a 100 B message topic gives it."""
    value_data = os.urandom(MESSAGE_BYTES) * rows
    offsets = pa.array(range(0, (rows + 1) * MESSAGE_BYTES, MESSAGE_BYTES), pa.int32())
    values = pa.Array.from_buffers(
        pa.binary(), rows, [None, offsets.buffers()[1], pa.py_buffer(value_data)]
    )
    now_us = int(time.time() * 1_000_000)
    columns = {
        "key": pa.nulls(rows, pa.binary()),
        "value": values,
        "topic": pa.repeat(pa.scalar(TOPIC, pa.string()), rows),
        "partition": pa.repeat(pa.scalar(0, pa.int32()), rows),
        "offset": pa.array(range(rows), pa.int64()),
        "timestamp": pa.repeat(pa.scalar(now_us, pa.timestamp("us", tz="UTC")), rows),
        "timestampType": pa.repeat(pa.scalar(0, pa.int32()), rows),
        "tag": pa.nulls(rows, pa.string()),
        "keys": pa.array([[]] * rows, source_schema(False).field("keys").type),
    }
    schema = source_schema(False)
    return pa.RecordBatch.from_arrays([columns[n] for n in schema.names], schema=schema)


class _CeilingReader(DataSourceReader):
    def __init__(self, options: Any) -> None:
        self.total = int(options["rows"])
        self.parts = int(options["partitions"])
        self.batch_rows = int(options["batch_rows"])

    def partitions(self) -> Sequence[InputPartition]:
        share, extra = divmod(self.total, self.parts)
        return [
            _Slice(i, share + (1 if i < extra else 0), self.batch_rows) for i in range(self.parts)
        ]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, _Slice)
        batch = _prebuilt_batch(partition.batch_rows)  # built once, yielded again and again
        left = partition.rows
        while left > 0:
            n = min(left, batch.num_rows)
            yield batch if n == batch.num_rows else batch.slice(0, n)
            left -= n


class CeilingSource(DataSource):
    """Pre-built Arrow batches from memory, the tidemq source's schema."""

    @classmethod
    def name(cls) -> str:
        return "tidemq_bench_ceiling"

    def schema(self) -> StructType:
        return spark_schema(False)

    def reader(self, schema: StructType) -> DataSourceReader:
        return _CeilingReader(self.options)


# --------------------------------------------------------------------------- setup


async def _fill(bootstrap: str, messages: int, queues: int, batch: int) -> float:
    values = [os.urandom(MESSAGE_BYTES) for _ in range(256)]
    start = time.perf_counter()
    async with AsyncProducer(bootstrap, idempotent=False) as producer:
        pending: list[asyncio.Future[Any]] = []
        sent = 0
        i = 0
        while sent < messages:
            n = min(batch, messages - sent)
            chunk = [values[(i + j) % 256] for j in range(n)]
            pending.append(await producer.send_batch_nowait(TOPIC, chunk, queue=i % queues))
            sent += n
            i += 1
            if len(pending) >= 32:
                await asyncio.gather(*pending)
                pending.clear()
        await asyncio.gather(*pending)
    return messages / (time.perf_counter() - start)


def _session() -> SparkSession:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bench-spark")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.default.parallelism", "2")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", os.environ.get("BENCH_JVM_OPTS", "-Xss16m"))
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tidemq.spark.register(spark)
    spark.dataSource.register(CeilingSource)
    return spark


def _tree_cpu_s() -> float:
    """CPU seconds used so far by this process and its descendants (the JVM, Spark's
    Python workers, the server); 0 where /proc is missing. Processes that already exited
    are not counted (Spark's workers are reused, so few do)."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    cpu: dict[int, float] = {}
    try:
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry)] = int(fields[1])
            cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    except OSError:
        return 0.0
    mine = {os.getpid()}
    grew = True
    while grew:
        grew = False
        for pid, parent in parents.items():
            if parent in mine and pid not in mine:
                mine.add(pid)
                grew = True
    return sum(cpu.get(pid, 0.0) for pid in mine)


def _timed_noop(df: Any) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one read of every row."""
    cpu = _tree_cpu_s()
    start = time.perf_counter()
    df.write.format("noop").mode("overwrite").save()
    return time.perf_counter() - start, _tree_cpu_s() - cpu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="500,000 messages")
    parser.add_argument("--messages", type=int, default=None, help="default 5,000,000")
    parser.add_argument("--queues", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1000, help="messages per send_batch")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ceiling-rows", type=int, default=65_536, help="rows per batch")
    parser.add_argument("--dir", type=Path, default=None, help="parent of the server's data")
    parser.add_argument("--json", type=Path, default=RESULTS, help="where to write results")
    args = parser.parse_args(argv)
    messages = args.messages or (500_000 if args.quick else 5_000_000)

    root = Path(tempfile.mkdtemp(prefix=".bench-spark-", dir=args.dir))
    try:
        with start_tidemq("async", root=root) as server:
            with Admin(server.address) as admin:
                admin.create_topic(TOPIC, args.queues)
            fill_rate = asyncio.run(_fill(server.address, messages, args.queues, args.batch))
            spark = _session()
            env = {
                "messages": messages,
                "message_bytes": MESSAGE_BYTES,
                "queues": args.queues,
                "send_batch_messages": args.batch,
                "ceiling_batch_rows": args.ceiling_rows,
                "runs": args.runs,
                "spark": pyspark.__version__,
                "master": spark.sparkContext.master,
                "python": platform.python_version(),
                "pyarrow": pa.__version__,
                "cpus": os.cpu_count(),
                "machine": platform.machine(),
                "java": shutil.which("java") or "?",
                "fill_msgs_per_s": round(fill_rate),
            }
            print("tidemq Spark source benchmark: batch read, df.write.format('noop')")
            for name, value in env.items():
                print(f"  {name:<22} {value}")
            tidemq_df = (
                spark.read.format("tidemq")
                .option("bootstrap", server.address)
                .option("subscribe", TOPIC)
                .load()
            )
            ceiling_df = (
                spark.read.format("tidemq_bench_ceiling")
                .option("rows", str(messages))
                .option("partitions", str(args.queues))
                .option("batch_rows", str(args.ceiling_rows))
                .load()
            )
            assert tidemq_df.count() == messages, "the topic does not hold every message"
            _timed_noop(ceiling_df)  # warm-up: workers, JIT
            _timed_noop(tidemq_df)
            tidemq_rates, ceiling_rates = [], []
            tidemq_cpu, ceiling_cpu = [], []
            for run in range(args.runs):
                wall, cpu = _timed_noop(ceiling_df)
                ceiling_rates.append(messages / wall)
                ceiling_cpu.append(cpu / messages * 1e6)
                wall, cpu = _timed_noop(tidemq_df)
                tidemq_rates.append(messages / wall)
                tidemq_cpu.append(cpu / messages * 1e6)
                print(
                    f"  run {run + 1}: ceiling {ceiling_rates[-1]:,.0f} rows/s "
                    f"({ceiling_cpu[-1]:.2f} CPU s per 1M rows), tidemq "
                    f"{tidemq_rates[-1]:,.0f} rows/s ({tidemq_cpu[-1]:.2f} CPU s per 1M rows)"
                )
            spark.stop()
    finally:
        shutil.rmtree(root, ignore_errors=True)

    ratios = [t / c for t, c in zip(tidemq_rates, ceiling_rates, strict=True)]
    ratio = statistics.median(ratios)
    result: dict[str, Any] = {
        "environment": env,
        "tidemq_rows_per_s": round(statistics.median(tidemq_rates)),
        "ceiling_rows_per_s": round(statistics.median(ceiling_rates)),
        "tidemq_runs": [round(r) for r in tidemq_rates],
        "ceiling_runs": [round(r) for r in ceiling_rates],
        "ratio": round(ratio, 3),
        "target_ratio": TARGET,
        "tidemq_cpu_s_per_million_rows": round(statistics.median(tidemq_cpu), 3),
        "ceiling_cpu_s_per_million_rows": round(statistics.median(ceiling_cpu), 3),
        "loadavg_at_end": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }
    print()
    print(f"  tidemq   {result['tidemq_rows_per_s']:>12,} rows/s (median of {args.runs})")
    print(f"  ceiling  {result['ceiling_rows_per_s']:>12,} rows/s (median of {args.runs})")
    print(
        f"  CPU      tidemq {result['tidemq_cpu_s_per_million_rows']:.2f} s, ceiling "
        f"{result['ceiling_cpu_s_per_million_rows']:.2f} s per 1M rows (every process of the run)"
    )
    print(f"  load average at the end: {result['loadavg_at_end']}")
    verdict = "meets" if ratio >= TARGET else "misses"
    print(f"  ratio    {ratio:.1%} of the ceiling ({verdict} the {TARGET:.0%} target)")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
