"""Compaction of a compact topic's queues, on the store: semantics (Kafka's), every
configuration key's effect with a ManualClock, key lookups, and restarts."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tidemq.core.batch import MessageRecord, encode_batch
from tidemq.core.errors import ConfigError, InvalidBatch
from tidemq.core.message import messages_from_records
from tidemq.store.config import StoreConfig
from tidemq.store.message_store import MessageStore
from tidemq.store.metadata import CleanupPolicy
from tidemq.testing.clock import ManualClock

DAY = 86_400_000


def _batch(*pairs: tuple[bytes | None, bytes | None], ts: int = 0) -> bytes:
    return encode_batch([MessageRecord(v, k, None, (), (), ts) for k, v in pairs])


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def store(tmp_path: Path, clock: ManualClock) -> Iterator[MessageStore]:
    s = MessageStore.open(StoreConfig(data_dir=tmp_path), clock=clock)
    yield s
    s.close()


def _compact_topic(store: MessageStore, name: str = "prices", **config: str) -> None:
    store.create_topic(name, 1, cleanup_policy=CleanupPolicy.COMPACT, config=config)


def _put(store: MessageStore, *pairs: tuple[bytes, bytes | None], topic: str = "prices") -> int:
    result = store.append(topic, 0, _batch(*((k, v) for k, v in pairs), ts=store.clock.now_ms()))
    store.flush()
    return result.base_offset


def _read_all(
    store: MessageStore, topic: str = "prices"
) -> list[tuple[int, bytes | None, bytes | None]]:
    out: list[tuple[int, bytes | None, bytes | None]] = []
    offset, _ = store.queue_bounds(topic, 0)
    for _ in range(10_000):
        result = store.read(topic, 0, offset, max_bytes=1 << 20)
        if not result.batches:
            if result.next_offset > offset:
                offset = result.next_offset
                continue
            break
        sizes = [len(b.record) for b in result.batches]
        body = b"".join(b.record for b in result.batches)
        for m in messages_from_records(topic, 0, body, sizes, offset):
            out.append((m.offset, m.key, m.value))
        offset = result.next_offset
    return out


def test_compaction_keeps_the_latest_value_of_each_key_at_its_offset(
    store: MessageStore, clock: ManualClock
) -> None:
    _compact_topic(store)
    _put(store, (b"a", b"1"), (b"b", b"1"))
    _put(store, (b"a", b"2"))
    _put(store, (b"c", b"1"), (b"b", b"2"))
    result = store.compact("prices", 0)
    assert (result.messages_in, result.messages_out) == (5, 3)
    assert _read_all(store) == [(2, b"a", b"2"), (3, b"c", b"1"), (4, b"b", b"2")]
    # Offsets continue after the holes; later writes are read after the compacted part.
    assert _put(store, (b"a", b"3")) == 5
    assert _read_all(store)[-2:] == [(4, b"b", b"2"), (5, b"a", b"3")]
    assert store.queue_bounds("prices", 0) == (0, 6)


def test_a_second_run_merges_the_compacted_log_with_new_writes(store: MessageStore) -> None:
    _compact_topic(store)
    for i in range(5):
        _put(store, *((f"k{j}".encode(), f"{i}".encode()) for j in range(10)))
    store.compact("prices", 0)
    _put(store, (b"k3", b"new"), (b"k11", b"x"))
    store.compact("prices", 0)
    got = {k: (o, v) for o, k, v in _read_all(store)}
    assert got[b"k3"] == (50, b"new")
    assert got[b"k11"] == (51, b"x")
    assert got[b"k0"] == (40, b"4")
    assert len(got) == 11
    offsets = [o for o, _, _ in _read_all(store)]
    assert offsets == sorted(offsets)


def test_keyless_messages_are_refused_on_a_compact_topic(store: MessageStore) -> None:
    _compact_topic(store)
    with pytest.raises(InvalidBatch, match=r"compact topic.*needs a key, message 1"):
        store.append("prices", 0, _batch((b"a", b"1"), (None, b"2")))
    store.create_topic("plain", 1)
    store.append("plain", 0, _batch((None, b"2")))  # fine elsewhere


def test_compaction_of_a_delete_topic_is_refused(store: MessageStore) -> None:
    store.create_topic("plain", 1)
    with pytest.raises(ConfigError, match="only compact topics"):
        store.compact("plain", 0)


def test_tombstones_stay_for_delete_retention_ms_after_compaction_reached_them(
    store: MessageStore, clock: ManualClock
) -> None:
    _compact_topic(store, **{"delete.retention.ms": str(DAY)})
    _put(store, (b"a", b"1"), (b"b", b"1"))
    _put(store, (b"a", None))
    store.compact("prices", 0)
    assert _read_all(store) == [(1, b"b", b"1"), (2, b"a", None)]
    assert store.lookup_key("prices", 0, b"a") is not None
    clock.advance(DAY - 1)
    store.compact("prices", 0)
    assert (2, b"a", None) in _read_all(store)
    clock.advance(1)
    assert [d.reason for d in store.compaction_due()] == ["delete.retention.ms"]
    result = store.compact("prices", 0)
    assert result.tombstones_dropped == 1
    assert _read_all(store) == [(1, b"b", b"1")]
    assert store.lookup_key("prices", 0, b"a") is None


def test_nothing_younger_than_min_compaction_lag_is_compacted(
    store: MessageStore, clock: ManualClock
) -> None:
    _compact_topic(store, **{"min.compaction.lag.ms": "60000"})
    _put(store, (b"a", b"1"))
    clock.advance(30_000)
    _put(store, (b"a", b"2"))
    assert store.compaction_due() == []
    store.compact("prices", 0)
    assert len(_read_all(store)) == 2  # nothing old enough
    clock.advance(30_000)  # the first is 60 s old, the second 30 s
    store.compact("prices", 0)
    assert _read_all(store) == [
        (0, b"a", b"1"),
        (1, b"a", b"2"),
    ]  # a newer one is not yet cleanable
    clock.advance(30_000)
    store.compact("prices", 0)
    assert _read_all(store) == [(1, b"a", b"2")]


def test_dirty_ratio_and_max_lag_decide_when_a_queue_is_due(
    store: MessageStore, clock: ManualClock
) -> None:
    _compact_topic(store, **{"min.cleanable.dirty.ratio": "0.9", "max.compaction.lag.ms": "600000"})
    for i in range(10):
        _put(store, (f"k{i}".encode(), b"v" * 100))
    assert [d.reason for d in store.compaction_due()] == ["dirty ratio"]  # nothing clean yet
    store.compact("prices", 0)
    assert store.compaction_due() == []
    _put(store, (b"k1", b"w" * 100))  # dirty share ~10%, below 0.9
    assert store.compaction_due() == []
    clock.advance(600_000)
    assert [d.reason for d in store.compaction_due()] == ["max.compaction.lag.ms"]


def test_bad_compaction_settings_are_refused_by_name(store: MessageStore) -> None:
    from tidemq.store.compaction_settings import compaction_settings  # noqa: PLC0415

    with pytest.raises(ConfigError, match=r"min\.cleanable\.dirty\.ratio must be 0\.\.1"):
        compaction_settings({"min.cleanable.dirty.ratio": "2"})
    with pytest.raises(ConfigError, match=r"delete\.retention\.ms must be >= 0"):
        compaction_settings({"delete.retention.ms": "-5"})
    with pytest.raises(ConfigError, match=r"max\.compaction\.lag\.ms"):
        compaction_settings({"min.compaction.lag.ms": "10", "max.compaction.lag.ms": "5"})


def test_lookup_finds_the_latest_value_in_both_parts(store: MessageStore) -> None:
    _compact_topic(store)
    _put(store, *((f"k{i}".encode(), f"old{i}".encode()) for i in range(100)))
    store.compact("prices", 0)
    _put(store, (b"k5", b"new5"), (b"k7", None))
    found = store.lookup_key("prices", 0, b"k5")
    assert found is not None
    assert (found.offset, found.value) == (100, b"new5")
    found = store.lookup_key("prices", 0, b"k6")
    assert found is not None
    assert (found.offset, found.value) == (6, b"old6")
    found = store.lookup_key("prices", 0, b"k7")
    assert found is not None
    assert found.value is None
    assert store.lookup_key("prices", 0, b"nope") is None
    store.compact("prices", 0)  # the dirty part moves into the compacted log
    found = store.lookup_key("prices", 0, b"k5")
    assert found is not None
    assert (found.offset, found.value) == (100, b"new5")


def test_compacted_data_survives_a_restart(tmp_path: Path, clock: ManualClock) -> None:
    store = MessageStore.open(StoreConfig(data_dir=tmp_path), clock=clock)
    _compact_topic(store)
    _put(store, (b"a", b"1"), (b"b", b"1"), (b"a", b"2"))
    store.compact("prices", 0)
    _put(store, (b"b", b"2"))
    before = _read_all(store)
    store.close()
    store = MessageStore.open(StoreConfig(data_dir=tmp_path), clock=clock)
    try:
        assert _read_all(store) == before == [(1, b"b", b"1"), (2, b"a", b"2"), (3, b"b", b"2")]
        assert _put(store, (b"c", b"1")) == 4
    finally:
        store.close()


def test_offset_for_time_sees_the_compacted_part(store: MessageStore, clock: ManualClock) -> None:
    _compact_topic(store)
    _put(store, (b"a", b"1"))
    clock.advance(120_000)  # more than a compacted record's store-time span
    t = clock.now_ms()
    _put(store, (b"b", b"1"))
    _put(store, (b"a", b"2"))
    store.compact("prices", 0)
    assert store.offset_for_time("prices", 0, t) == 1
    assert store.offset_for_time("prices", 0, 0) == 1  # offset 0 was compacted away


def test_compact_delete_applies_retention_to_the_compacted_part(
    store: MessageStore, clock: ManualClock
) -> None:
    store.create_topic("state", 1, cleanup_policy=CleanupPolicy.COMPACT_DELETE, retention_ms=60_000)
    _put(store, (b"a", b"1"), topic="state")
    clock.advance(120_000)
    _put(store, (b"b", b"1"), topic="state")
    store.compact("state", 0)
    store.enforce_retention()
    assert _read_all(store, "state") == [(1, b"b", b"1")]
    assert store.queue_bounds("state", 0)[0] == 1


def test_spark_rows_of_a_compacted_queue_carry_their_own_offsets(store: MessageStore) -> None:
    from tidemq.core.arrow import records_to_arrow  # noqa: PLC0415 - pyarrow

    _compact_topic(store)
    for i in range(4):
        _put(store, *((f"k{j}".encode(), f"{i}".encode()) for j in range(5)))
    store.compact("prices", 0)
    _put(store, (b"k9", b"x"))
    result = store.read("prices", 0, 0, max_bytes=1 << 20)
    body = b"".join(b.record for b in result.batches)
    sizes = [len(b.record) for b in result.batches]
    whole = records_to_arrow("prices", 0, body, sizes, start=0, end=100)
    # The compacted record (offsets 15-19 of 0-19), then the commit log's (20).
    assert whole.column("offset").to_pylist() == [15, 16, 17, 18, 19, 20]
    assert whole.column("key").to_pylist() == [b"k0", b"k1", b"k2", b"k3", b"k4", b"k9"]
    part = records_to_arrow("prices", 0, body, sizes, start=16, end=19)
    assert part.column("offset").to_pylist() == [16, 17, 18]
    assert records_to_arrow("prices", 0, body, sizes, start=0, end=15) is None


def test_commit_log_segments_are_released_once_compacted(
    tmp_path: Path, clock: ManualClock
) -> None:
    config = StoreConfig(data_dir=tmp_path, segment_size_bytes=64 * 1024)
    store = MessageStore.open(config, clock=clock)
    try:
        _compact_topic(store)
        for i in range(200):
            _put(store, *((f"k{j}".encode(), bytes(100) + bytes([i])) for j in range(10)))
        store.checkpoint()
        segments = len(list((tmp_path / "commitlog").iterdir()))
        assert segments > 3
        store.compact("prices", 0)
        store.checkpoint()
        store.enforce_retention()
        assert len(list((tmp_path / "commitlog").iterdir())) == 1  # only the active one
        assert {k: v for _, k, v in _read_all(store)} == {
            f"k{j}".encode(): bytes(100) + bytes([199]) for j in range(10)
        }
    finally:
        store.close()
    store = MessageStore.open(config, clock=clock)  # and it reopens without them
    try:
        assert len(_read_all(store)) == 10
    finally:
        store.close()


def test_entries_array_from_matches_iter_entries(tmp_path: Path, clock: ManualClock) -> None:
    """Compaction scans dirty ranges as arrays; they hold exactly what iter_entries
    gives, across index files and the in-memory tail."""
    store = MessageStore.open(StoreConfig(data_dir=tmp_path, index_entries_per_file=4), clock=clock)
    try:
        _compact_topic(store)
        for i in range(23):
            _put(store, *((f"k{j}".encode(), b"v") for j in range(1 + i % 3)))
        index = store.queue_indexes()[(store.topic("prices").id, 0)]
        for offset in range(0, index.next_offset + 2, 3):
            for limit in (1, 5, 100):
                rows = index.entries_array_from(offset, limit).tolist()
                expected = [
                    (e.log_position, e.size, e.count, e.base_offset, e.store_time_ms, e.tag_summary)
                    for e in index.entries_from(offset, limit)
                ]
                assert rows == expected, (offset, limit)
    finally:
        store.close()
