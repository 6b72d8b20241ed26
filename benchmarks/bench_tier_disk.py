"""Tiered storage (issue 20): the local disk a topic uses under steady load once its data
is offloaded and local retention (`local.retention.ms`) drops the local copies.

Usage: ``python benchmarks/bench_tier_disk.py [--retention-s S] [--minutes M]
[--mib-s R] [--segment-mib G] [--json PATH]``

One `tidemq server` (sync flush) with a directory tier and the default tier settings
(a pass every 5 s, files closed at 64 MiB or 10 minutes); one topic of 2 queues with
`remote.storage.enable=true` and `local.retention.ms` = S seconds; a producer sending 1 KiB
random values at a steady R MiB/s (batches of 100 every 100 KiB of budget) for M
minutes. Every 5 s the bytes under the broker's data directory and the tier directory are
sampled. Printed: the top of the local disk's use once retention applies (the largest
sample of the last third of the run, after the first S + 2 minutes: retention deletes
whole segments, so the use is a sawtooth), what retention alone keeps (R x S), the commit
log's segment size and the largest offload lag (data on disk not in the tier yet). M must
exceed S plus the time to fill a segment for retention to delete anything.

`make bench` runs a short form (S = 60, M = 6, 64 MiB segments); the 1 h figure in
docs/design/performance.md came from ``--retention-s 3600 --minutes 80 --mib-s 1`` with
the default 1 GiB segments.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers
import tidemq

TOPIC = "bench-tier-disk"
QUEUES = 2
VALUE = 1024
BATCH = 100
MIB = 1024 * 1024
SAMPLE_S = 5.0
_NOISE = random.Random(7).randbytes(16 * MIB)


def _bytes_under(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.stat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:
                continue  # deleted while walking (retention)
    return total


def _produce(address: str, mib_s: float, seconds: float, stop: threading.Event) -> int:
    """Sends at a steady rate until `seconds` pass; returns the messages sent."""
    slots = len(_NOISE) // VALUE
    per_s = mib_s * MIB / VALUE
    started = time.monotonic()
    sent = 0
    with tidemq.Producer(address) as producer:
        while not stop.is_set():
            elapsed = time.monotonic() - started
            if elapsed >= seconds:
                break
            due = int(elapsed * per_s)
            if sent >= due:
                time.sleep(min(0.05, (sent - due + BATCH) / per_s))
                continue
            values = [
                _NOISE[(i % slots) * VALUE : (i % slots + 1) * VALUE]
                for i in range(sent, sent + BATCH)
            ]
            producer.send_batch(TOPIC, values, queue=(sent // BATCH) % QUEUES)
            sent += BATCH
    return sent


def run(retention_s: int, minutes: float, mib_s: float, segment_mib: int | None) -> dict[str, Any]:
    tier = Path(tempfile.mkdtemp(prefix="bench-tier-disk-"))
    extra = ["--set", f"tiered.url=file://{tier}"]
    if segment_mib is not None:
        extra += ["--set", f"store.segment_size_bytes={segment_mib * MIB}"]
    samples: list[tuple[float, int, int, int]] = []
    try:
        with peers.start_tidemq("sync", extra=extra) as server:
            with tidemq.Admin(server.address) as admin:
                admin.create_topic(
                    TOPIC,
                    QUEUES,
                    config={
                        "remote.storage.enable": "true",
                        "local.retention.ms": str(retention_s * 1000),
                    },
                )
            stop = threading.Event()
            result: list[int] = []
            seconds = minutes * 60
            producer = threading.Thread(
                target=lambda: result.append(_produce(server.address, mib_s, seconds, stop)),
                daemon=True,
            )
            started = time.monotonic()
            producer.start()
            data = server.directory / "data"
            try:
                with tidemq.Admin(server.address) as admin:
                    while producer.is_alive():
                        pending = sum(
                            q.pending_bytes for s in admin.tier_status(TOPIC) for q in s.queues
                        )
                        at = time.monotonic() - started
                        samples.append((at, _bytes_under(data), _bytes_under(tier), pending))
                        producer.join(SAMPLE_S)
            finally:
                stop.set()
                producer.join(60)
            sent = result[0] if result else 0
    finally:
        shutil.rmtree(tier, ignore_errors=True)
    elapsed = samples[-1][0] if samples else 0.0
    settled = [s for s in samples if s[0] >= max(retention_s + 120, elapsed * 2 / 3)]
    plateau = max((s[1] for s in settled), default=0)
    produced_rate = sent * VALUE / max(elapsed, 1e-9)
    return {
        "retention_s": retention_s,
        "minutes": minutes,
        "mib_s": produced_rate / MIB,
        "sent_mib": sent * VALUE / MIB,
        "plateau_mib": plateau / MIB,
        "retention_alone_mib": produced_rate * retention_s / MIB,
        "segment_mib": segment_mib if segment_mib is not None else 1024,
        # Records on disk not in the tier yet (`tier status` pending bytes).
        "max_offload_lag_mib": max((s[3] for s in samples), default=0) / MIB,
        "tier_mib": samples[-1][2] / MIB if samples else 0.0,
        "samples": [(round(t, 1), d, r, p) for t, d, r, p in samples],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--retention-s", type=int, default=60)
    parser.add_argument("--minutes", type=float, default=6.0)
    parser.add_argument("--mib-s", type=float, default=2.0)
    parser.add_argument("--segment-mib", type=int, default=64, help="0: the default 1 GiB")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    j0 = peers.machine_jiffies()
    r = run(args.retention_s, args.minutes, args.mib_s, args.segment_mib or None)
    j = peers.machine_jiffies() - j0
    steal = 100 * j.steal / j.total if j.total else 0.0
    print(
        f"local.retention.ms={args.retention_s * 1000} at {r['mib_s']:.2f} MiB/s for "
        f"{args.minutes:g} min ({r['sent_mib']:.0f} MiB sent, {r['tier_mib']:.0f} MiB in the "
        f"tier): local disk plateau {r['plateau_mib']:.0f} MiB; retention alone keeps "
        f"{r['retention_alone_mib']:.0f} MiB, plus up to one {r['segment_mib']} MiB segment "
        f"and the offload lag (largest {r['max_offload_lag_mib']:.0f} MiB); CPU steal "
        f"{steal:.1f}%, load average {os.getloadavg()[0]:.2f}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({**r, "steal_pct": steal}, indent=2))


if __name__ == "__main__":
    main()
