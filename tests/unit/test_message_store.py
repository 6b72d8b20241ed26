"""MessageStore behaviour, one property per test, on real files in a temp dir.

Faults the real disk cannot be made to produce on demand (a full disk, ENOSPC in the middle
of a write, an fsync that fails) come from `_FaultyFs`, a thin OsFileSystem subclass.
"""

from __future__ import annotations

import errno
import os
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from tidemq.core.batch import MessageRecord, decode_messages, encode_batch, encode_values, tag_bit
from tidemq.core.errors import (
    BatchTooLarge,
    ConfigError,
    DiskFull,
    InvalidBatch,
    InvalidTopicName,
    OutOfOrderSequence,
    QueueNotFound,
    StorageFailure,
    TopicNotFound,
)
from tidemq.core.record import parse_header
from tidemq.store.config import FlushMode, StoreConfig
from tidemq.store.files import SYNCFS_MIN_FILES, Buffer, FileSystem, OsFile, OsFileSystem
from tidemq.store.format.index_entry import ENTRY as INDEX_ENTRY
from tidemq.store.message_store import AppendResult, MessageStore, ReadStatus, queue_dir
from tidemq.store.producer_state import ProducerStamp
from tidemq.testing.files import FaultFileSystem

T0 = 1_700_000_000_000


class FakeClock:
    def __init__(self, now_ms: int = T0) -> None:
        self.ms = now_ms

    def now_ms(self) -> int:
        return self.ms

    def monotonic_ms(self) -> float:
        return float(self.ms)


class _FaultyFile(OsFile):
    """A commit-log segment whose appends and syncs fail while `_FaultyFs` says so."""

    def __init__(self, path: Path, fd: int, fs: _FaultyFs) -> None:
        super().__init__(path, fd)
        self.fs = fs

    def append(self, buffers: Sequence[Buffer]) -> None:
        if self.fs.enospc:
            data = b"".join(bytes(b) for b in buffers)
            super().append([data[: len(data) // 2]])  # a short write, then the error
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self.path))
        super().append(buffers)

    def sync(self) -> None:
        if self.fs.eio:
            raise OSError(errno.EIO, os.strerror(errno.EIO), str(self.path))
        super().sync()


class _FaultyFs(OsFileSystem):
    """The real file system, with a settable disk usage and switchable segment faults."""

    def __init__(self) -> None:
        self.usage: tuple[int, int] | None = None  # (total, free); None: the real one
        self.enospc = False
        self.eio = False

    def open(self, path: Path, *, create: bool = False) -> OsFile:
        if path.parent.name != "commitlog":
            return super().open(path, create=create)
        fd = os.open(path, os.O_RDWR | (os.O_CREAT if create else 0), 0o644)
        return _FaultyFile(path, fd, self)

    def disk_usage(self, path: Path) -> tuple[int, int]:
        return self.usage if self.usage is not None else super().disk_usage(path)


# ---------------------------------------------------------------------------- helpers


def _config(tmp_path: Path, **overrides: Any) -> StoreConfig:
    settings: dict[str, Any] = {
        "segment_size_bytes": 4096,
        "index_entries_per_file": 4,
        "retention_ms": -1,
        "disk_reject_ratio": 1.0,  # the real disk may be fuller than the default allows
    }
    return StoreConfig(data_dir=tmp_path / "data", **(settings | overrides))


def _open(
    config: StoreConfig, clock: FakeClock | None = None, fs: FileSystem | None = None
) -> MessageStore:
    return MessageStore.open(config, fs=fs, clock=clock or FakeClock())


def _open_on_fault_fs(
    tmp_path: Path, **overrides: Any
) -> tuple[StoreConfig, Path, FaultFileSystem, MessageStore]:
    """A store on a fresh `FaultFileSystem` (metadata on the real disk, which it does not
    model): its config, metadata path, file system and the store."""
    config = StoreConfig(data_dir=Path("/data"), **overrides)
    meta, fs = tmp_path / "meta.sqlite", FaultFileSystem()
    return config, meta, fs, MessageStore.open(config, fs=fs, clock=FakeClock(), metadata_path=meta)


def _values(*values: bytes) -> bytes:
    return encode_values(list(values), timestamp_ms=T0)


def _crash(store: MessageStore) -> None:
    """What kill -9 leaves: files as written, no checkpoint, descriptors closed by the OS."""
    store.log.close()
    store.metadata.close()


def _read_all(store: MessageStore, topic: str, queue: int) -> list[tuple[int, bytes]]:
    """(base offset, record) of every readable batch, checking the offsets are dense."""
    lo, hi = store.queue_bounds(topic, queue)
    out: list[tuple[int, bytes]] = []
    offset = lo
    while offset < hi:
        got = store.read(topic, queue, offset, max_bytes=1 << 20)
        assert got.status is ReadStatus.FOUND, (offset, got)
        for batch in got.batches:
            assert batch.base_offset == offset
            out.append((batch.base_offset, batch.record))
            offset += batch.count
        assert got.next_offset == offset
    return out


def _payload(record: bytes) -> bytes:
    return record[parse_header(record).payload_start :]


def _segments(config: StoreConfig) -> list[Path]:
    return sorted((config.data_dir / "commitlog").glob("*.log"))


def _snapshot(store: MessageStore) -> dict[tuple[str, int], object]:
    """Everything a reader can observe: each queue's bounds and batches."""
    return {
        (info.name, q): (store.queue_bounds(info.name, q), _read_all(store, info.name, q))
        for info in store.topics()
        for q in range(info.queues)
    }


@pytest.fixture
def config(tmp_path: Path) -> StoreConfig:
    return _config(tmp_path)


@pytest.fixture
def store(config: StoreConfig) -> Iterator[MessageStore]:
    s = _open(config)
    s.create_topic("orders", 2)
    yield s
    s.close()


# ---------------------------------------------------------------------------- topics and queues


def test_unknown_topic_raises_topic_not_found(store: MessageStore) -> None:
    with pytest.raises(TopicNotFound):
        store.append("nope", 0, _values(b"x"))
    with pytest.raises(TopicNotFound):
        store.read("nope", 0, 0, max_bytes=1024)
    with pytest.raises(TopicNotFound):
        store.queue_bounds("nope", 0)
    with pytest.raises(TopicNotFound):
        store.offset_for_time("nope", 0, T0)
    with pytest.raises(TopicNotFound):
        store.alter_topic("nope", queues=3)
    with pytest.raises(TopicNotFound):
        store.delete_topic("nope")


@pytest.mark.parametrize("queue", [2, 3, -1])
def test_unknown_queue_raises_queue_not_found(store: MessageStore, queue: int) -> None:
    with pytest.raises(QueueNotFound):
        store.append("orders", queue, _values(b"x"))
    with pytest.raises(QueueNotFound):
        store.read("orders", queue, 0, max_bytes=1024)
    with pytest.raises(QueueNotFound):
        store.queue_bounds("orders", queue)
    assert store.end_position == 0


@pytest.mark.parametrize(
    "name",
    [
        *["", "a/b", "has space", "x" * 128, "ünïcode", "tab\there", "nul\0", "a:b"],
        *[".", "..", "-rf", ".hidden", "A-z_0.9%", "%x", "%RETRY%", "%SYS%lower", "a\n"],
    ],
)
def test_invalid_topic_names_are_rejected(store: MessageStore, name: str) -> None:
    with pytest.raises(InvalidTopicName):
        store.create_topic(name, 1)
    assert [t.name for t in store.topics()] == ["orders"]


@pytest.mark.parametrize(
    "name", ["x" * 127, "A-z_0.9", "_", "a..b", "%RETRY%g", "%DLQ%g-1", "%SYS%TIMER"]
)
def test_valid_unusual_topic_names_are_accepted(store: MessageStore, name: str) -> None:
    store.create_topic(name, 1)
    assert store.append(name, 0, _values(b"x")).base_offset == 0


def test_deleted_topic_is_gone_and_its_name_starts_over(config: StoreConfig) -> None:
    store = _open(config)
    store.create_topic("t", 1)
    store.append("t", 0, _values(b"old", b"old"))
    store.delete_topic("t")
    with pytest.raises(TopicNotFound):
        store.read("t", 0, 0, max_bytes=1024)
    store.create_topic("t", 1)
    assert store.queue_bounds("t", 0) == (0, 0)
    assert store.append("t", 0, _values(b"new")).base_offset == 0
    store.close()
    store = _open(config)
    [(_, record)] = _read_all(store, "t", 0)
    assert [m.value for m in decode_messages(_payload(record))] == [b"new"]
    store.close()


def test_deleting_a_topic_forgets_its_committed_offsets(config: StoreConfig) -> None:
    store = _open(config)
    store.create_topic("t", 2)
    store.create_topic("u", 1)
    store.commit_offsets("g", {("t", 0): 7, ("t", 1): 3, ("u", 0): 5})
    store.delete_topic("t")
    store.create_topic("t", 2)  # a namesake: offset 7 would mean nothing in it
    assert store.committed_offsets("g") == {("u", 0): 5}
    store.close()


def test_committed_offsets_carry_the_time_of_their_commit(config: StoreConfig) -> None:
    clock = FakeClock()
    store = _open(config, clock)
    store.create_topic("t", 2)
    store.commit_offsets("g", {("t", 0): 7, ("t", 1): 3})
    clock.ms += 5_000
    store.commit_offsets("g", {("t", 1): 4})
    assert store.committed_offsets_with_time("g") == {("t", 0): (7, T0), ("t", 1): (4, T0 + 5_000)}
    assert store.committed_offsets_with_time("other") == {}
    store.close()


def test_queues_can_be_added_but_not_removed(config: StoreConfig) -> None:
    store = _open(config)
    store.create_topic("t", 3)
    store.append("t", 2, _values(b"x"))
    with pytest.raises(ConfigError):
        store.alter_topic("t", queues=2)
    assert store.topic("t").queues == 3
    assert store.queue_bounds("t", 2) == (0, 1)
    store.alter_topic("t", queues=5)
    assert store.queue_bounds("t", 4) == (0, 0)
    assert store.append("t", 4, _values(b"y")).base_offset == 0
    store.close()
    store = _open(config)
    assert store.topic("t").queues == 5
    assert store.queue_bounds("t", 2) == (0, 1)
    assert store.queue_bounds("t", 4) == (0, 1)
    store.close()


# ---------------------------------------------------------------------------- appends


def test_corrupt_batch_raises_invalid_batch_and_writes_nothing(store: MessageStore) -> None:
    store.append("orders", 0, _values(b"good"))
    end = store.end_position
    good = encode_values([b"hello world"], timestamp_ms=T0)
    for bad in (
        good[:20] + bytes([good[20] ^ 0x01]) + good[21:],  # envelope field under the CRC
        good[:-1] + bytes([good[-1] ^ 0x80]),  # last body byte
        good[:4] + bytes([good[4] ^ 0xFF]) + good[5:],  # the CRC itself
        bytes([0]) + good[1:],  # magic
        good[:30],  # shorter than the envelope
        b"",
    ):
        with pytest.raises(InvalidBatch):
            store.append("orders", 0, bad)
    assert store.end_position == end
    assert store.queue_bounds("orders", 0) == (0, 1)
    assert store.append("orders", 0, good).base_offset == 1


def test_oversized_batch_raises_batch_too_large(tmp_path: Path) -> None:
    store = _open(_config(tmp_path, max_batch_bytes=1024))
    store.create_topic("t", 1)
    with pytest.raises(BatchTooLarge):
        store.append("t", 0, _values(b"x" * 2000))
    assert store.end_position == 0
    assert store.queue_bounds("t", 0) == (0, 0)
    assert store.append("t", 0, _values(b"x" * 500)).base_offset == 0
    store.close()


def test_idempotent_retry_returns_original_offsets(store: MessageStore) -> None:
    pid = store.allocate_producer_id()
    first = store.append("orders", 0, _values(b"a", b"b"), producer=ProducerStamp(pid, 0, 0))
    end = store.end_position
    again = store.append("orders", 0, _values(b"a", b"b"), producer=ProducerStamp(pid, 0, 0))
    assert again.duplicate
    assert (again.base_offset, again.count) == (first.base_offset, first.count)
    assert store.end_position == end
    with pytest.raises(OutOfOrderSequence):
        store.append("orders", 0, _values(b"c"), producer=ProducerStamp(pid, 0, 5))
    assert store.end_position == end
    nxt = store.append("orders", 0, _values(b"c"), producer=ProducerStamp(pid, 0, 2))
    assert (nxt.base_offset, nxt.duplicate) == (2, False)


# ---------------------------------------------------------------------------- reads


def test_offset_for_time_finds_first_batch_stored_at_or_after(config: StoreConfig) -> None:
    clock = FakeClock()
    store = _open(config, clock)
    store.create_topic("t", 1)
    store.append("t", 0, _values(b"a", b"b"))  # offsets 0-1 at T0
    clock.ms += 100
    store.append("t", 0, encode_values([b"c"], timestamp_ms=T0 + 100))  # offset 2
    clock.ms += 100
    store.append("t", 0, encode_values([b"d", b"e", b"f"], timestamp_ms=T0 + 200))  # 3-5
    assert store.offset_for_time("t", 0, 0) == 0
    assert store.offset_for_time("t", 0, T0) == 0
    assert store.offset_for_time("t", 0, T0 + 1) == 2
    assert store.offset_for_time("t", 0, T0 + 100) == 2
    assert store.offset_for_time("t", 0, T0 + 150) == 3
    assert store.offset_for_time("t", 0, T0 + 200) == 3
    assert store.offset_for_time("t", 0, T0 + 201) == 6  # none: the next offset
    store.close()


def test_offset_for_time_picks_the_message_in_the_batch(config: StoreConfig) -> None:
    """Kafka's offsetsForTimes: the first message whose timestamp is at or after the time,
    not the first batch stored after it (issue 21: Spark's startingTimestamp started at a
    batch); a batch whose messages carry older timestamps is stepped over."""
    clock = FakeClock()
    store = _open(config, clock)
    store.create_topic("t", 1)
    old = encode_batch([MessageRecord(b"old", timestamp_ms=T0 - 5_000)])
    store.append("t", 0, old)  # offset 0, stored at T0, written "5 s ago"
    clock.ms += 1_000
    records = [MessageRecord(b"m%d" % i, timestamp_ms=T0 + 100 * i) for i in range(5)]
    store.append("t", 0, encode_batch(records))  # offsets 1-5 at T0 + 1 s, stamped T0..T0+400
    store.flush()  # (with flush_mode sync, what is not flushed is not readable yet)
    assert store.offset_for_time("t", 0, T0 - 5_000) == 0
    assert store.offset_for_time("t", 0, T0 - 4_999) == 1  # the old one is older
    assert store.offset_for_time("t", 0, T0 + 250) == 4  # inside the second batch
    assert store.offset_for_time("t", 0, T0 + 400) == 5
    assert store.offset_for_time("t", 0, T0 + 401) == 6  # none: the next offset
    store.close()


def test_store_times_never_go_backwards(config: StoreConfig) -> None:
    clock = FakeClock()
    store = _open(config, clock)
    store.create_topic("t", 1)
    first = store.append("t", 0, _values(b"a"))
    clock.ms -= 5_000  # the wall clock steps back
    second = store.append("t", 0, _values(b"b"))
    assert second.store_time_ms == first.store_time_ms == T0
    store.close()
    store = _open(config, clock)  # still true after a restart
    assert store.append("t", 0, _values(b"c")).store_time_ms == T0
    store.close()


def test_tag_mask_skips_batches_without_the_tag(store: MessageStore) -> None:
    assert tag_bit("red") != tag_bit("blue")

    def batch(*tags: str | None) -> bytes:
        return encode_batch([MessageRecord(b"v", tag=t, timestamp_ms=T0) for t in tags])

    store.append("orders", 0, batch("red"))  # 0
    store.append("orders", 0, batch("blue", "blue"))  # 1-2
    store.append("orders", 0, batch(None))  # 3
    store.append("orders", 0, batch("red", "blue"))  # 4-5
    store.append("orders", 0, batch("red"))  # 6
    store.flush()
    got = store.read("orders", 0, 0, max_bytes=1 << 20, tag_mask=tag_bit("blue"))
    assert got.status is ReadStatus.FOUND
    assert [b.base_offset for b in got.batches] == [1, 4]
    assert got.next_offset == 7  # past the skipped batches too
    none = store.read("orders", 0, 6, max_bytes=1 << 20, tag_mask=tag_bit("blue"))
    assert none.status is ReadStatus.NO_NEW_MESSAGE
    assert none.next_offset == 7


def test_read_returns_whole_batches_within_max_bytes(store: MessageStore) -> None:
    results = [store.append("orders", 0, _values(b"x" * 100)) for _ in range(5)]
    store.flush()
    size = results[1].end_position - results[0].end_position
    got = store.read("orders", 0, 0, max_bytes=2 * size)
    assert [b.base_offset for b in got.batches] == [0, 1]
    assert got.next_offset == 2
    one = store.read("orders", 0, 2, max_bytes=1)  # always at least one batch
    assert [b.base_offset for b in one.batches] == [2]
    assert one.next_offset == 3
    out = store.read("orders", 0, 6, max_bytes=1024)
    assert (out.status, out.min_offset, out.max_offset) == (ReadStatus.OFFSET_OUT_OF_RANGE, 0, 5)
    end = store.read("orders", 0, 5, max_bytes=1024)
    assert (end.status, end.next_offset) == (ReadStatus.NO_NEW_MESSAGE, 5)


def test_sync_mode_hides_unflushed_records(config: StoreConfig) -> None:
    store = _open(config)  # the default flush mode
    assert store.config.flush_mode is FlushMode.SYNC
    store.create_topic("t", 1)
    result = store.append("t", 0, _values(b"a"))
    assert store.flushed_position < result.end_position
    hidden = store.read("t", 0, 0, max_bytes=1024)
    assert (hidden.status, hidden.batches, hidden.next_offset) == (
        ReadStatus.NO_NEW_MESSAGE,
        [],
        0,
    )
    assert store.flush() >= result.end_position
    shown = store.read("t", 0, 0, max_bytes=1024)
    assert [b.base_offset for b in shown.batches] == [0]
    # A batch appended after the flush is hidden again, behind the visible one.
    store.append("t", 0, _values(b"b"))
    assert [b.base_offset for b in store.read("t", 0, 0, max_bytes=1 << 20).batches] == [0]
    store.close()


def test_async_mode_shows_unflushed_records(tmp_path: Path) -> None:
    store = _open(_config(tmp_path, flush_mode=FlushMode.ASYNC))
    store.create_topic("t", 1)
    result = store.append("t", 0, _values(b"a"))
    assert store.flushed_position < result.end_position
    got = store.read("t", 0, 0, max_bytes=1024)
    assert [b.base_offset for b in got.batches] == [0]
    store.close()


# ---------------------------------------------------------------------------- recovery


def _fill(store: MessageStore, batches: int = 12) -> list[AppendResult]:
    """Appends spread over two queues and several segments, some idempotent."""
    pid = store.allocate_producer_id()
    results = []
    for i in range(batches):
        queue = i % 2
        values = [bytes([65 + i]) * (40 + 10 * i)] * (1 + i % 3)
        stamp = ProducerStamp(pid, 0, sum(1 + j % 3 for j in range(queue, i, 2)))
        results.append(store.append("orders", queue, _values(*values), producer=stamp))
    return results


@pytest.mark.parametrize("clean", [True, False], ids=["closed", "crashed"])
@pytest.mark.parametrize("tail", ["zeros", "garbage", "partial_record", "header_only"])
def test_torn_tail_is_truncated_on_reopen(config: StoreConfig, tail: str, clean: bool) -> None:
    store = _open(config)
    store.create_topic("orders", 2)
    _fill(store)
    store.flush()
    before = _snapshot(store)
    end = store.end_position
    last_record = _read_all(store, "orders", 1)[-1][1]
    if clean:
        store.close()
    else:
        _crash(store)
    torn = {
        "zeros": bytes(300),
        "garbage": bytes(range(256)) * 2,
        "partial_record": last_record[: len(last_record) // 2],
        "header_only": last_record[:64],
    }[tail]
    segment = _segments(config)[-1]
    with segment.open("ab") as f:
        f.write(torn)

    store = _open(config)
    assert store.end_position == end
    assert segment.stat().st_size == end - int(segment.stem)
    assert _snapshot(store) == before
    nxt = store.append("orders", 1, _values(b"after"))
    assert nxt.base_offset == before[("orders", 1)][0][1]  # type: ignore[index]
    store.close()
    store = _open(config)
    assert _read_all(store, "orders", 1)[-1][0] == nxt.base_offset
    store.close()


@pytest.mark.parametrize("damage", ["missing", "corrupt", "empty"])
def test_damaged_checkpoint_replays_the_whole_log(config: StoreConfig, damage: str) -> None:
    store = _open(config)
    store.create_topic("orders", 2)
    store.create_topic("other", 1, retention_bytes=600)
    results = _fill(store)
    for i in range(8):
        store.append("other", 0, _values(b"o" * (100 + i)))
    store.checkpoint()
    assert store.enforce_retention() == 0  # "orders" still needs the first segment
    before = _snapshot(store)
    store.close()
    checkpoint = config.data_dir / "checkpoint"
    if damage == "missing":
        checkpoint.unlink()
    elif damage == "corrupt":
        raw = bytearray(checkpoint.read_bytes())
        raw[10] ^= 0xFF
        checkpoint.write_bytes(bytes(raw))
    else:
        checkpoint.write_bytes(b"")

    store = _open(config)
    assert _snapshot(store) == before
    # Producer state survives too: a retry of the last batch is answered, not re-written.
    last = results[-1]
    pid = store.allocate_producer_id() - 1
    retry = store.append(
        "orders",
        1,
        _read_and_payload(store, "orders", 1, last.base_offset),
        producer=ProducerStamp(pid, 0, sum(1 + j % 3 for j in range(1, 11, 2))),
    )
    assert (retry.duplicate, retry.base_offset) == (True, last.base_offset)
    store.close()


def _read_and_payload(store: MessageStore, topic: str, queue: int, offset: int) -> bytes:
    got = store.read(topic, queue, offset, max_bytes=1)
    return _payload(got.batches[0].record)


@pytest.mark.parametrize(
    "damage", ["delete_last", "delete_all", "drop_last_entry", "torn_last_entry", "empty_last"]
)
def test_damaged_index_file_is_rebuilt_on_reopen(config: StoreConfig, damage: str) -> None:
    store = _open(config)
    store.create_topic("orders", 2)
    for _ in range(3):
        _fill(store, 6)
    store.flush()
    before = _snapshot(store)
    next_offset = store.queue_bounds("orders", 0)[1]
    store.close()
    files = sorted(next((config.data_dir / "queues").glob("*-orders")).joinpath("0").iterdir())
    assert len(files) > 1
    if damage == "delete_last":
        files[-1].unlink()
    elif damage == "delete_all":
        for f in files:
            f.unlink()
    elif damage == "drop_last_entry":
        os.truncate(files[-1], files[-1].stat().st_size - 40)
    elif damage == "torn_last_entry":
        os.truncate(files[-1], files[-1].stat().st_size - 7)
    else:
        os.truncate(files[-1], 0)

    store = _open(config)
    assert _snapshot(store) == before
    assert store.append("orders", 0, _values(b"next")).base_offset == next_offset
    store.close()
    store = _open(config)
    assert store.queue_bounds("orders", 0) == (0, next_offset + 1)
    store.close()


def test_lost_index_is_rebuilt_from_what_retention_left(tmp_path: Path) -> None:
    config = _config(tmp_path)
    store = _open(config)
    store.create_topic("gone", 1, retention_bytes=0)  # every batch expires
    store.create_topic("kept", 1, retention_bytes=1500)  # the newest few batches stay
    for i in range(10):
        store.append("gone", 0, _values(bytes([i]) * 400))
    for i in range(20):
        store.append("kept", 0, _values(bytes([i]) * 400))
    store.checkpoint()
    assert store.enforce_retention() > 0
    assert store.queue_bounds("gone", 0) == (10, 10)
    low, high = store.queue_bounds("kept", 0)
    assert 0 < low < high == 20
    before = _snapshot(store)
    store.close()
    for topic in ("gone", "kept"):
        for f in next((config.data_dir / "queues").glob(f"*-{topic}")).joinpath("0").iterdir():
            f.unlink()

    store = _open(config)
    assert _snapshot(store) == before
    assert store.append("gone", 0, _values(b"n")).base_offset == 10
    assert store.append("kept", 0, _values(b"n")).base_offset == 20
    store.close()


def test_records_recovered_after_kill9_survive_a_later_power_loss(tmp_path: Path) -> None:
    """Recovery calls the whole recovered log flushed and checkpoints it, so it must sync
    it first: after kill -9 the unflushed tail was only in the page cache."""
    config, meta, fs, store = _open_on_fault_fs(tmp_path, segment_size_bytes=4096)
    store.create_topic("t", 1)
    store.append("t", 0, _values(b"a"))
    store.checkpoint()
    store.append("t", 0, _values(b"b"))  # never flushed
    _crash(store)
    fs = fs.crash_process()
    store = MessageStore.open(config, fs=fs, clock=FakeClock(), metadata_path=meta)
    assert store.queue_bounds("t", 0) == (0, 2)
    store.close()
    fs = fs.crash(random.Random(0), "lose")  # only what was synced survives
    store = MessageStore.open(config, fs=fs, clock=FakeClock(), metadata_path=meta)
    assert store.queue_bounds("t", 0) == (0, 2)
    assert [o for o, _ in _read_all(store, "t", 0)] == [0, 1]
    store.close()


def test_retention_runs_again_on_a_queue_it_emptied(tmp_path: Path) -> None:
    store = _open(_config(tmp_path))
    store.create_topic("t", 1, retention_bytes=0)
    store.append("t", 0, _values(b"x"))
    store.append("t", 0, _values(b"y", b"z"))
    store.enforce_retention()
    assert store.queue_bounds("t", 0) == (3, 3)
    store.enforce_retention()  # entries below the min offset are still in the index file
    assert store.queue_bounds("t", 0) == (3, 3)
    assert store.append("t", 0, _values(b"w")).base_offset == 3
    store.close()


def test_crash_after_retention_keeps_the_min_offset(config: StoreConfig) -> None:
    """Retention of records appended after the last checkpoint, then kill -9: the replay
    re-derives the records, and the saved min offset still applies to them."""
    clock = FakeClock()
    store = _open(config, clock)
    store.create_topic("t", 1, retention_ms=500)
    store.checkpoint()
    store.append("t", 0, _values(b"old", b"old"))
    clock.ms += 1000
    store.append("t", 0, _values(b"new"))
    store.enforce_retention()
    assert store.queue_bounds("t", 0) == (2, 3)
    _crash(store)
    store = _open(config, clock)
    assert store.queue_bounds("t", 0) == (2, 3)
    assert store.read("t", 0, 0, max_bytes=1024).status is ReadStatus.OFFSET_OUT_OF_RANGE
    store.close()


def test_crash_after_retention_deleted_index_files(config: StoreConfig) -> None:
    """Retention deletes whole index files below the min offset, even ones whose entries
    were never checkpointed; recovery then meets records whose index file is gone."""
    store = _open(config)  # four entries per index file
    store.create_topic("t", 1, retention_bytes=0)
    store.create_topic("u", 1)
    for _ in range(10):
        store.append("t", 0, _values(b"x"))
        store.append("u", 0, _values(b"y"))
    store.enforce_retention()
    assert store.queue_bounds("t", 0) == (10, 10)
    _crash(store)
    store = _open(config)
    assert store.queue_bounds("t", 0) == (10, 10)
    assert store.queue_bounds("u", 0) == (0, 10)
    assert store.append("t", 0, _values(b"z")).base_offset == 10
    store.close()


def test_retention_deletes_segments_only_after_checkpoint(tmp_path: Path) -> None:
    config = _config(tmp_path, retention_bytes=1500)
    store = _open(config)
    store.create_topic("t", 1)
    for i in range(20):
        store.append("t", 0, _values(bytes([i]) * 400))
    segments = _segments(config)
    assert len(segments) >= 3
    assert store.enforce_retention() == 0  # nothing checkpointed since the open
    low, high = store.queue_bounds("t", 0)
    assert 0 < low < high == 20  # the offsets are gone already, the files not yet
    assert _segments(config) == segments
    assert store.read("t", 0, low - 1, max_bytes=1024).status is ReadStatus.OFFSET_OUT_OF_RANGE

    store.checkpoint()
    deleted = store.enforce_retention()
    assert deleted > 0
    assert len(_segments(config)) == len(segments) - deleted
    assert store.queue_bounds("t", 0) == (low, high)
    assert [o for o, _ in _read_all(store, "t", 0)] == list(range(low, high))
    store.close()
    store = _open(config)
    assert store.queue_bounds("t", 0) == (low, high)
    assert store.read("t", 0, 0, max_bytes=1024).status is ReadStatus.OFFSET_OUT_OF_RANGE
    assert [o for o, _ in _read_all(store, "t", 0)] == list(range(low, high))
    store.close()


def test_time_retention_keeps_batches_newer_than_the_window(tmp_path: Path) -> None:
    clock = FakeClock()
    store = _open(_config(tmp_path), clock)
    store.create_topic("t", 1, retention_ms=1000)
    for _ in range(6):
        store.append("t", 0, _values(b"x" * 300))
        clock.ms += 400
    # Stored at T0, +400, ..., +2000; now is T0 + 2400: keep those at or after T0 + 1400.
    store.enforce_retention()
    assert store.queue_bounds("t", 0) == (4, 6)
    store.close()


# ---------------------------------------------------------------------------- disk faults


def test_disk_full_above_watermark_then_appends_resume(config: StoreConfig) -> None:
    fs = _FaultyFs()
    config = _config(config.data_dir.parent, disk_check_interval_bytes=1, disk_reject_ratio=0.9)
    store = _open(config, fs=fs)
    store.create_topic("t", 1)
    store.append("t", 0, _values(b"a"))
    end = store.end_position
    fs.usage = (1000, 50)  # 95% used, above the default 90%
    with pytest.raises(DiskFull):
        store.append("t", 0, _values(b"b"))
    with pytest.raises(DiskFull):
        store.append("t", 0, _values(b"b"))
    assert store.end_position == end
    assert store.queue_bounds("t", 0) == (0, 1)
    fs.usage = (1000, 500)
    assert store.append("t", 0, _values(b"b")).base_offset == 1
    store.close()


def test_enospc_during_write_raises_disk_full_and_leaves_log_consistent(
    config: StoreConfig,
) -> None:
    fs = _FaultyFs()
    store = _open(config, fs=fs)
    store.create_topic("t", 1)
    pid = store.allocate_producer_id()
    store.append("t", 0, _values(b"a"), producer=ProducerStamp(pid, 0, 0))
    end = store.end_position
    fs.enospc = True
    with pytest.raises(DiskFull):
        store.append("t", 0, _values(b"b" * 200), producer=ProducerStamp(pid, 0, 1))
    assert store.end_position == end
    assert _segments(config)[-1].stat().st_size == end  # the short write was cut back
    assert store.queue_bounds("t", 0) == (0, 1)
    fs.enospc = False
    # The failed batch was not remembered: its retry is new, not a duplicate.
    again = store.append("t", 0, _values(b"b" * 200), producer=ProducerStamp(pid, 0, 1))
    assert (again.base_offset, again.duplicate) == (1, False)
    store.flush()
    assert [o for o, _ in _read_all(store, "t", 0)] == [0, 1]
    store.close()
    store = _open(config)
    assert [o for o, _ in _read_all(store, "t", 0)] == [0, 1]
    store.close()


def test_fsync_failure_fences_the_store(config: StoreConfig) -> None:
    fs = _FaultyFs()
    store = _open(config, fs=fs)
    store.create_topic("t", 1)
    store.append("t", 0, _values(b"a"))
    fs.eio = True
    with pytest.raises(StorageFailure):
        store.flush()
    fs.eio = False  # even if the disk comes back, nothing more is accepted
    with pytest.raises(StorageFailure):
        store.append("t", 0, _values(b"b"))
    with pytest.raises(StorageFailure):
        store.flush()
    with pytest.raises(StorageFailure):
        store.checkpoint()
    assert store.queue_bounds("t", 0) == (0, 1)
    store.close()  # does not raise: recovery will replay instead
    store = _open(config, fs=fs)  # reopening is the way out
    assert [o for o, _ in _read_all(store, "t", 0)] == [0]
    assert store.append("t", 0, _values(b"c")).base_offset == 1
    store.close()


def _index_files(fs: FaultFileSystem, data_dir: Path) -> dict[str, int]:
    """Size of every queue index file under `data_dir`, by 'topic/queue/file'."""
    out: dict[str, int] = {}
    queues = data_dir / "queues"
    for topic in fs.listdir(queues):
        for queue in fs.listdir(queues / topic):
            for name in fs.listdir(queues / topic / queue):
                out[f"{topic}/{queue}/{name}"] = len(fs.read_bytes(queues / topic / queue / name))
    return out


def test_a_checkpoint_over_many_queues_makes_every_index_durable(tmp_path: Path) -> None:
    """The checkpoint writes the index files of all touched queues, then syncs them
    together (`sync_files`): after a power loss each file still holds its entries."""
    config, meta, fs, store = _open_on_fault_fs(tmp_path)
    store.create_topic("wide", 40)
    for q in range(40):
        for _ in range(q % 3 + 1):
            store.append("wide", q, _values(b"v%d" % q))
    store.checkpoint()
    written = _index_files(fs, config.data_dir)
    assert sorted(written.values()) == sorted([40 * (q % 3 + 1) for q in range(40)])
    _crash(store)
    fs = fs.crash(random.Random(1), "lose")  # only what was synced survives
    assert _index_files(fs, config.data_dir) == written
    store = MessageStore.open(config, fs=fs, clock=FakeClock(), metadata_path=meta)
    assert [store.queue_bounds("wide", q) for q in range(40)] == [(0, q % 3 + 1) for q in range(40)]
    store.close()


def test_a_failed_index_sync_fences_the_store(tmp_path: Path) -> None:
    """As a failed log fdatasync: the entries are with the kernel, which may have dropped
    them, so the store refuses more work; a reopen re-derives the indexes from the log."""
    config, meta, fs, store = _open_on_fault_fs(tmp_path)
    store.create_topic("wide", 10)
    for q in range(10):
        store.append("wide", q, _values(b"a", b"b"))
    (info,) = store.topics()
    fs.fail_sync(path=queue_dir(config.data_dir, info, 6) / f"{0:020d}.idx")
    with pytest.raises(StorageFailure, match="fdatasync failed"):
        store.checkpoint()
    with pytest.raises(StorageFailure):
        store.append("wide", 0, _values(b"c"))
    with pytest.raises(StorageFailure):
        store.checkpoint()
    store.close()
    fs = fs.crash(random.Random(2), "lose")
    store = MessageStore.open(config, fs=fs, clock=FakeClock(), metadata_path=meta)
    assert [store.queue_bounds("wide", q) for q in range(10)] == [(0, 2)] * 10
    assert store.append("wide", 6, _values(b"c")).base_offset == 2
    store.close()


@pytest.mark.parametrize("count", [1, SYNCFS_MIN_FILES])
def test_os_sync_files_syncs_real_files_and_names_a_missing_one(tmp_path: Path, count: int) -> None:
    """Both ways of `OsFileSystem.sync_files` (one fdatasync per file; one syncfs) run on
    real files, and a file that is not there is an error, not a silent success."""
    fs = OsFileSystem()
    paths = [tmp_path / f"f{i}" for i in range(count)]
    for path in paths:
        handle = fs.open(path, create=True)
        handle.append([b"x" * 100])
        handle.close()
    fs.sync_files(paths)
    fs.sync_files([])
    with pytest.raises(FileNotFoundError):
        fs.sync_files([*paths, tmp_path / "missing"])


def test_an_index_append_cut_short_by_a_full_disk_leaves_no_partial_entry(
    tmp_path: Path,
) -> None:
    """ENOSPC after part of an index entry was written: the part is taken back out, so
    the next checkpoint's entries land where they belong and a reopened store reads the
    queue whole (before, the retry appended after the partial bytes)."""
    config, meta, fs, store = _open_on_fault_fs(tmp_path)
    store.create_topic("t", 1)
    for value in (b"a", b"b", b"c"):
        store.append("t", 0, _values(value))
    (info,) = store.topics()
    index = queue_dir(config.data_dir, info, 0) / f"{0:020d}.idx"
    fs.fail_append(path=index, written=17)
    with pytest.raises((DiskFull, OSError)):
        store.checkpoint()
    store.checkpoint()  # space again: the same entries are written, once
    handle = fs.open(index)
    assert handle.size() == 3 * INDEX_ENTRY.size  # no partial entry in front of them
    handle.close()
    store.close()
    store = MessageStore.open(config, fs=fs, clock=FakeClock(), metadata_path=meta)
    assert [base for base, _ in _read_all(store, "t", 0)] == [0, 1, 2]
    store.append("t", 0, _values(b"d"))
    assert store.queue_bounds("t", 0) == (0, 4)
    store.close()


def test_a_batch_with_a_tag_no_subscription_can_match_is_refused(store: MessageStore) -> None:
    """The client's encoder refuses such tags; a producer that skips it (another
    language, a raw request) is refused by the store, with a valid CRC and all."""
    import crc32c  # noqa: PLC0415 - only this test re-checksums a payload

    good = encode_batch([MessageRecord(b"v", tag="aXYZ")])
    bad = bytearray(good.replace(b"aXYZ", b"a||Z"))
    crc = crc32c.crc32c(bytes(bad[8:]), crc32c.crc32c(bytes(bad[:4])))
    bad[4:8] = crc.to_bytes(4, "little")
    store.create_topic("t", 1)
    with pytest.raises(InvalidBatch, match=r"^tag 'a\|\|Z'"):
        store.append("t", 0, bytes(bad))
    assert store.append("t", 0, good).base_offset == 0
