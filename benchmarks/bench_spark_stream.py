"""Spark streaming: micro-batch latency at a steady rate, and `archive` throughput.

    python benchmarks/bench_spark_stream.py            # 10,000 msg/s for 30 s; archive 1,000,000
    python benchmarks/bench_spark_stream.py --quick    # 10 s; archive 200,000

* **latency**: a producer thread sends 100-byte messages at `--rate` (batches every 10 ms)
  to a tidemq server (sync flush) while a streaming query (tidemq source, trigger as fast
  as possible, local[2]) hands each micro-batch to `foreachBatch`; a message's latency is
  the time its micro-batch reaches the driver's `foreachBatch` minus its producer
  timestamp. Reports p50 / p99 / max over the messages after a warm-up, and the batches.
  One run per invocation: run it several times for a median.
* **archive**: `run_archive` of a prefilled topic to Parquet in a temporary directory;
  rows/s from start to the end of the AvailableNow query.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers
from tidemq import Admin, Producer

VALUE = b"x" * 100


def session() -> Any:
    from pyspark.sql import SparkSession  # noqa: PLC0415 - pyspark is the spark extra

    import tidemq.spark  # noqa: PLC0415

    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bench-spark-stream")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tidemq.spark.register(spark)
    return spark


def latency(
    spark: Any, address: str, rate: int, seconds: float, warmup_s: float
) -> dict[str, float]:
    topic = f"lat-{time.monotonic_ns()}"
    Admin(address).create_topic(topic, 2)
    samples: list[float] = []
    batches = 0
    started = time.time()

    def on_batch(df: Any, batch_id: int) -> None:
        nonlocal batches
        now_ms = time.time() * 1000
        rows = df.select("timestamp").collect()
        batches += 1
        for row in rows:
            ts_ms = row["timestamp"].timestamp() * 1000
            if ts_ms / 1000 - started > warmup_s:
                samples.append(now_ms - ts_ms)

    stream = (
        spark.readStream.format("tidemq")
        .option("bootstrap", address)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .load()
    )
    query = stream.writeStream.foreachBatch(on_batch).trigger(processingTime="0 seconds").start()
    # Warm up: the first micro-batch of a fresh session starts Python workers (seconds).
    with Producer(address) as producer:
        producer.send(topic, VALUE, queue=0)
    deadline = time.monotonic() + 120
    while batches == 0 and time.monotonic() < deadline:
        time.sleep(0.2)
    started = time.time()
    stop = threading.Event()

    def produce() -> None:
        per_tick = max(1, rate // 100)
        with Producer(address) as producer:
            next_at = time.monotonic()
            q = 0
            while not stop.is_set():
                producer.send_batch(topic, [VALUE] * per_tick, queue=q)
                q ^= 1
                next_at += 0.01
                time.sleep(max(0.0, next_at - time.monotonic()))

    thread = threading.Thread(target=produce, daemon=True)
    thread.start()
    time.sleep(seconds)
    stop.set()
    thread.join(10)
    time.sleep(2.0)  # the last micro-batches
    query.stop()
    samples.sort()

    def pick(q: float) -> float:
        return samples[min(len(samples) - 1, int(q * len(samples)))] if samples else float("nan")

    return {
        "messages": len(samples),
        "micro_batches": batches,
        "p50_ms": pick(0.5),
        "p99_ms": pick(0.99),
        "max_ms": samples[-1] if samples else float("nan"),
    }


def archive(spark: Any, address: str, total: int) -> dict[str, float]:
    from tidemq.spark.pipelines.archive import run_archive  # noqa: PLC0415

    topic = f"arch-{time.monotonic_ns()}"
    Admin(address).create_topic(topic, 2)
    with Producer(address) as producer:
        for i in range(0, total, 1000):
            producer.send_batch(topic, [VALUE] * min(1000, total - i), queue=(i // 1000) % 2)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        run_archive(
            spark,
            bootstrap=address,
            topics=[topic],
            output=str(Path(tmp) / "out"),
            checkpoint=str(Path(tmp) / "cp"),
            max_offsets_per_trigger=200_000,
        )
        elapsed = time.perf_counter() - t0
    return {"messages": total, "seconds": elapsed, "rows_per_s": total / elapsed}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--rate", type=int, default=10_000)
    parser.add_argument("--seconds", type=float)
    parser.add_argument("--archive-messages", type=int)
    args = parser.parse_args()
    seconds = args.seconds or (10.0 if args.quick else 30.0)
    total = args.archive_messages or (200_000 if args.quick else 1_000_000)
    print(f"config: rate={args.rate} msg/s for {seconds} s, archive {total} messages, local[2]")
    server = peers.start_tidemq("sync")
    spark = session()
    try:
        lat = latency(spark, server.address, args.rate, seconds, warmup_s=min(5.0, seconds / 3))
        print("latency:", ", ".join(f"{k}={v:,.1f}" for k, v in lat.items()))
        arc = archive(spark, server.address, total)
        print("archive:", ", ".join(f"{k}={v:,.1f}" for k, v in arc.items()))
    finally:
        spark.stop()
        server.stop()


if __name__ == "__main__":
    main()
