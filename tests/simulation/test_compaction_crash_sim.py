"""Seeded crash simulation of compaction: power loss at any write, then recovery, then
the checks of issue 18.

A workload on a compact topic (puts and tombstones over a few keys, flushes, compaction
runs, a clock that makes tombstones expire) runs on the fault-injecting file system and
is stopped at a chosen mutating operation, most of them inside compaction runs. The
surviving state is reopened and checked:

* every message read is the one written at its offset (nothing invented or damaged, and
  nothing is served from a half-written compacted log);
* no key lost its latest acknowledged (flushed) value: the last message read for a key is
  at or past it; a key may be missing only if its latest acknowledged write was a
  tombstone;
* no older value came back: in the compacted range every key appears at most once;
* `lookup_key` agrees with the last message read for every key;
* appends continue at the queue's next offset, and a second recovery changes nothing.

Metadata (SQLite) lives outside the fake file system and is durable when a transaction
returns, as in `test_crash_recovery_sim.py`. A failure prints its seed and crash point;
`pytest --seed N` replays that seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tidemq.core.batch import MessageRecord, encode_batch
from tidemq.core.message import messages_from_records
from tidemq.store.config import StoreConfig
from tidemq.store.message_store import MessageStore
from tidemq.store.metadata import CleanupPolicy
from tidemq.testing.clock import ManualClock
from tidemq.testing.files import CrashMode, FaultFileSystem, SimulatedCrash

DATA = Path("/sim/data")
TOPIC = "state"
KEYS = [b"k%d" % i for i in range(8)]
T0 = 1_700_000_000_000


@dataclass
class _History:
    #: queue -> offset -> (key, value) of every append made (acknowledged or not)
    written: dict[int, dict[int, tuple[bytes, bytes | None]]] = field(default_factory=dict)
    #: queue -> key -> offset of its latest flushed write
    acked: dict[int, dict[bytes, int]] = field(default_factory=dict)
    #: mutation-counter ranges of the compaction runs (dry run only)
    runs: list[tuple[int, int]] = field(default_factory=list)


def _config() -> StoreConfig:
    return StoreConfig(data_dir=DATA, segment_size_bytes=4096, index_entries_per_file=4)


def _open(fs: FaultFileSystem, meta: Path, clock: ManualClock) -> MessageStore:
    return MessageStore.open(_config(), fs=fs, clock=clock, metadata_path=meta)


def _workload(fs: FaultFileSystem, meta: Path, seed: int, history: _History) -> None:
    rng = random.Random(seed)
    clock = ManualClock(T0)
    store = _open(fs, meta, clock)
    store.create_topic(
        TOPIC, 2, cleanup_policy=CleanupPolicy.COMPACT, config={"delete.retention.ms": "50"}
    )
    pending: list[tuple[int, int, list[bytes]]] = []
    for step in range(30):
        queue = rng.randrange(2)
        keys = [rng.choice(KEYS) for _ in range(rng.randint(1, 4))]
        values = [None if rng.random() < 0.2 else rng.randbytes(rng.randint(0, 40)) for _ in keys]
        batch = encode_batch(
            [
                MessageRecord(v, k, None, (), (), clock.now_ms())
                for k, v in zip(keys, values, strict=True)
            ]
        )
        # Recorded before the append: one the crash interrupts may still survive.
        base = store.queue_bounds(TOPIC, queue)[1]
        for i, (k, v) in enumerate(zip(keys, values, strict=True)):
            history.written.setdefault(queue, {})[base + i] = (k, v)
        assert store.append(TOPIC, queue, batch).base_offset == base
        pending.append((queue, base, keys))
        if rng.random() < 0.5:
            store.flush()
            for q, b, ks in pending:
                for i, k in enumerate(ks):
                    history.acked.setdefault(q, {})[k] = b + i
            pending.clear()
        clock.advance(rng.randint(0, 30))
        if step % 5 == 4:
            before = fs.mutations
            store.compact(TOPIC, rng.randrange(2))
            history.runs.append((before + 1, fs.mutations))
    store.close()


def _read(store: MessageStore, queue: int) -> list[tuple[int, bytes | None, bytes | None]]:
    out: list[tuple[int, bytes | None, bytes | None]] = []
    offset = store.queue_bounds(TOPIC, queue)[0]
    for _ in range(1000):
        result = store.read(TOPIC, queue, offset, max_bytes=512)
        if not result.batches and result.next_offset <= offset:
            break
        body = b"".join(b.record for b in result.batches)
        sizes = [len(b.record) for b in result.batches]
        out += [
            (m.offset, m.key, m.value)
            for m in messages_from_records(TOPIC, queue, body, sizes, offset)
        ]
        offset = result.next_offset
    return out


def _check_queue(store: MessageStore, queue: int, history: _History, where: str) -> None:
    got = _read(store, queue)
    written = history.written.get(queue, {})
    offsets = [o for o, _, _ in got]
    assert offsets == sorted(set(offsets)), f"{where}: q{queue} offsets not increasing"
    for offset, key, value in got:
        assert written.get(offset) == (key, value), f"{where}: q{queue}@{offset} not as written"
    last = {key: (offset, value) for offset, key, value in got}
    for key, acked in history.acked.get(queue, {}).items():
        if key in last:
            assert last[key][0] >= acked, f"{where}: q{queue} {key!r} lost its latest value"
        else:
            assert written[acked][1] is None, f"{where}: q{queue} {key!r} is gone"
    compacted = store.compacted.get((store.topic(TOPIC).id, queue))
    if compacted is not None:
        keys = [k for o, k, _ in got if o < compacted.end]
        assert len(keys) == len(set(keys)), f"{where}: q{queue} an older value came back"
    for key in KEYS:
        found = store.lookup_key(TOPIC, queue, key)
        seen = last.get(key)
        assert (None if found is None else (found.offset, found.value)) == seen, (
            f"{where}: q{queue} lookup of {key!r} disagrees with a read"
        )
    nxt = store.queue_bounds(TOPIC, queue)[1]
    assert nxt == (max(offsets) + 1 if offsets else nxt), f"{where}: q{queue} next offset"


def _check(fs: FaultFileSystem, meta: Path, history: _History, where: str) -> None:
    store = _open(fs, meta, ManualClock(T0 + 10_000_000))
    try:
        if not store.topics():
            assert not history.acked, f"{where}: the topic is gone"
            return
        for queue in (0, 1):
            _check_queue(store, queue, history, where)
        nxt = store.queue_bounds(TOPIC, 0)[1]
        batch = encode_batch([MessageRecord(b"after", b"k0")])
        assert store.append(TOPIC, 0, batch).base_offset == nxt, where
        store.compact(TOPIC, 0)  # a run after recovery works
    finally:
        store.close()
    _open(fs, meta, ManualClock(T0 + 10_000_000)).close()


def _run(tmp_path: Path, seed: int, crash_points: int) -> int:
    dry = FaultFileSystem()
    plan = _History()
    _workload(dry, tmp_path / f"dry-{seed}.sqlite", seed, plan)
    rng = random.Random(seed)
    inside = sorted({p for a, b in plan.runs for p in range(a, b + 1)})
    anywhere = range(1, dry.mutations + 1)
    # Every write of every compaction run, and a sample of the others.
    points = sorted(set(inside) | set(rng.sample(anywhere, min(dry.mutations, crash_points))))
    for point in points:
        mode: CrashMode = rng.choice(["prefix", "torn", "lose"])
        where = f"seed={seed} crash_point={point}/{dry.mutations} mode={mode}"
        fs = FaultFileSystem()
        fs.crash_at_write(point)
        meta = tmp_path / f"meta-{seed}-{point}.sqlite"
        history = _History()
        with pytest.raises(SimulatedCrash):
            _workload(fs, meta, seed, history)
        survivor = fs.crash(random.Random(seed * 7919 + point), mode)
        try:
            _check(survivor, meta, history, where)
        except BaseException:
            print(f"FAILED at {where}; replay with: pytest --seed {seed}")
            raise
    return len(points)


def test_compaction_survives_a_crash_at_any_write(
    tmp_path: Path, replay_seed: int | None, soak: bool
) -> None:
    # Issue 18's bar: at least 1,000 compaction crash points on every `make test`.
    n_seeds = 16 * (10 if soak else 1)
    seeds = [replay_seed] if replay_seed is not None else list(range(1, n_seeds + 1))
    checked = sum(_run(tmp_path, seed, 25) for seed in seeds)
    if replay_seed is None:
        assert checked >= 1000
