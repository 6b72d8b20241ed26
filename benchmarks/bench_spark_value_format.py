"""Typed values in Spark (issue 19): a batch read of an Avro topic decoded into a struct
column (`valueFormat=avro`) against the same topic read as raw bytes, in the same run.

Usage: ``python benchmarks/bench_spark_avro.py [--records N] [--runs R] [--json PATH]``

One `tidemq server` with its registry; `--records` (200,000) 10-field `Event` records
(bench_serde's) written typed with `tidemq.AvroSerializer`; a local SparkSession
(bench_spark's, `local[2]`). Each run aggregates over every message twice, taking turns: raw (the
length of each value, so that Spark reads every value) and decoded (a sum over a
decoded field, so that every value is decoded). Rows/s, medians of `--runs` (3), with
CPU steal and the load average.
"""

from __future__ import annotations

import argparse
import contextlib
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
import tidemq.spark
from bench_serde import BATCH, Event, records
from bench_spark import _session

TOPIC = "bench-avro"


def _fill(address: str, url: str, events: list[Event]) -> None:
    to_bytes = tidemq.AvroSerializer(tidemq.SchemaRegistry(url), Event)
    with tidemq.Admin(address) as admin, tidemq.Producer(address) as producer:
        admin.create_topic(TOPIC, 2)
        for i in range(0, len(events), BATCH):
            chunk = events[i : i + BATCH]
            producer.send_batch(TOPIC, [to_bytes(TOPIC, e) for e in chunk], queue=i // BATCH % 2)
        producer.flush()


def _rate(n: int, fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    events = records(args.records)
    j0 = peers.machine_jiffies()
    figures: dict[str, list[float]] = {"raw": [], "avro": []}
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(peers.start_tidemq("async", extra=["--http-port", "0"]))
        url = "http://" + server.http_address
        _fill(server.address, url, events)
        spark = _session()
        stack.callback(spark.stop)
        reader = spark.read.format("tidemq").option("bootstrap", server.address)
        raw = reader.option("subscribe", TOPIC).load()
        typed = (
            reader.option("subscribe", TOPIC)
            .option("valueFormat", "avro")
            .option("schemaRegistry", url)
            .load()
        )
        # Warm up both (the JVM, Spark's Python workers, the registry lookups) first.
        raw.selectExpr("sum(length(value))").collect()
        typed.selectExpr("sum(value.quantity)").collect()
        for _ in range(args.runs):
            figures["raw"].append(
                _rate(len(events), lambda: raw.selectExpr("sum(length(value))").collect())
            )
            figures["avro"].append(
                _rate(len(events), lambda: typed.selectExpr("sum(value.quantity)").collect())
            )
    j = peers.machine_jiffies() - j0
    steal = 100 * j.steal / j.total if j.total else 0.0
    med = {k: statistics.median(v) for k, v in figures.items()}
    print(
        f"Spark batch read of {args.records:,} Avro records (10 fields), median of "
        f"{args.runs}: raw bytes {med['raw']:,.0f} rows/s, decoded (valueFormat=avro) "
        f"{med['avro']:,.0f} rows/s ({med['avro'] / med['raw']:.2f}x)"
    )
    print(f"CPU steal {steal:.1f}%, load average {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**med, "steal_pct": steal}, indent=2))


if __name__ == "__main__":
    main()
