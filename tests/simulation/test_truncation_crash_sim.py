"""Seeded crash simulation of replication's truncation: power loss at every write of
`ReplicaView.truncate`, then recovery.

A store holds records every member has, then a suffix only it wrote (a deposed
leader's), all durable; it is cut back to the common point and the file system loses
power at one of the cut's writes. Reopened, every queue must hold a prefix of what it
held before the cut that includes all it holds after (the log is cut from its newest
segment back, so a crash can leave part of the suffix, which the member cuts again when
it next meets its leader): never an error, never a hole, never an index pointing past
the log. Appends then continue at each queue's next offset.

Metadata (SQLite) lives outside the fake file system and is durable when a transaction
returns. A failure prints its seed and crash point; `pytest --seed N` replays that seed.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tidemq.core.batch import MessageRecord, encode_batch
from tidemq.store.config import StoreConfig
from tidemq.store.message_store import MessageStore, ReadStatus
from tidemq.testing.clock import ManualClock
from tidemq.testing.files import CrashMode, FaultFileSystem, SimulatedCrash

DATA = Path("/sim/data")
T0 = 1_700_000_000_000

Snapshot = dict[tuple[str, int], tuple[int, int, list[tuple[int, bytes]]]]


def _open(fs: FaultFileSystem, meta: Path) -> MessageStore:
    config = StoreConfig(data_dir=DATA, segment_size_bytes=4096, index_entries_per_file=4)
    return MessageStore.open(config, fs=fs, clock=ManualClock(T0), metadata_path=meta)


def _snapshot(store: MessageStore) -> Snapshot:
    store.flush()
    out: Snapshot = {}
    for info in store.topics():
        for q in range(info.queues):
            lo, hi = store.queue_bounds(info.name, q)
            records: list[tuple[int, bytes]] = []
            offset = lo
            while offset < hi:
                got = store.read(info.name, q, offset, max_bytes=1 << 20)
                assert got.status is ReadStatus.FOUND
                records += [(b.base_offset, b.record) for b in got.batches]
                offset = got.next_offset
            out[(info.name, q)] = (lo, hi, records)
    return out


def _workload(fs: FaultFileSystem, meta: Path, seed: int) -> tuple[Snapshot, Snapshot, int]:
    """Build, then cut; returns (before, after, mutations before the cut began)."""
    rng = random.Random(seed)
    store = _open(fs, meta)
    store.create_topic("t", 3)
    common = 0
    for step in range(rng.randint(20, 40)):
        if step == 10:
            common = store.end_position
        n = rng.randint(1, 5)
        batch = encode_batch(
            [MessageRecord(rng.randbytes(rng.randint(1, 300)), timestamp_ms=T0) for _ in range(n)]
        )
        store.append("t", rng.randrange(3), batch)
        if rng.random() < 0.2:
            store.checkpoint()
    store.checkpoint()
    before = _snapshot(store)
    started = fs.mutations
    store.replica.truncate(common)
    after = _snapshot(store)
    store.close()
    return before, after, started


def _check_between(seen: Snapshot, before: Snapshot, after: Snapshot, where: str) -> None:
    assert seen.keys() == before.keys(), where
    for queue, (lo, hi, records) in seen.items():
        _, _, was = before[queue]
        _, _, cut = after[queue]
        assert records == was[: len(records)], (where, queue)
        assert records[: len(cut)] == cut, (where, queue)
        assert hi == (records[-1][0] + _count(records[-1][1]) if records else lo), where


def _count(record: bytes) -> int:
    return int.from_bytes(record[20:24], "little")  # the header's count


def _run(tmp_path: Path, seed: int) -> int:
    dry = FaultFileSystem()
    before, after, started = _workload(dry, tmp_path / f"dry-{seed}.sqlite", seed)
    assert before != after
    checked = 0
    for point in range(started + 1, dry.mutations + 1):
        modes: tuple[CrashMode, ...] = ("torn", "lose")
        for mode in modes:
            where = f"seed={seed} crash_point={point}/{dry.mutations} mode={mode}"
            fs = FaultFileSystem()
            fs.crash_at_write(point)
            meta = tmp_path / f"meta-{seed}-{point}-{mode}.sqlite"
            with pytest.raises(SimulatedCrash):
                _workload(fs, meta, seed)
            survivor = fs.crash(random.Random(seed * 7919 + point), mode)
            try:
                store = _open(survivor, meta)
                seen = _snapshot(store)
                _check_between(seen, before, after, where)
                store.append("t", 0, encode_batch([MessageRecord(b"x", timestamp_ms=T0)]))
                again = _snapshot(store)
                store.close()
                assert _snapshot(_open(survivor, meta)) == again, where
            except BaseException:
                print(f"FAILED at {where}; replay with: pytest --seed {seed}")
                raise
            checked += 1
    return checked


def test_truncation_survives_a_crash_at_every_write(
    tmp_path: Path, replay_seed: int | None, soak: bool
) -> None:
    seeds = [replay_seed] if replay_seed is not None else list(range(1, (40 if soak else 3) + 1))
    checked = sum(_run(tmp_path, seed) for seed in seeds)
    assert checked > 0
