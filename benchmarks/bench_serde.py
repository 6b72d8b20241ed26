"""Typed values (issue 19): Avro serialization of a 10-field record with tidemq's
serializer against confluent-kafka's AvroSerializer on the same records in the same run,
and typed produce and consume through a `tidemq server` against raw bytes.

Usage: ``python benchmarks/bench_serde.py [--records N] [--runs R] [--json PATH]``

1. Serialize and deserialize `--records` (100,000) dataclass records (10 fields) with
   `tidemq.AvroSerializer`/`AvroDeserializer` (to the dataclass) and with Confluent's
   `AvroSerializer`/`AvroDeserializer` (dicts, their API), against the registry of one
   `tidemq server`: records/s, medians of `--runs` (3), taking turns.
2. Produce the same records through that server (batches of 1,000, `send_batch`), typed
   (serialized in the loop) and as pre-encoded bytes, then consume them back typed and
   raw: messages/s.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from confluent_kafka.schema_registry import SchemaRegistryClient
from confluent_kafka.schema_registry.avro import AvroDeserializer as CAvroDeserializer
from confluent_kafka.schema_registry.avro import AvroSerializer as CAvroSerializer
from confluent_kafka.serialization import MessageField, SerializationContext

import peers
import tidemq

BATCH = 1_000


@dataclasses.dataclass
class Event:
    user_id: int
    item_id: int
    category_id: int
    behavior: str
    ts: int
    price: float
    quantity: int
    country: str
    device: str
    session: str


def records(n: int) -> list[Event]:
    return [
        Event(
            i,
            i * 7 % 1000,
            i % 50,
            "pv",
            1_700_000_000_000 + i,
            9.99,
            i % 5,
            "DE",
            "ios",
            f"s{i % 100}",
        )
        for i in range(n)
    ]


def _rate(n: int, fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return n / (time.perf_counter() - t0)


def serde_runs(url: str, events: list[Event], runs: int) -> dict[str, float]:
    registry = tidemq.SchemaRegistry(url)
    ours, back = tidemq.AvroSerializer(registry, Event), tidemq.AvroDeserializer(registry, Event)
    client = SchemaRegistryClient({"url": url})
    theirs = CAvroSerializer(client, json.dumps(ours.schema))
    their_back = CAvroDeserializer(client)
    ctx = SerializationContext("bench-serde", MessageField.VALUE)
    dicts = [dataclasses.asdict(e) for e in events]
    figures: dict[str, list[float]] = {
        k: [] for k in ("ours_ser", "theirs_ser", "ours_de", "theirs_de")
    }
    encoded = [ours("bench-serde", e) for e in events]  # registers the schema, warms up
    for _ in range(runs):
        figures["ours_ser"].append(
            _rate(len(events), lambda: [ours("bench-serde", e) for e in events])
        )
        figures["theirs_ser"].append(_rate(len(dicts), lambda: [theirs(d, ctx) for d in dicts]))
        figures["ours_de"].append(_rate(len(encoded), lambda: [back(b) for b in encoded]))
        figures["theirs_de"].append(
            _rate(len(encoded), lambda: [their_back(b, ctx) for b in encoded])
        )
    client.close()
    return {k: statistics.median(v) for k, v in figures.items()}


def produce_consume(address: str, url: str, events: list[Event]) -> dict[str, float]:
    registry = tidemq.SchemaRegistry(url)
    to_bytes, back = (
        tidemq.AvroSerializer(registry, Event),
        tidemq.AvroDeserializer(registry, Event),
    )
    raw = [to_bytes("typed", e) for e in events]
    out: dict[str, float] = {}
    with tidemq.Admin(address) as admin, tidemq.Producer(address) as producer:
        for topic in ("typed", "raw"):
            admin.create_topic(topic, 1)

        def send(topic: str, values: Any) -> None:
            for i in range(0, len(events), BATCH):
                producer.send_batch(topic, values(i), queue=0)
            producer.flush()

        out["produce_typed"] = _rate(
            len(events),
            lambda: send("typed", lambda i: [to_bytes("typed", e) for e in events[i : i + BATCH]]),
        )
        out["produce_raw"] = _rate(len(events), lambda: send("raw", lambda i: raw[i : i + BATCH]))
    for topic, decode in (("typed", back), ("raw", None)):
        with tidemq.StreamConsumer(address, start="earliest") as consumer:
            consumer.assign([(topic, 0)])
            got = 0
            t0 = time.perf_counter()
            deadline = t0 + 120
            while got < len(events) and time.perf_counter() < deadline:
                for m in consumer.poll(timeout_ms=500):
                    if decode is not None:
                        decode(m.value or b"")
                    got += 1
            out[f"consume_{topic}"] = got / (time.perf_counter() - t0)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    events = records(args.records)
    j0 = peers.machine_jiffies()
    with contextlib.ExitStack() as stack:
        server = stack.enter_context(peers.start_tidemq("async", extra=["--http-port", "0"]))
        url = "http://" + server.http_address
        serde = serde_runs(url, events, args.runs)
        flow = produce_consume(server.address, url, events)
    j = peers.machine_jiffies() - j0
    steal = 100 * j.steal / j.total if j.total else 0.0
    print(f"Avro, 10 fields, {args.records:,} records (median of {args.runs}):")
    print(
        f"  serialize:   tidemq {serde['ours_ser']:,.0f}/s, confluent {serde['theirs_ser']:,.0f}/s "
        f"({serde['ours_ser'] / serde['theirs_ser']:.2f}x)"
    )
    print(
        f"  deserialize: tidemq {serde['ours_de']:,.0f}/s (to the dataclass), confluent "
        f"{serde['theirs_de']:,.0f}/s (dicts) ({serde['ours_de'] / serde['theirs_de']:.2f}x)"
    )
    print(
        f"  produce: typed {flow['produce_typed']:,.0f}/s, raw bytes {flow['produce_raw']:,.0f}/s; "
        f"consume: typed {flow['consume_typed']:,.0f}/s, raw {flow['consume_raw']:,.0f}/s"
    )
    print(f"CPU steal {steal:.1f}%, load average {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**serde, **flow, "steal_pct": steal}, indent=2))


if __name__ == "__main__":
    main()
