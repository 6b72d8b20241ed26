"""Storage engine throughput: appends against the disk's own ceiling, and reads.

Usage: ``python benchmarks/bench_store.py [--quick] [--runs N] [--dir PATH]
[--cells 100x256:sync,...] [--no-reads] [--json PATH]``

One process, one `MessageStore` on a temporary directory of the file system under test
(`--dir`, default: the current directory; never /dev/shm: the point is the real disk).

Appends, for 100 B and 1 KiB messages in batches of 1, 16 and 256, pre-encoded (encoding
is the client's cost: one line measures it separately), in three flush modes:

* ``sync``: `flush()` (fdatasync) after every batch, as one producer waiting for each ack;
* ``group``: sync mode, one `flush()` per 16 batches, as the broker does when concurrent
  producers' batches share one fdatasync (group commit);
* ``async``: no flush on the write path; `tick()` flushes every `flush_interval_ms`.

Each is set against its ceiling measured in the same run: the same bytes per batch (record
header + payload) written with plain `os.write` to a plain file, with `os.fdatasync` after
every batch (``sync``), every 16 batches (``group``) or every `flush_interval_ms`
(``async``, as the store's `tick()` does). Every run starts after `os.sync()`, so no
writeback left by the run before slows it.

Reads: a queue of >= 1,000,000 100 B messages in batches of 256, read from the start with
`read(max_bytes=1 MiB)`, counting messages from the batches' `count` fields; then again
decoding every batch with `decode_columns` (CRC checked).

Every figure is the median of `--runs` runs (default 3); each run stops at a message count,
a byte count and a time limit (0.5 s), so a cell, store and ceiling, takes about 3 s.
Results are printed and written to benchmarks/results/store.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tidemq.core.batch import decode_columns, encode_values
from tidemq.core.record import HEADER, parse_header
from tidemq.store.config import FlushMode, StoreConfig
from tidemq.store.message_store import MessageStore

RESULTS = Path(__file__).resolve().parent / "results" / "store.json"
MESSAGE_SIZES = (100, 1024)
BATCH_SIZES = (1, 16, 256)
MODES = ("sync", "group", "async")
GROUP_BATCHES = 16  # batches per fdatasync in the group-commit mode
POOL_BATCHES = 64  # distinct pre-encoded batches cycled through per cell
TICK_EVERY = 16  # batches between tick() calls (the owner's timer, approximated)
READ_MESSAGES = 1_000_000
READ_BATCH = 256
READ_MAX_BYTES = 1 << 20
TOPIC = "bench"

#: Targets from the issue.
TARGET_SYNC_MSGS = 2_000_000  # 100 B x 256, sync flush, msg/s appended
TARGET_SYNC_RATIO = 0.60  # ... and at least this fraction of the ceiling
TARGET_READ_MSGS = 3_000_000  # msg/s read (counting)


@dataclass(frozen=True, slots=True)
class Limits:
    seconds: float  # per run
    max_messages: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class Cell:
    message_bytes: int
    batch: int
    mode: str  # sync | group | async
    store_msgs: float
    store_mbs: float
    ceiling_msgs: float
    ceiling_mbs: float
    #: Median over runs of store / ceiling of the same run (adjacent in time, so a
    #: noisy disk moves both): steadier than the ratio of the two medians.
    ratio: float
    record_bytes: int
    store_runs: list[float]
    ceiling_runs: list[float]


# --------------------------------------------------------------------------- environment


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def filesystem_of(path: Path) -> str:
    """Type and device of the mount holding `path` (from /proc/self/mounts)."""
    real = str(path.resolve())
    best = ("", "unknown", "unknown")
    try:
        mounts = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return "unknown"
    for line in mounts:
        dev, mnt, fstype, *_ = line.split()
        mnt = mnt.replace("\\040", " ")
        inside = real == mnt or real.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= len(best[0]):
            best = (mnt, fstype, dev)
    return f"{best[1]} ({best[2]} on {best[0]})"


def environment(root: Path, config: StoreConfig) -> dict[str, Any]:
    return {
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "kernel": platform.release(),
        "filesystem": filesystem_of(root),
        "directory": str(root),
        "segment_size_bytes": config.segment_size_bytes,
        "index_entries_per_file": config.index_entries_per_file,
        "flush_interval_ms": config.flush_interval_ms,
        "checkpoint_interval_ms": config.checkpoint_interval_ms,
        "loadavg_at_start": " ".join(f"{x:.2f}" for x in os.getloadavg()),
    }


# --------------------------------------------------------------------------- payloads


def make_pool(message_bytes: int, batch: int, seed: int) -> list[bytes]:
    """Pre-encoded batches of distinct random values (incompressible, like real data)."""
    rng = random.Random(seed)
    now = time.time_ns() // 1_000_000
    return [
        encode_values([rng.randbytes(message_bytes) for _ in range(batch)], timestamp_ms=now)
        for _ in range(POOL_BATCHES)
    ]


def encode_rate(message_bytes: int, batch: int, seconds: float) -> float:
    """Messages per second through `encode_values` (the producer's cost, not the store's)."""
    rng = random.Random(1)
    values = [rng.randbytes(message_bytes) for _ in range(batch)]
    now = time.time_ns() // 1_000_000
    n = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while True:
        encode_values(values, timestamp_ms=now)
        n += 1
        if n % 16 == 0 and time.perf_counter() >= deadline:
            break
    return n * batch / (time.perf_counter() - t0)


# --------------------------------------------------------------------------- appends


def _flush_every(mode: str) -> int:
    return {"sync": 1, "group": GROUP_BATCHES, "async": 0}[mode]


def store_run(
    root: Path, mode: str, pool: list[bytes], batch: int, limits: Limits
) -> tuple[float, int]:
    """(seconds, batches) appending pool batches to a fresh store until a limit."""
    data = Path(tempfile.mkdtemp(prefix="store-", dir=root))
    flush_mode = FlushMode.ASYNC if mode == "async" else FlushMode.SYNC
    store = MessageStore.open(StoreConfig(data_dir=data, flush_mode=flush_mode))
    try:
        store.create_topic(TOPIC, 1)
        record = HEADER.size + len(pool[0])
        n_max = max(1, min(limits.max_messages // batch, limits.max_bytes // record))
        every = _flush_every(mode)
        append, flush, tick = store.append, store.flush, store.tick
        mask = len(pool) - 1
        n = 0
        os.sync()  # no writeback left by the run before to slow this one
        t0 = time.perf_counter()
        deadline = t0 + limits.seconds
        while n < n_max:
            append(TOPIC, 0, pool[n & mask])
            n += 1
            if every and n % every == 0:
                flush()
            if n % TICK_EVERY == 0:
                tick()
                if time.perf_counter() >= deadline:
                    break
        if every:
            flush()  # the last group is acknowledged too
        elapsed = time.perf_counter() - t0
    finally:
        store.close()
        shutil.rmtree(data)
    return elapsed, n


def ceiling_run(
    root: Path, mode: str, pool: list[bytes], batch: int, limits: Limits
) -> tuple[float, int]:
    """The same bytes per batch with os.write to a plain file, and os.fdatasync as the
    mode does it: per batch, per GROUP_BATCHES batches, or (async) every flush interval."""
    rng = random.Random(2)
    buffers = [rng.randbytes(HEADER.size) + p for p in pool]
    n_max = max(1, min(limits.max_messages // batch, limits.max_bytes // len(buffers[0])))
    every = _flush_every(mode)
    fd, name = tempfile.mkstemp(prefix="ceiling-", dir=root)
    try:
        write, fdatasync = os.write, os.fdatasync
        mask = len(buffers) - 1
        n = 0
        os.sync()
        t0 = time.perf_counter()
        deadline = t0 + limits.seconds
        interval = StoreConfig(data_dir=root).flush_interval_ms / 1000
        next_sync = t0 + interval
        while n < n_max:
            buf = buffers[n & mask]
            if write(fd, buf) != len(buf):
                raise OSError("short write")
            n += 1
            if every and n % every == 0:
                fdatasync(fd)
            if n % TICK_EVERY == 0:
                now = time.perf_counter()
                if not every and now >= next_sync:  # async: the store's tick() flush
                    fdatasync(fd)
                    next_sync = now + interval
                if now >= deadline:
                    break
        if every:
            fdatasync(fd)
        elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
        os.unlink(name)
    return elapsed, n


def measure_cell(
    root: Path, *, message_bytes: int, batch: int, mode: str, runs: int, limits: Limits
) -> Cell:
    pool = make_pool(message_bytes, batch, seed=message_bytes * 1000 + batch)
    store_rates: list[float] = []
    ceiling_rates: list[float] = []
    for _ in range(runs):  # interleaved, so drift hits both alike
        seconds, n = store_run(root, mode, pool, batch, limits)
        store_rates.append(n * batch / seconds)
        seconds, n = ceiling_run(root, mode, pool, batch, limits)
        ceiling_rates.append(n * batch / seconds)
    store = statistics.median(store_rates)
    ceiling = statistics.median(ceiling_rates)
    ratio = statistics.median(s / c for s, c in zip(store_rates, ceiling_rates, strict=True))
    return Cell(
        message_bytes=message_bytes,
        batch=batch,
        mode=mode,
        store_msgs=store,
        store_mbs=store * message_bytes / 1e6,
        ceiling_msgs=ceiling,
        ceiling_mbs=ceiling * message_bytes / 1e6,
        ratio=ratio,
        record_bytes=HEADER.size + len(pool[0]),
        store_runs=store_rates,
        ceiling_runs=ceiling_rates,
    )


# --------------------------------------------------------------------------- reads


def fill_read_queue(data: Path) -> int:
    """A store with one queue of >= READ_MESSAGES 100 B messages; returns the count."""
    pool = make_pool(100, READ_BATCH, seed=7)
    store = MessageStore.open(StoreConfig(data_dir=data, flush_mode=FlushMode.ASYNC))
    try:
        store.create_topic(TOPIC, 1)
        n = 0
        while n * READ_BATCH < READ_MESSAGES:
            store.append(TOPIC, 0, pool[n % len(pool)])
            n += 1
        store.flush()
    finally:
        store.close()
    return n * READ_BATCH


def read_count(store: MessageStore) -> int:
    offset = 0
    messages = 0
    while True:
        res = store.read(TOPIC, 0, offset, max_bytes=READ_MAX_BYTES)
        if not res.batches:
            return messages
        for b in res.batches:
            messages += b.count
        offset = res.next_offset


def read_decode(store: MessageStore) -> int:
    offset = 0
    messages = 0
    while True:
        res = store.read(TOPIC, 0, offset, max_bytes=READ_MAX_BYTES)
        if not res.batches:
            return messages
        for b in res.batches:
            record = memoryview(b.record)
            cols = decode_columns(record[parse_header(record).payload_start :])
            messages += cols.count
        offset = res.next_offset


def measure_reads(root: Path, runs: int) -> dict[str, Any]:
    data = Path(tempfile.mkdtemp(prefix="read-", dir=root))
    try:
        total = fill_read_queue(data)
        store = MessageStore.open(StoreConfig(data_dir=data))
        try:
            out: dict[str, Any] = {"messages": total, "message_bytes": 100, "batch": READ_BATCH}
            readers: dict[str, Callable[[MessageStore], int]] = {
                "count": read_count,
                "decode_columns": read_decode,
            }
            for name, reader in readers.items():
                rates = []
                for _ in range(runs):
                    t0 = time.perf_counter()
                    got = reader(store)
                    elapsed = time.perf_counter() - t0
                    if got != total:
                        raise AssertionError(f"read {got} messages of {total}")
                    rates.append(got / elapsed)
                out[name] = statistics.median(rates)
        finally:
            store.close()
    finally:
        shutil.rmtree(data)
    return out


# --------------------------------------------------------------------------- report


def _rate(x: float) -> str:
    return f"{x / 1e6:.2f}M" if x >= 1e6 else f"{x / 1e3:.1f}k"


def print_table(cells: list[Cell]) -> None:
    head = (
        f"{'msg':>6} {'batch':>5} {'mode':>6} | {'store msg/s':>11} {'MB/s':>8} | "
        f"{'ceiling msg/s':>13} {'MB/s':>8} | {'ratio':>6}"
    )
    print(head)
    print("-" * len(head))
    for c in cells:
        size = "1 KiB" if c.message_bytes == 1024 else f"{c.message_bytes} B"
        print(
            f"{size:>6} {c.batch:>5} {c.mode:>6} | {_rate(c.store_msgs):>11} "
            f"{c.store_mbs:>8.1f} | {_rate(c.ceiling_msgs):>13} {c.ceiling_mbs:>8.1f} | "
            f"{c.ratio:>6.0%}"
        )


def _parse_cells(spec: str | None) -> list[tuple[int, int, str]]:
    """All cells, or those named like ``100x256:sync,1024x16:group``."""
    every = [(m, b, mode) for m in MESSAGE_SIZES for b in BATCH_SIZES for mode in MODES]
    if not spec:
        return every
    chosen = []
    for item in spec.split(","):
        sizes, _, mode = item.strip().partition(":")
        size, _, batch = sizes.partition("x")
        cell = (int(size), int(batch), mode)
        if cell not in every:
            raise SystemExit(f"unknown cell {item!r}: use e.g. 100x256:sync (modes {MODES})")
        chosen.append(cell)
    return chosen


def _targets(cells: list[Cell], reads: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The issue's targets, for whatever this run measured."""
    out: dict[str, dict[str, Any]] = {}
    for c in cells:
        if (c.message_bytes, c.batch, c.mode) == (100, 256, "sync"):
            out["sync_100B_x256_msgs"] = {
                "target": TARGET_SYNC_MSGS, "got": c.store_msgs,
                "met": c.store_msgs >= TARGET_SYNC_MSGS,
            }  # fmt: skip
            out["sync_100B_x256_ratio"] = {
                "target": TARGET_SYNC_RATIO, "got": c.ratio, "met": c.ratio >= TARGET_SYNC_RATIO,
            }  # fmt: skip
    if reads is not None:
        out["read_count_msgs"] = {
            "target": TARGET_READ_MSGS, "got": reads["count"],
            "met": reads["count"] >= TARGET_READ_MSGS,
        }  # fmt: skip
    return out


def _print_targets(targets: dict[str, dict[str, Any]]) -> None:
    print("targets:")
    for name, t in targets.items():
        ratio = "ratio" in name
        got = f"{t['got']:.0%}" if ratio else f"{_rate(t['got'])} msg/s"
        want = f"{t['target']:.0%}" if ratio else f"{_rate(t['target'])} msg/s"
        print(f"  {name:<22} {got:>12} (target {want}): {'met' if t['met'] else 'NOT MET'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="one short run per cell")
    parser.add_argument("--runs", type=int, default=None, help="runs per cell (default 3)")
    parser.add_argument(
        "--dir", type=Path, default=Path.cwd(), help="where to put the temporary store"
    )
    parser.add_argument("--json", type=Path, default=RESULTS, help="where to write results")
    parser.add_argument(
        "--cells", default=None, help="only these append cells, e.g. 100x256:sync,100x256:group"
    )
    parser.add_argument("--no-reads", action="store_true", help="skip the read benchmark")
    args = parser.parse_args(argv)
    runs = args.runs or (1 if args.quick else 3)
    chosen = _parse_cells(args.cells)
    limits = (
        Limits(seconds=0.25, max_messages=2_000_000, max_bytes=64 << 20)
        if args.quick
        else Limits(seconds=0.5, max_messages=8_000_000, max_bytes=512 << 20)
    )
    root = Path(tempfile.mkdtemp(prefix=".bench-store-", dir=args.dir))
    try:
        env = environment(root, StoreConfig(data_dir=root))
        env.update(runs=runs, quick=args.quick, seconds_per_run=limits.seconds)
        print("tidemq store benchmark")
        for name, value in env.items():
            print(f"  {name:<24} {value}")
        print()
        enc_seconds = 0.2 if args.quick else 0.5
        encode = {
            f"{size}x{batch}": encode_rate(size, batch, enc_seconds)
            for size in MESSAGE_SIZES
            for batch in (16, 256)
        }
        print(
            "client encode_values (not in the figures below): "
            + ", ".join(f"{k.replace('x', ' B x ')} {_rate(v)} msg/s" for k, v in encode.items())
        )
        print()
        cells = []
        for size, batch, mode in chosen:
            cells.append(
                measure_cell(
                    root, message_bytes=size, batch=batch, mode=mode, runs=runs, limits=limits
                )
            )
            if sys.stderr.isatty():
                print(f"\r  measured {len(cells)}/{len(chosen)} cells", end="", file=sys.stderr)
        if sys.stderr.isatty():
            print("\r" + " " * 30 + "\r", end="", file=sys.stderr)
        print(f"appends (median of {runs} runs; ratio: median of store / ceiling per run)")
        print_table(cells)
        print()
        reads = None if args.no_reads else measure_reads(root, runs)
        if reads is not None:
            print(
                f"reads, {reads['messages']:,} x 100 B in batches of {READ_BATCH}, "
                f"read(max_bytes=1 MiB):"
            )
            print(f"  count only           {_rate(reads['count'])} msg/s")
            print(f"  decode_columns       {_rate(reads['decode_columns'])} msg/s")
            print()
        targets = _targets(cells, reads)
        _print_targets(targets)
        env["loadavg_at_end"] = " ".join(f"{x:.2f}" for x in os.getloadavg())
        args.json.parent.mkdir(parents=True, exist_ok=True)
        result = {
            "environment": env,
            "encode_msgs_per_s": encode,
            "appends": [asdict(c) for c in cells],
            "reads": reads,
            "targets": targets,
        }
        args.json.write_text(json.dumps(result, indent=2) + "\n")
        print(f"\nload average at the end: {env['loadavg_at_end']}; wrote {args.json}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
