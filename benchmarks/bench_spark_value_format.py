"""Typed values in Spark (issue 19): a batch read of an Avro, a JSON and a Protobuf topic
decoded into a struct column (`valueFormat=avro|json|protobuf`), each against the same
topic read as raw bytes, in the same run; and each format's batch decoder against its
value-by-value decoder in process.

Usage: ``python benchmarks/bench_spark_value_format.py [--records N] [--runs R]
[--formats avro,json,protobuf] [--json PATH]``

One `tidemq server` with its registry; `--records` (200,000) 10-field `Event` records
(bench_serde's) written typed to one topic a format with tidemq's `AvroSerializer`,
`JsonSerializer` and `ProtobufSerializer`; a local SparkSession (bench_spark's,
`local[2]`). Each run aggregates over every message of every topic twice, taking turns:
raw (the length of each value, so that Spark reads every value) and decoded (a sum over
a decoded field, so that every value is decoded). Rows/s, medians of `--runs` (3), the
ratio decoded/raw of the same topic, with CPU steal and the load average. Then, in this
process, the first 100,000 values of each topic as one Arrow batch: the batch decoder
the source uses against the value-by-value one (`json_rows`, `protobuf_rows`; Avro's
value-by-value path is fastavro's), CPU microseconds a value, medians of `--runs`.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import pyarrow as pa
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import StructType

import peers
import tidemq
import tidemq.spark
from bench_serde import BATCH, Event, records
from bench_spark import _session
from tidemq.spark.json_decode import decode_json_column, json_rows
from tidemq.spark.protobuf_decode import decode_protobuf_column, protobuf_rows
from tidemq.spark.value_format import decode_values, resolve_value_format

_FIELDS = (
    ("user_id", "integer"),
    ("item_id", "integer"),
    ("category_id", "integer"),
    ("behavior", "string"),
    ("ts", "integer"),
    ("price", "number"),
    ("quantity", "integer"),
    ("country", "string"),
    ("device", "string"),
    ("session", "string"),
)
JSON_SCHEMA = {
    "type": "object",
    "properties": {name: {"type": kind} for name, kind in _FIELDS},
    "required": [name for name, _ in _FIELDS],
}
IN_PROCESS = 100_000


def _event_message() -> Any:
    """`bench.Event` (proto3) with bench_serde's fields, built at run time."""
    f = descriptor_pb2.FieldDescriptorProto
    kinds = {"integer": f.TYPE_INT64, "number": f.TYPE_DOUBLE, "string": f.TYPE_STRING}
    proto = descriptor_pb2.FileDescriptorProto(name="bench/event.proto", package="bench")
    proto.syntax = "proto3"
    message = proto.message_type.add(name="Event")
    for number, (name, kind) in enumerate(_FIELDS, start=1):
        message.field.add(name=name, number=number, type=kinds[kind], label=f.LABEL_OPTIONAL)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("bench.Event"))


def _serializer(fmt: str, url: str) -> Any:
    registry = tidemq.SchemaRegistry(url)
    if fmt == "avro":
        return tidemq.AvroSerializer(registry, Event)
    if fmt == "json":
        to_json = tidemq.JsonSerializer(registry, JSON_SCHEMA)
        return lambda topic, e: to_json(topic, dict(vars(e)))
    cls = _event_message()
    to_protobuf = tidemq.ProtobufSerializer(registry, cls)
    return lambda topic, e: to_protobuf(topic, cls(**vars(e)))


def _fill(address: str, url: str, fmt: str, events: list[Event]) -> list[bytes]:
    """The events written to `bench-<fmt>`; the first IN_PROCESS values returned."""
    topic = f"bench-{fmt}"
    to_bytes = _serializer(fmt, url)
    kept: list[bytes] = []
    with tidemq.Admin(address) as admin, tidemq.Producer(address) as producer:
        admin.create_topic(topic, 2)
        for i in range(0, len(events), BATCH):
            values = [to_bytes(topic, e) for e in events[i : i + BATCH]]
            producer.send_batch(topic, values, queue=i // BATCH % 2)
            kept.extend(values[: IN_PROCESS - len(kept)])
        producer.flush()
    return kept


def _seconds(fn: Any, clock: Callable[[], float] = time.perf_counter) -> float:
    t0 = clock()
    fn()
    return clock() - t0


def _in_process(fmt: str, url: str, values: list[bytes], runs: int) -> dict[str, float]:
    """us a value: the batch decoder and the value-by-value one, on one batch."""
    options = {"valueFormat": fmt, "schemaRegistry": url, "subject": f"bench-{fmt}-value"}
    value_format = resolve_value_format(options)
    assert value_format is not None
    arrow_type = to_arrow_type(StructType.fromJson(value_format.spark_json()), timezone="UTC")
    column = pa.array(values, pa.binary())
    offsets = list(range(len(values)))
    batch = pa.RecordBatch.from_arrays([column, pa.array(offsets)], names=["value", "offset"])
    where = ("bench", 0)
    decoders: dict[str, Any] = {
        "avro": lambda: decode_values(batch, value_format, arrow_type, *where),
        "json": lambda: decode_json_column(column, offsets, arrow_type, where),
        "protobuf": lambda: decode_protobuf_column(
            column, offsets, value_format, arrow_type, where
        ),
    }
    rows: dict[str, Any] = {
        "avro": None,
        "json": lambda: json_rows(column.to_pylist(), offsets, arrow_type, where),
        "protobuf": lambda: protobuf_rows(
            column.to_pylist(), offsets, value_format, arrow_type, where
        ),
    }
    found: dict[str, list[float]] = {"batch": [], "rows": []}
    decoders[fmt]()  # warm: the writer's schema fetched once
    for _ in range(runs):
        # CPU time of this process: less disturbed than wall time by other work.
        found["batch"].append(_seconds(decoders[fmt], time.process_time) / len(values) * 1e6)
        if rows[fmt] is not None:
            found["rows"].append(_seconds(rows[fmt], time.process_time) / len(values) * 1e6)
    return {k: statistics.median(v) for k, v in found.items() if v}


def _spark_runs(spark: Any, server: Any, url: str, formats: list[str], runs: int) -> Any:
    def reader(topic: str) -> Any:  # a new reader each time: options accumulate on one
        return (
            spark.read.format("tidemq")
            .option("bootstrap", server.address)
            .option("subscribe", topic)
        )

    frames: dict[str, Any] = {}
    for fmt in formats:
        topic = f"bench-{fmt}"
        frames[f"raw-{fmt}"] = (reader(topic).load(), "sum(length(value))")
        typed = reader(topic).option("valueFormat", fmt).option("schemaRegistry", url)
        frames[fmt] = (typed.load(), "sum(value.quantity)")
    # Warm up every frame (the JVM, Spark's Python workers, the registry lookups) first.
    for df, expr in frames.values():
        df.selectExpr(expr).collect()
    seconds: dict[str, list[float]] = {name: [] for name in frames}
    for _ in range(runs):
        for name, (df, expr) in frames.items():
            seconds[name].append(_seconds(lambda df=df, expr=expr: df.selectExpr(expr).collect()))
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--formats", default="avro,json,protobuf")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    formats = args.formats.split(",")
    events = records(args.records)
    j0 = peers.machine_jiffies()
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(peers.start_tidemq("async", extra=["--http-port", "0"]))
        url = "http://" + server.http_address
        written = {fmt: _fill(server.address, url, fmt, events) for fmt in formats}
        spark = _session()
        stack.callback(spark.stop)
        seconds = _spark_runs(spark, server, url, formats, args.runs)
        in_process = {fmt: _in_process(fmt, url, written[fmt], args.runs) for fmt in formats}
    j = peers.machine_jiffies() - j0
    steal = 100 * j.steal / j.total if j.total else 0.0
    rate = {k: len(events) / statistics.median(v) for k, v in seconds.items()}
    result: dict[str, Any] = {"steal_pct": steal, "load_avg": os.getloadavg()[0]}
    print(f"Spark batch read of {args.records:,} records (10 fields), medians of {args.runs}:")
    for fmt in formats:
        raw, decoded = rate[f"raw-{fmt}"], rate[fmt]
        print(
            f"  {fmt}: raw bytes {raw:,.0f} rows/s, decoded (valueFormat={fmt}) "
            f"{decoded:,.0f} rows/s ({decoded / raw:.2f}x)"
        )
        result[fmt] = {"raw": raw, "decoded": decoded, "ratio": decoded / raw}
    count = min(IN_PROCESS, args.records)
    print(f"In process, {count:,} values in one batch, CPU us a value (medians):")
    for fmt, found in in_process.items():
        rows = found.get("rows")
        versus = f", value by value {rows:.2f} ({rows / found['batch']:.1f}x)" if rows else ""
        print(f"  {fmt}: batch {found['batch']:.2f}{versus}")
        result[fmt]["in_process_us"] = found
    print(f"CPU steal {steal:.1f}%, load average {result['load_avg']:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
