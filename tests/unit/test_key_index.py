"""The key index (`store/key_index.py`, `store/format/key_entry.py`): its format, the keys
it takes from a batch, and `MessageStore.find_by_key` against a dict model through
appends, checkpoints, seals, crashes at every write of a sealing checkpoint, the bound,
retention and a damaged file.

The randomized test prints its seed; TIDEMQ_KEYINDEX_SEED replays it.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tidemq.core.batch import (
    Codec,
    MessageRecord,
    decode_messages,
    encode_batch,
    may_have_keys,
    parse_envelope,
)
from tidemq.store.config import StoreConfig
from tidemq.store.format.key_entry import (
    ENTRY,
    ENTRY_DTYPE,
    column_hashes,
    entry_array,
    entry_bytes,
    index_hash,
)
from tidemq.store.key_index import batch_keys
from tidemq.store.message_store import MessageStore
from tidemq.testing.clock import ManualClock
from tidemq.testing.files import FaultFileSystem, SimulatedCrash

END = (1 << 63) - 1
Model = dict[tuple[str, bytes], list[tuple[int, int]]]  # (topic, key) -> (queue, offset)


def test_an_entry_is_40_bytes() -> None:
    raw = entry_bytes(
        [(0, b"a"), (2, b"b")],
        base_offset=10,
        log_position=4096,
        store_time_ms=7,
        topic_id=3,
        queue_id=1,
    )
    assert len(raw) == 2 * ENTRY.size == 80
    entries = np.frombuffer(raw, dtype=ENTRY_DTYPE)
    assert entries["key_hash"].tolist() == [index_hash(b"a"), index_hash(b"b")]
    assert entries["offset"].tolist() == [10, 12]
    assert entries[0].tolist()[1:] == (10, 4096, 7, 3, 1)
    same = entry_array(
        np.array([0, 2], dtype=np.intp),
        np.array([index_hash(b"a"), index_hash(b"b")], dtype=np.uint64),
        base_offset=10,
        log_position=4096,
        store_time_ms=7,
        topic_id=3,
        queue_id=1,
    )
    assert same.tobytes() == raw


def test_index_hash_reference_values() -> None:
    """Pinned, as part of the file format (VERSION 2): FNV-1a 64 of the bytes, then the
    length mixed in (the published FNV-1a 64 of b"a" is 0xaf63dc4c8601ec8c)."""
    mask = (1 << 64) - 1
    assert index_hash(b"a") == ((0xAF63DC4C8601EC8C ^ 1) * 0x100000001B3) & mask
    # Over 64 bytes, the first and last 32 (and the length) are hashed.
    long = b"x" * 32 + b"middle" * 20 + b"y" * 32
    same_ends = b"x" * 32 + b"m" * 120 + b"y" * 32
    assert index_hash(long) == index_hash(same_ends)  # a collision the read resolves
    assert index_hash(long) != index_hash(long[:-1] + b"z")
    assert index_hash(long) != index_hash(long + b"y")  # the length counts


def test_column_hashes_agree_with_index_hash() -> None:
    seed = int(os.environ.get("TIDEMQ_KEYINDEX_SEED", random.randrange(1 << 30)))
    print(f"TIDEMQ_KEYINDEX_SEED={seed}")
    rng = random.Random(seed)
    for _ in range(200):
        keys = [
            rng.randbytes(rng.choice([0, 1, 5, 31, 32, 33, 63, 64, 65, 200])) for _ in range(50)
        ]
        offsets = np.array([0, *np.cumsum([len(k) for k in keys])], dtype=np.uint32)
        data = np.frombuffer(b"".join(keys), dtype=np.uint8)
        rows = np.array(sorted(rng.sample(range(50), rng.randint(0, 50))), dtype=np.intp)
        got = column_hashes(offsets, data, rows).tolist()
        assert got == [index_hash(keys[i]) for i in rows]


def test_batch_keys_are_each_key_and_distinct_keys_once() -> None:
    payload = encode_batch(
        [
            MessageRecord(b"v", b"order-1", None, ("order-1", "cust-2", "cust-2")),
            MessageRecord(b"v", None, None, ("x",)),
            MessageRecord(b"v", b"", None, ()),
            MessageRecord(b"v"),
        ]
    )
    found = batch_keys(payload, parse_envelope(payload))
    assert found.rows.tolist() == [0]
    assert found.hashes.tolist() == [index_hash(b"order-1")]
    assert found.items == [(0, b"cust-2"), (1, b"x")]
    assert len(found) == 3


def test_the_probe_never_misses_a_key() -> None:
    seed = int(os.environ.get("TIDEMQ_KEYINDEX_SEED", random.randrange(1 << 30)))
    print(f"TIDEMQ_KEYINDEX_SEED={seed}")
    rng = random.Random(seed)
    for _ in range(500):
        records = [
            MessageRecord(
                rng.choice([None, b"", b"v" * rng.randint(1, 30)]),
                rng.choice([None, b"", b"k%d" % rng.randint(0, 9)]),
                rng.choice([None, "t", "tag-2"]),
                tuple(f"b{rng.randint(0, 5)}" for _ in range(rng.choice([0, 0, 0, 1, 3]))),
                (("h", b"x"),) if rng.random() < 0.2 else (),
                1_000 + rng.randint(0, 9),
            )
            for _ in range(rng.randint(1, 12))
        ]
        payload = encode_batch(records, codec=rng.choice([Codec.NONE, Codec.NONE, Codec.ZSTD]))
        has = any(m.key or m.keys for m in decode_messages(payload))
        assert may_have_keys(payload, parse_envelope(payload)) or not has
        assert bool(batch_keys(payload, parse_envelope(payload))) == has


def _batch(rng: random.Random, n: int) -> tuple[bytes, list[set[bytes]]]:
    records, keys = [], []
    for i in range(n):
        key = b"k%d" % rng.randint(0, 12) if rng.random() < 0.8 else None
        biz = tuple(f"b{rng.randint(0, 12)}" for _ in range(rng.choice([0, 0, 1, 2])))
        records.append(MessageRecord(b"v%d" % i, key, None, biz, (), 1_000))
        keys.append({k for k in [key, *(b.encode() for b in biz)] if k})
    return encode_batch(records), keys


def _config(**overrides: Any) -> StoreConfig:
    settings: dict[str, Any] = {
        "data_dir": Path("/data"),
        "segment_size_bytes": 4096,
        "key_index_entries_per_file": 16,
        "key_index_max_entries": 1 << 20,
    }
    return StoreConfig(**(settings | overrides))


def _check(store: MessageStore, model: Model, where: str) -> None:
    store.flush()  # sync flush: reads (and so lookups) see flushed records only
    for (topic, key), places in model.items():
        found = store.find_by_key(topic, key, start_ms=0, end_ms=END, limit=1_000)
        got = [(r.queue, _offsets(r.record)[i]) for r in found.records for i in sorted(r.indexes)]
        assert sorted(got) == sorted(places), f"{where}: {topic} {key!r}"
        assert not found.more


def _offsets(record: bytes) -> list[int]:
    from tidemq.core.message import record_offsets  # noqa: PLC0415

    return record_offsets(record)


def _append(store: MessageStore, rng: random.Random, model: Model) -> None:
    topic = rng.choice(["a", "b", "off"])
    queue = rng.randrange(2)
    payload, keys = _batch(rng, rng.randint(1, 8))
    base = store.append(topic, queue, payload).base_offset
    if topic != "off":
        for i, ks in enumerate(keys):
            for k in ks:
                model.setdefault((topic, k), []).append((queue, base + i))


def _open(fs: FaultFileSystem, meta: Path, clock: ManualClock, **overrides: Any) -> MessageStore:
    return MessageStore.open(_config(**overrides), fs=fs, clock=clock, metadata_path=meta)


def test_lookups_match_a_model_through_checkpoints_seals_and_crashes(tmp_path: Path) -> None:
    seed = int(os.environ.get("TIDEMQ_KEYINDEX_SEED", random.randrange(1 << 30)))
    print(f"TIDEMQ_KEYINDEX_SEED={seed}")
    rng = random.Random(seed)
    fs, meta, clock = FaultFileSystem(), tmp_path / "meta.sqlite", ManualClock()
    store = _open(fs, meta, clock)
    store.create_topic("a", 2)
    store.create_topic("b", 2)
    store.create_topic("off", 2, config={"key.index": "false"})
    model: Model = {}
    for step in range(300):
        op = rng.random()
        if op < 0.75:
            _append(store, rng, model)
            clock.advance(rng.randint(0, 50))
        elif op < 0.9:
            store.checkpoint()
        elif op < 0.97:
            store.log.close()  # kill -9: what was written stays, no checkpoint
            fs = fs.crash_process()
            store = _open(fs, meta, clock)
        else:
            _check(store, model, f"seed {seed} step {step}")
    _check(store, model, f"seed {seed} end")
    assert list(store.key_index.sealed_files()), "the run sealed no file"
    store.close()


def test_a_crash_at_any_write_of_a_sealing_checkpoint_loses_no_key(tmp_path: Path) -> None:
    for crash_at in range(1, 40):
        fs, meta, clock = FaultFileSystem(), tmp_path / f"meta-{crash_at}.sqlite", ManualClock()
        store = _open(fs, meta, clock)
        store.create_topic("a", 2)
        store.create_topic("b", 2)
        store.create_topic("off", 2, config={"key.index": "false"})
        rng = random.Random(crash_at)
        model: Model = {}
        for _ in range(3):
            _append(store, rng, model)
        store.checkpoint()
        while store.key_index.entry_count < 20:  # past a file's 16: the next checkpoint seals
            _append(store, rng, model)
        fs.crash_at_write(crash_at)
        try:
            store.checkpoint()
            crashed = False
        except SimulatedCrash:
            crashed = True
        fs = fs.crash_process()
        store = _open(fs, meta, clock)
        _check(store, model, f"crash at write {crash_at}")
        store.close()
        if not crashed:
            return  # every write of the checkpoint was a crash point
    pytest.fail("the sealing checkpoint has more than 39 writes")


def test_the_oldest_files_go_past_the_bound(tmp_path: Path) -> None:
    fs, meta, clock = FaultFileSystem(), tmp_path / "meta.sqlite", ManualClock()
    store = _open(fs, meta, clock, key_index_max_entries=64)
    store.create_topic("t", 1)
    for i in range(40):
        store.append("t", 0, encode_batch([MessageRecord(b"v", b"k%d" % i, None, ("all",))]))
        store.checkpoint()
    assert store.key_index.entry_count <= 64
    store.flush()
    sealed = [count for _, count in store.key_index.sealed_files()]
    assert sum(sealed) + 16 <= 64
    newest = store.find_by_key("t", b"all", start_ms=0, end_ms=END, limit=1_000)
    assert newest.count == store.key_index.entry_count // 2  # two entries per message
    assert store.find_by_key("t", b"k39", start_ms=0, end_ms=END, limit=1).count == 1
    assert store.find_by_key("t", b"k0", start_ms=0, end_ms=END, limit=1).count == 0
    store.close()


def test_retention_drops_files_and_never_returns_removed_messages(tmp_path: Path) -> None:
    fs, meta, clock = FaultFileSystem(), tmp_path / "meta.sqlite", ManualClock()
    store = _open(fs, meta, clock)
    store.create_topic("t", 1, retention_ms=1_000)
    for i in range(60):
        store.append("t", 0, encode_batch([MessageRecord(b"x" * 300, b"k", None, (), (), i)]))
        store.checkpoint()
    files = len(list(store.key_index.sealed_files()))
    clock.advance(5_000)
    store.append("t", 0, encode_batch([MessageRecord(b"new", b"k")]))
    store.checkpoint()
    assert store.enforce_retention() > 0
    assert len(list(store.key_index.sealed_files())) < files
    found = store.find_by_key("t", b"k", start_ms=0, end_ms=END, limit=1_000)
    assert [r.record[-3:] for r in found.records] != []
    assert found.count == 1
    store.close()


def test_a_damaged_sealed_file_is_dropped_not_served(tmp_path: Path) -> None:
    fs, meta, clock = FaultFileSystem(), tmp_path / "meta.sqlite", ManualClock()
    store = _open(fs, meta, clock)
    store.create_topic("t", 1)
    for i in range(40):
        store.append("t", 0, encode_batch([MessageRecord(b"v", b"k%d" % (i % 4))]))
        store.checkpoint()
    (path, _), *_ = store.key_index.sealed_files()
    store.close()
    handle = fs.open(path)
    size = handle.size()
    handle.truncate(size - 1)  # cut into its footer
    handle.close()
    store = _open(fs, meta, clock)
    assert not fs.exists(path)
    store.flush()
    found = store.find_by_key("t", b"k1", start_ms=0, end_ms=END, limit=1_000)
    assert 0 < found.count < 10  # what the other files hold, checked by reading
    store.close()


def test_time_range_and_limit_select_newest_first(tmp_path: Path) -> None:
    fs, meta, clock = FaultFileSystem(), tmp_path / "meta.sqlite", ManualClock()
    store = _open(fs, meta, clock)
    store.create_topic("t", 1)
    t0 = clock.now_ms()
    for i in range(30):
        store.append("t", 0, encode_batch([MessageRecord(b"v%d" % i, b"k")]))
        clock.advance(10)
        if i % 7 == 0:
            store.checkpoint()  # some in sealed files, some in the open one
    store.flush()
    got = store.find_by_key("t", b"k", start_ms=t0 + 50, end_ms=t0 + 120, limit=1_000)
    assert [r.record for r in got.records] == [
        r.record for r in store.find_by_key("t", b"k", start_ms=0, end_ms=END, limit=30).records
    ][-13:-5]
    top = store.find_by_key("t", b"k", start_ms=0, end_ms=END, limit=3)
    assert (top.count, top.more) == (3, True)
    assert [parse_base(r.record) for r in top.records] == [29, 28, 27]
    store.close()


def parse_base(record: bytes) -> int:
    from tidemq.core.record import parse_header  # noqa: PLC0415

    return parse_header(record).base_offset
