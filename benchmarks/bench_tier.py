"""Tiered storage (issue 20): offload throughput, and reads from the tier against reads
from local disk, with a local-directory store and with an S3 API (moto's server, its own
process), in one run.

Usage: ``python benchmarks/bench_tier.py [--mib M] [--runs R] [--json PATH]``

Per run and store: a fresh `tidemq server` (sync flush) with `tiered.url` set; a topic of
2 queues with `remote.storage.enable=true` and `local.retention.ms=0`; `--mib` (64) MiB
of 1 KiB messages (random bytes: incompressible) in batches of 500, no background
offload pass; then

1. a full read of the topic from local disk (StreamConsumer, MB/s);
2. `Admin.tier_offload` of the topic: MB/s of records uploaded (encode to Parquet with
   zstd, PUT, verify, manifest);
3. the same full read, now served from the tier (local copies dropped), cold cache: MB/s
   and its ratio to the local read;
4. kill -9 of the server, and a new one on an empty data directory with the same tier:
   seconds from its start until it serves the first offloaded message (it restores its
   topics and manifests from the bucket; the process start is included).

Medians of `--runs` (3). CPU steal and load average over the run are printed with the
figures. Local disk under steady load with local retention: `bench_tier_disk.py`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers
import tidemq

TOPIC = "bench-tier"
QUEUES = 2
VALUE = 1024
BATCH = 500
MIB = 1024 * 1024


#: Random bytes the values are cut from: incompressible, like most real payloads (zeros
#: would make Parquet and zstd look far faster than they are).
_NOISE = random.Random(5).randbytes(64 * MIB)


def _produce(address: str, mib: int) -> int:
    count = mib * MIB // VALUE
    slots = len(_NOISE) // VALUE
    with tidemq.Producer(address) as producer:
        for start in range(0, count, BATCH):
            n = min(BATCH, count - start)
            values = [
                _NOISE[(i % slots) * VALUE : (i % slots + 1) * VALUE]
                for i in range(start, start + n)
            ]
            producer.send_batch(TOPIC, values, queue=(start // BATCH) % QUEUES)
    return count


def _read_all(address: str, count: int) -> float:
    """Seconds to read every message of the topic from offset 0."""
    started = time.perf_counter()
    seen = 0
    with tidemq.StreamConsumer(address) as consumer:
        consumer.assign([(TOPIC, q) for q in range(QUEUES)])
        for q in range(QUEUES):
            consumer.seek(TOPIC, q, 0)
        while seen < count:
            batch = consumer.poll(5000)
            if not batch:
                raise RuntimeError(f"read stalled at {seen} of {count}")
            seen += len(batch)
    return time.perf_counter() - started


def _serving_again(address: str, started: float) -> float:
    """Seconds from the start of a broker on an empty disk until it serves the first
    offloaded message again (it restores its topics from the bucket)."""
    deadline = started + 120
    with tidemq.StreamConsumer(address) as consumer:
        while time.perf_counter() < deadline:
            try:
                consumer.assign([(TOPIC, 0)])
                consumer.seek(TOPIC, 0, 0)
                if consumer.poll(1000):
                    return time.perf_counter() - started
            except tidemq.TopicNotFound:
                time.sleep(0.05)  # not restored yet
    raise RuntimeError("the restored broker did not serve the topic in 120 s")


def _start_moto() -> tuple[subprocess.Popen[bytes], str]:
    port = peers.free_port()
    exe = Path(sys.executable).parent / "moto_server"
    proc = subprocess.Popen(
        [str(exe), "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            request = urllib.request.Request(f"{endpoint}/tier", method="PUT")
            with urllib.request.urlopen(request, timeout=5):
                return proc, endpoint
        except OSError:
            if time.monotonic() > deadline or proc.poll() is not None:
                proc.kill()
                raise RuntimeError("moto_server did not start") from None
            time.sleep(0.1)


def one_run(kind: str, mib: int) -> dict[str, float]:
    moto = None
    tier = Path(tempfile.mkdtemp(prefix="bench-tier-"))
    # No background pass: what is measured is the offload `tier_offload` runs, and the
    # local read must find every message still local.
    quiet = ["--set", "tiered.check_interval_ms=3600000"]
    extra = ["--set", f"tiered.url=file://{tier}"]
    if kind == "s3":
        moto, endpoint = _start_moto()
        settings = {
            "url": "s3://tier/bench",
            "endpoint": endpoint,
            "access_key_id": "bench",
            "secret_access_key": "bench",
        }
        extra = [a for k, v in settings.items() for a in ("--set", f"tiered.{k}={v}")]
    try:
        with peers.start_tidemq("sync", extra=[*extra, *quiet]) as server:
            with tidemq.Admin(server.address) as admin:
                admin.create_topic(
                    TOPIC,
                    QUEUES,
                    config={"remote.storage.enable": "true", "local.retention.ms": "0"},
                )
            count = _produce(server.address, mib)
            local_s = _read_all(server.address, count)
            started = time.perf_counter()
            with tidemq.Admin(server.address) as admin:
                statuses = admin.tier_offload(TOPIC)
            offload_s = time.perf_counter() - started
            queues = [q for s in statuses for q in s.queues]
            assert all(q.local_min == q.next_offset for q in queues), queues
            remote_s = _read_all(server.address, count)
            assert server.proc is not None
            server.proc.kill()  # kill -9: its disk is lost with it
            server.proc.wait(30)
        started = time.perf_counter()
        with peers.start_tidemq("sync", extra=extra) as fresh:
            restore_s = _serving_again(fresh.address, started)
    finally:
        shutil.rmtree(tier, ignore_errors=True)
        if moto is not None:
            moto.kill()
            moto.wait(10)
    size = count * VALUE / MIB
    return {
        "local_read_mib_s": size / local_s,
        "offload_mib_s": size / offload_s,
        "remote_read_mib_s": size / remote_s,
        "restore_s": restore_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    j0 = peers.machine_jiffies()
    results: dict[str, Any] = {"mib": args.mib}
    for kind in ("dir", "s3"):
        runs = [one_run(kind, args.mib) for _ in range(args.runs)]
        med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
        med["remote_vs_local"] = med["remote_read_mib_s"] / med["local_read_mib_s"]
        results[kind] = med
        print(
            f"{kind:>3}: offload {med['offload_mib_s']:.1f} MiB/s; full read local "
            f"{med['local_read_mib_s']:.1f} MiB/s, from the tier {med['remote_read_mib_s']:.1f} "
            f"MiB/s ({med['remote_vs_local']:.2f}x); an empty broker serves again after "
            f"{med['restore_s']:.2f} s (process start included); {args.mib} MiB, median of "
            f"{args.runs}"
        )
    j = peers.machine_jiffies() - j0
    steal = 100 * j.steal / j.total if j.total else 0.0
    print(f"CPU steal {steal:.1f}%, load average {os.getloadavg()[0]:.2f}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**results, "steal_pct": steal}, indent=2))


if __name__ == "__main__":
    main()
