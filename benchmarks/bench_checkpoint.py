"""What a store checkpoint costs when traffic is spread over many queues (issue #4, P6).

Usage: ``python benchmarks/bench_checkpoint.py [--queues 100,1000,4000] [--runs 5]
[--dir PATH]``

One `MessageStore` (sync flush) on a temporary directory of the file system under test
(`--dir`, default: the current directory). For each count K of `--queues`: append one
batch of 256 x 100 B to each of K queues, then time `checkpoint()`, which writes the K
index files' new entries and makes them durable. Two ways to make them durable, run
alternately in the same process:

* ``fdatasync``: one fdatasync per index file (what every checkpoint did before);
* ``sync_files``: `OsFileSystem.sync_files`, one syncfs(2) per file system from
  `SYNCFS_MIN_FILES` files on.

A checkpoint runs on the broker's event loop, so its time is time no request is served.
Prints the median and the spread of `--runs` runs for each, and the ratio.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tidemq.core.batch import encode_values
from tidemq.store import files
from tidemq.store.config import FlushMode, StoreConfig
from tidemq.store.message_store import MessageStore

QUEUES_PER_TOPIC = 1000
MESSAGE = b"m" * 100
BATCH = 256


def _checkpoint_ms(store: MessageStore, topics: list[str], queues: int) -> float:
    payload = encode_values([MESSAGE] * BATCH, timestamp_ms=int(time.time() * 1000))
    for q in range(queues):
        store.append(topics[q // QUEUES_PER_TOPIC], q % QUEUES_PER_TOPIC, payload)
    store.flush()  # the log's own sync is not what is measured
    t0 = time.perf_counter()
    store.checkpoint()
    return (time.perf_counter() - t0) * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queues", default="100,1000,4000", help="queue counts K")
    parser.add_argument("--runs", type=int, default=5, help="checkpoints per way and K")
    parser.add_argument("--dir", type=Path, default=Path.cwd(), help="file system under test")
    args = parser.parse_args(argv)
    counts = [int(k) for k in args.queues.split(",")]
    syncfs = files._syncfs  # the benchmark switches between the two ways
    if syncfs is None:
        print("no syncfs(2) here: both ways are one fdatasync per file", file=sys.stderr)
    print(
        f"checkpoint after one batch of {BATCH} x {len(MESSAGE)} B on each of K queues; "
        f"{args.runs} runs per way; file system of {args.dir}; "
        f"SYNCFS_MIN_FILES={files.SYNCFS_MIN_FILES}"
    )
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-checkpoint-") as tmp:
        config = StoreConfig(
            data_dir=Path(tmp) / "data",
            flush_mode=FlushMode.SYNC,
            checkpoint_interval_ms=3_600_000,  # only the checkpoints timed here
            retention_ms=-1,
            disk_reject_ratio=1.0,
        )
        store = MessageStore.open(config)
        try:
            topics = [f"t{i}" for i in range(-(-max(counts) // QUEUES_PER_TOPIC))]
            for name in topics:
                store.create_topic(name, QUEUES_PER_TOPIC)
            store.checkpoint()
            for k in counts:
                times: dict[str, list[float]] = {"fdatasync": [], "sync_files": []}
                for _ in range(args.runs):
                    for way, took in times.items():
                        files._syncfs = None if way == "fdatasync" else syncfs
                        os.sync()  # no writeback left over from the last run
                        took.append(_checkpoint_ms(store, topics, k))
                files._syncfs = syncfs
                old, new = (statistics.median(times[w]) for w in ("fdatasync", "sync_files"))
                spread = {w: f"{min(t):.1f}-{max(t):.1f}" for w, t in times.items()}
                print(
                    f"K={k:>6}: fdatasync per file {old:8.1f} ms ({spread['fdatasync']}), "
                    f"sync_files {new:7.1f} ms ({spread['sync_files']}); "
                    f"{old / max(new, 1e-9):.1f}x faster"
                )
        finally:
            store.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
