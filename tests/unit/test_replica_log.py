"""Log replication at the store: a follower that copies its leader's records by position
ends with the same log, the same queues, the same key index and the same idempotence
window, and keeps them across a restart; records that do not continue its log are
refused with nothing written. Seeded workloads (the seed is in the test id) over real
files."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tidemq.core.batch import MessageRecord, encode_batch
from tidemq.core.errors import CorruptRecordError, OffsetOutOfRange
from tidemq.store.config import StoreConfig
from tidemq.store.message_store import MessageStore, ReadStatus
from tidemq.store.metadata import CleanupPolicy
from tidemq.store.producer_state import ProducerStamp
from tidemq.store.replica_log import LogChunk, LogDiverged, TopicsBehind
from tidemq.testing.clock import ManualClock

T0 = 1_700_000_000_000


def _config(root: Path, name: str) -> StoreConfig:
    return StoreConfig(
        data_dir=root / name,
        segment_size_bytes=8192,  # many segments: chunks stop at their ends
        index_entries_per_file=4,
        retention_ms=-1,
        disk_reject_ratio=1.0,  # the real disk may be fuller than the default allows
    )


def _open(root: Path, name: str, clock: ManualClock) -> MessageStore:
    return MessageStore.open(_config(root, name), clock=clock)


def _batch(rng: random.Random, *, keyed: bool) -> bytes:
    n = rng.randint(1, 6)
    return encode_batch(
        [
            MessageRecord(
                rng.randbytes(rng.randint(0, 700)),
                key=f"k{rng.randint(0, 9)}".encode() if keyed or rng.random() < 0.5 else None,
                tag=rng.choice([None, "a", "b"]),
                timestamp_ms=T0,
            )
            for _ in range(n)
        ]
    )


def _catch_up(leader: MessageStore, follower: MessageStore, rng: random.Random) -> int:
    """Copy the leader's log to the follower in chunks of random sizes, mirroring the
    leader's topics when a record needs it; returns the number of chunks."""
    chunks = 0
    while True:
        chunk = leader.replica.read_chunk(
            follower.end_position,
            rng.choice([1, 300, 4096, 1 << 20]),
            limit=leader.end_position,
        )
        if not chunk.data:
            return chunks
        try:
            follower.replica.append_chunk(chunk)
        except TopicsBehind:
            follower.replica.mirror_topics(leader.topics(), leader.metadata.max_topic_id())
        chunks += 1


def _everything(store: MessageStore) -> dict[tuple[str, int], object]:
    """What a reader sees: every queue's bounds and records (once flushed)."""
    store.flush()
    out: dict[tuple[str, int], object] = {}
    for info in store.topics():
        for q in range(info.queues):
            lo, hi = store.queue_bounds(info.name, q)
            records, offset = [], lo
            while offset < hi:
                got = store.read(info.name, q, offset, max_bytes=1 << 20)
                assert got.status is ReadStatus.FOUND
                records += [(b.base_offset, b.record) for b in got.batches]
                offset = got.next_offset
            out[(info.name, q)] = (lo, hi, records)
    return out


def _keyed(store: MessageStore, topic: str) -> list[tuple[object, ...]]:
    found = store.find_by_key(topic, b"k3", start_ms=0, end_ms=2 * T0, limit=1000)
    return [(r.queue, r.record[:64], *r.indexes) for r in found.records]


def _log_bytes(store: MessageStore) -> bytes:
    chunk = store.replica.read_chunk(store.log.start_position, 1, limit=store.end_position)
    parts = [chunk.data]
    while chunk.data:
        chunk = store.replica.read_chunk(chunk.end, 1 << 30, limit=store.end_position)
        parts.append(chunk.data)
    return b"".join(parts)


def _workload(leader: MessageStore, follower: MessageStore, seed: int) -> None:
    """Topics created, altered and deleted, keyed and stamped batches, the follower
    catching up at random moments."""
    rng = random.Random(seed)
    clock = leader.clock
    assert isinstance(clock, ManualClock)
    sequences: dict[tuple[int, str, int], int] = {}
    producers = [leader.allocate_producer_id() for _ in range(3)]
    for step in range(300):
        clock.advance(rng.randint(0, 50))
        topics = [t for t in leader.topics() if not t.name.startswith("%")]
        roll = rng.random()
        if roll < 0.04 or not topics:
            compact = rng.random() < 0.3
            leader.create_topic(
                f"t{step}",
                rng.randint(1, 3),
                cleanup_policy=CleanupPolicy.COMPACT if compact else CleanupPolicy.DELETE,
            )
        elif roll < 0.06:
            leader.delete_topic(rng.choice(topics).name)
        elif roll < 0.08:
            info = rng.choice(topics)
            leader.alter_topic(info.name, queues=min(info.queues + 1, 8))
        else:
            info = rng.choice(topics)
            q = rng.randrange(info.queues)
            payload = _batch(rng, keyed=info.cleanup_policy is not CleanupPolicy.DELETE)
            stamp = None
            if rng.random() < 0.5:
                pid = rng.choice(producers)
                seq = sequences.get((pid, info.name, q), 0)
                stamp = ProducerStamp(pid, 0, seq)
            result = leader.append(info.name, q, payload, producer=stamp)
            if stamp is not None:
                sequences[(stamp.producer_id, info.name, q)] = seq + result.count
        if rng.random() < 0.1:
            _catch_up(leader, follower, rng)
    _catch_up(leader, follower, rng)
    follower.replica.mirror_topics(leader.topics(), leader.metadata.max_topic_id())


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5])
def test_a_follower_copying_by_position_ends_with_the_same_log_and_queues(
    tmp_path: Path, seed: int
) -> None:
    clock = ManualClock(T0)
    leader, follower = _open(tmp_path, "leader", clock), _open(tmp_path, "follower", clock)
    try:
        _workload(leader, follower, seed)
        assert follower.end_position == leader.end_position
        assert _log_bytes(follower) == _log_bytes(leader)
        assert [t.name for t in follower.topics()] == [t.name for t in leader.topics()]
        assert follower.topics() == leader.topics()
        seen = _everything(leader)
        assert _everything(follower) == seen
        for info in leader.topics():  # the key index holds the same keys
            assert _keyed(follower, info.name) == _keyed(leader, info.name)
        follower.close()
        follower = _open(tmp_path, "follower", clock)  # recovery derives the same
        assert _everything(follower) == seen
    finally:
        leader.close()
        follower.close()


def test_the_follower_dedupes_retries_and_issues_new_ids_above_the_leaders(
    tmp_path: Path,
) -> None:
    """After taking over, the follower knows a producer's last batches (a retry gets its
    first offsets back, nothing written) and never hands out an id the leader gave."""
    clock = ManualClock(T0)
    leader, follower = _open(tmp_path, "leader", clock), _open(tmp_path, "follower", clock)
    try:
        leader.create_topic("t", 1)
        pid = leader.allocate_producer_id()
        rng = random.Random(9)
        payload = _batch(rng, keyed=False)
        first = leader.append("t", 0, payload, producer=ProducerStamp(pid, 0, 0))
        _catch_up(leader, follower, rng)
        again = follower.append("t", 0, payload, producer=ProducerStamp(pid, 0, 0))
        assert again.duplicate
        assert again.base_offset == first.base_offset
        assert follower.end_position == leader.end_position  # nothing written
        assert follower.allocate_producer_id() > pid
        assert follower.create_topic("new", 1).id > leader.metadata.max_topic_id()
    finally:
        leader.close()
        follower.close()


def test_records_that_do_not_continue_the_log_are_refused_with_nothing_written(
    tmp_path: Path,
) -> None:
    clock = ManualClock(T0)
    leader, follower = _open(tmp_path, "leader", clock), _open(tmp_path, "follower", clock)
    try:
        leader.create_topic("t", 1)
        follower.replica.mirror_topics(leader.topics(), leader.metadata.max_topic_id())
        rng = random.Random(3)
        for _ in range(3):
            leader.append("t", 0, _batch(rng, keyed=False))
        chunk = leader.replica.read_chunk(0, 1 << 20, limit=leader.end_position)
        assert chunk.records == 3
        second = chunk.data[int.from_bytes(chunk.data[:4], "little") :]
        with pytest.raises(LogDiverged, match="do not continue this log, which ends at 0"):
            follower.replica.append_chunk(LogChunk(chunk.end - len(second), second, 2))
        with pytest.raises(LogDiverged, match="continues at 0 here"):
            follower.replica.append_chunk(LogChunk(0, second, 2))
        flipped = bytearray(chunk.data)
        flipped[len(flipped) - 5] ^= 1
        with pytest.raises(CorruptRecordError):
            follower.replica.append_chunk(LogChunk(0, bytes(flipped), 3))
        assert follower.end_position == 0
        with pytest.raises(LogDiverged, match="not a record boundary"):
            leader.replica.read_chunk(8, 1 << 20, limit=leader.end_position)
        with pytest.raises(LogDiverged, match="past this log's end"):
            leader.replica.read_chunk(leader.end_position + 1, 1, limit=1 << 40)
        assert follower.replica.append_chunk(chunk) == leader.end_position
    finally:
        leader.close()
        follower.close()


def test_a_chunk_holds_whole_records_and_at_least_one(tmp_path: Path) -> None:
    clock = ManualClock(T0)
    leader = _open(tmp_path, "leader", clock)
    try:
        leader.create_topic("t", 1)
        rng = random.Random(4)
        ends = [leader.append("t", 0, _batch(rng, keyed=False)) for _ in range(4)]
        first = leader.replica.read_chunk(0, 1, limit=leader.end_position)
        assert first.records == 1
        assert first.end == ends[0].end_position
        up_to_second = leader.replica.read_chunk(0, first.end + 1, limit=leader.end_position)
        assert up_to_second.records == 1  # the second does not fit whole
        limited = leader.replica.read_chunk(0, 1 << 20, limit=first.end)
        assert limited.records == 1
        assert leader.replica.read_chunk(leader.end_position, 1 << 20, limit=1 << 40).data == b""
        with pytest.raises(OffsetOutOfRange):
            leader.replica.read_chunk(-1, 1, limit=1)
    finally:
        leader.close()


@pytest.mark.parametrize("seed", [11, 12, 13])
def test_a_diverged_suffix_is_cut_and_the_leaders_records_take_its_place(
    tmp_path: Path, seed: int
) -> None:
    """A member that wrote records the group never committed (a deposed leader) cuts
    them at the common point, copies the new leader's records, and ends equal to it,
    also after a restart; the cut batches' producer sequences are forgotten."""
    rng = random.Random(seed)
    clock = ManualClock(T0)
    leader, old = _open(tmp_path, "leader", clock), _open(tmp_path, "old", clock)
    try:
        leader.create_topic("t", 3)
        pid = leader.allocate_producer_id()
        seqs = [0, 0, 0]  # sequences count messages per queue
        for i in range(20):
            got = leader.append(
                "t", i % 3, _batch(rng, keyed=True), producer=ProducerStamp(pid, 0, seqs[i % 3])
            )
            seqs[i % 3] += got.count
        _catch_up(leader, old, rng)
        common = old.end_position
        # The old leader's suffix: the same producer's next batch, and more.
        old.append("t", 0, _batch(rng, keyed=True), producer=ProducerStamp(pid, 0, seqs[0]))
        for _ in range(rng.randint(5, 40)):  # sometimes past an index file or a segment
            old.append("t", rng.randrange(3), _batch(rng, keyed=True))
        old.checkpoint()
        # The new leader's own records from the same point.
        for _ in range(rng.randint(1, 30)):
            leader.append("t", rng.randrange(3), _batch(rng, keyed=True))
        with pytest.raises(LogDiverged):
            old.replica.append_chunk(
                leader.replica.read_chunk(common, 1 << 20, limit=leader.end_position)
            )
        old.replica.truncate(common)
        assert old.end_position == common
        _catch_up(leader, old, rng)
        assert _log_bytes(old) == _log_bytes(leader)
        seen = _everything(leader)
        assert _everything(old) == seen
        # The cut batch is unknown again: the producer's retry of it is new.
        retry = old.append("t", 0, _batch(rng, keyed=True), producer=ProducerStamp(pid, 0, seqs[0]))
        assert not retry.duplicate
        old.close()
        old = _open(tmp_path, "old", clock)
        assert old.queue_bounds("t", 0)[1] == leader.queue_bounds("t", 0)[1] + retry.count
    finally:
        leader.close()
        old.close()


@pytest.mark.parametrize("restart", [False, True])
def test_a_cut_suffix_newer_than_the_leaders_records_does_not_block_the_copy(
    tmp_path: Path, restart: bool
) -> None:
    """The suffix a deposed leader cut was written after the new leader's first records
    (it appended once resumed from a pause, or its clock runs ahead): its store times
    leave with it. They stayed as the log's newest, and every record copied from the new
    leader, older by the clock, was refused ("store time ... is before this log's last"),
    so the member never caught up again, not even after a restart."""
    rng = random.Random(7)
    clock = ManualClock(T0)
    leader, old = _open(tmp_path, "leader", clock), _open(tmp_path, "old", clock)
    try:
        leader.create_topic("t", 2)
        for i in range(6):
            leader.append("t", i % 2, _batch(rng, keyed=False))
        _catch_up(leader, old, rng)
        common = old.end_position
        clock.advance(10)
        for i in range(4):  # the new leader's records, at T0 + 10
            leader.append("t", i % 2, _batch(rng, keyed=False))
        clock.advance(5_000)
        for i in range(3):  # the old leader's, later, never committed
            old.append("t", i % 2, _batch(rng, keyed=False))
        old.replica.truncate(common)
        if restart:
            old.close()
            old = _open(tmp_path, "old", clock)
        _catch_up(leader, old, rng)
        assert _log_bytes(old) == _log_bytes(leader)
        assert _everything(old) == _everything(leader)
    finally:
        leader.close()
        old.close()
