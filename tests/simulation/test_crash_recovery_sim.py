"""Seeded crash simulation: power loss at any write, then recovery, then the checks.

A deterministic workload (appends to several queues, group-commit flushes, checkpoints,
idempotent producers) runs on the fault-injecting file system and is stopped at a chosen
mutating operation. The surviving state (a random prefix of unsynced bytes, torn and
zero-filled tails, lost directory entries) is reopened and checked:

* sync flush: every acknowledged batch (its end was flushed) is readable at its offset,
  with its bytes; nothing is lost.
* async flush: what survives of each queue is a prefix of what was appended, every batch
  whose end was flushed survives.
* always: every record read passes its CRC, offsets are dense, appends continue at the
  queue's next offset, and a retried idempotent batch gets its original offsets.

Metadata lives in SQLite outside the fake file system; its transactions are durable when
they return, so keeping it whole across the simulated crash is the faithful model.
A failure prints its seed and crash point; `pytest --seed N` replays that seed.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tidemq.core.batch import MessageRecord, decode_messages, encode_batch, parse_envelope
from tidemq.core.record import parse_header
from tidemq.store.config import FlushMode, StoreConfig
from tidemq.store.message_store import MessageStore, ReadStatus
from tidemq.store.producer_state import ProducerStamp
from tidemq.testing.files import CrashMode, FaultFileSystem, SimulatedCrash

DATA = Path("/sim/data")
QUEUES = [("alpha", 0), ("alpha", 1), ("beta", 0)]


class _Clock:
    def __init__(self) -> None:
        self.ms = 1_700_000_000_000

    def now_ms(self) -> int:
        return self.ms

    def monotonic_ms(self) -> float:
        return float(self.ms)


@dataclass
class _History:
    """What the workload did, as seen by the client."""

    # (topic, queue) -> list of (base_offset, payload, end_position) in append order
    appended: dict[tuple[str, int], list[tuple[int, bytes, int]]] = field(default_factory=dict)
    flushed_position: int = 0
    # the append that was running when the crash hit: it may or may not have survived
    in_flight: tuple[str, int, bytes] | None = None
    # the idempotent producer's batches not yet known flushed when the crash hit
    unacked: list[tuple[ProducerStamp, bytes]] = field(default_factory=list)


def _config(mode: FlushMode) -> StoreConfig:
    return StoreConfig(
        data_dir=DATA,
        segment_size_bytes=4096,
        index_entries_per_file=4,
        flush_mode=mode,
        checkpoint_interval_ms=50,
        flush_interval_ms=20,
    )


def _payload(rng: random.Random, tag: str) -> bytes:
    msgs = [
        MessageRecord(
            value=rng.randbytes(rng.randint(0, 300)),
            key=rng.choice([None, b"k%d" % rng.randint(0, 9)]),
            tag=tag,
            timestamp_ms=1_700_000_000_000 + i,
        )
        for i in range(rng.randint(1, 6))
    ]
    return encode_batch(msgs)


def _workload(
    fs: FaultFileSystem, meta: Path, seed: int, mode: FlushMode, history: _History
) -> None:
    rng = random.Random(seed)
    clock = _Clock()
    store = MessageStore.open(_config(mode), fs=fs, clock=clock, metadata_path=meta)
    if not store.topics():
        store.create_topic("alpha", 2)
        store.create_topic("beta", 1)
    pid = store.allocate_producer_id()
    sequence = 0
    for step in range(40):
        topic, queue = QUEUES[step % len(QUEUES)] if step % 4 else rng.choice(QUEUES)
        payload = _payload(rng, f"t{step % 3}")
        history.in_flight = (topic, queue, payload)
        if topic == "beta":
            stamp = ProducerStamp(pid, 0, sequence)
            history.unacked.append((stamp, payload))
            sequence += parse_envelope(payload).count
            result = store.append(topic, queue, payload, producer=stamp)
        else:
            result = store.append(topic, queue, payload)
        history.appended.setdefault((topic, queue), []).append(
            (result.base_offset, payload, result.end_position)
        )
        history.in_flight = None
        if rng.random() < 0.4:
            history.flushed_position = store.flush()
            history.unacked.clear()
        clock.ms += rng.randint(0, 30)
        store.tick()
    history.flushed_position = store.flush()
    store.close()


def _records(store: MessageStore, topic: str, queue: int) -> list[tuple[int, bytes]]:
    out: list[tuple[int, bytes]] = []
    offset = store.queue_bounds(topic, queue)[0]
    while True:
        res = store.read(topic, queue, offset, max_bytes=1 << 16)
        if res.status is not ReadStatus.FOUND:
            return out
        for batch in res.batches:
            payload = batch.record[parse_header(batch.record).payload_start :]
            decode_messages(payload)  # CRC and structure: no torn record is ever returned
            out.append((batch.base_offset, payload))
        offset = res.next_offset


def _check(fs: FaultFileSystem, meta: Path, mode: FlushMode, history: _History, where: str) -> None:
    store = MessageStore.open(_config(mode), fs=fs, clock=_Clock(), metadata_path=meta)
    try:
        names = {t.name for t in store.topics()}
        for name, queues in (("alpha", 2), ("beta", 1)):
            if name not in names:  # the crash came before the workload created it
                assert not any(t == name for t, _ in history.appended), where
                store.create_topic(name, queues)
        touched = set(history.appended)
        if history.in_flight is not None:
            touched.add(history.in_flight[:2])
        for topic, queue in sorted(touched):
            appended = history.appended.get((topic, queue), [])
            got = _records(store, topic, queue)
            expected = [(o, p) for o, p, _ in appended]
            if history.in_flight is not None and history.in_flight[:2] == (topic, queue):
                nxt = expected[-1][0] + parse_envelope(expected[-1][1]).count if expected else 0
                expected.append((nxt, history.in_flight[2]))
            assert got == expected[: len(got)], f"{where}: {topic}/{queue} is not a prefix"
            durable = [(o, p) for o, p, end in appended if end <= history.flushed_position]
            assert got[: len(durable)] == durable, f"{where}: {topic}/{queue} lost acked data"
            nxt = store.queue_bounds(topic, queue)[1]
            last = got[-1][0] + len(decode_messages(got[-1][1])) if got else 0
            assert nxt == last, f"{where}: {topic}/{queue} continues at {nxt}, not {last}"
        # The producer retries every batch it was not told is durable, in order: each
        # one that survived gets its original offset back; the rest are appended.
        kept = {p: o for o, p in _records(store, "beta", 0)}
        for stamp, payload in history.unacked:
            again = store.append("beta", 0, payload, producer=stamp)
            if payload in kept:
                assert again.duplicate, f"{where}: a surviving retry was written twice"
                assert again.base_offset == kept[payload], f"{where}: retry moved"
            else:
                assert not again.duplicate, f"{where}: a lost batch was reported stored"
        res = store.append("alpha", 0, encode_batch([MessageRecord(b"after")]))
        assert res.base_offset == store.queue_bounds("alpha", 0)[1] - 1, where
        store.flush()
    finally:
        store.close()
    # A second recovery of the recovered state changes nothing.
    store = MessageStore.open(_config(mode), fs=fs, clock=_Clock(), metadata_path=meta)
    store.close()


def _run(tmp_path: Path, seed: int, mode: FlushMode, crash_points: int) -> int:
    dry = FaultFileSystem()
    _workload(dry, tmp_path / f"dry-{seed}.sqlite", seed, mode, _History())
    total = dry.mutations
    rng = random.Random(seed)
    points = sorted(rng.sample(range(1, total + 1), min(crash_points, total)))
    for point in points:
        crash_mode: CrashMode = rng.choice(["prefix", "torn", "lose"])
        where = f"seed={seed} crash_point={point}/{total} mode={crash_mode} flush={mode.value}"
        fs = FaultFileSystem()
        fs.crash_at_write(point)
        meta = tmp_path / f"meta-{seed}-{point}.sqlite"
        history = _History()
        with pytest.raises(SimulatedCrash):
            _workload(fs, meta, seed, mode, history)
        survivor = fs.crash(random.Random(seed * 7919 + point), crash_mode)
        try:
            _check(survivor, meta, mode, history, where)
        except BaseException:
            print(f"FAILED at {where}; replay with: pytest --seed {seed}")
            raise
    return len(points)


@pytest.mark.parametrize("mode", [FlushMode.SYNC, FlushMode.ASYNC])
def test_no_acknowledged_batch_is_lost_at_any_crash_point(
    tmp_path: Path, mode: FlushMode, replay_seed: int | None, soak: bool
) -> None:
    # The bar: at least 1,000 crash points with sync flush on every `make test`.
    n_seeds = (10 if mode is FlushMode.SYNC else 4) * (10 if soak else 1)
    seeds = [replay_seed] if replay_seed is not None else list(range(1, n_seeds + 1))
    per_seed = 100
    checked = sum(_run(tmp_path, seed, mode, per_seed) for seed in seeds)
    if replay_seed is None:
        assert checked >= (1000 if mode is FlushMode.SYNC else 400) * (10 if soak else 1)
