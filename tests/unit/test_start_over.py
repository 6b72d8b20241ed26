"""A replica starting over at its leader's log start (`store/start_over.py`): after the
leader's retention deleted its first segments, a follower that copies the leader's
compacted log files and starts its store over at the log start then copies the rest by
position and reads what the leader reads; a start-over interrupted at any step (the
marker file standing) is wiped at the next open, never served half done, and the next
start-over completes."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from tidemq.core.batch import MessageRecord, encode_batch
from tidemq.core.errors import OffsetOutOfRange
from tidemq.store.config import StoreConfig
from tidemq.store.epoch_file import EPOCH_FILE, EpochEntry, EpochHistory
from tidemq.store.files import OsFileSystem
from tidemq.store.message_store import MessageStore, ReadStatus
from tidemq.store.metadata import CleanupPolicy
from tidemq.store.producer_state import ProducerStamp
from tidemq.store.replica_log import LogChunk, TopicsBehind
from tidemq.store.start_over import (
    MARKER,
    STAGING,
    StartOverPlan,
    check_staged,
    mark_for_start_over,
    plan_start_over,
    read_compacted_file,
    staging_path,
    start_over,
)
from tidemq.testing.clock import ManualClock

T0 = 1_700_000_000_000
#: The steps of a start-over, in order (`start_over`'s `step` names).
STEPS = ("marker", "wipe", "log", "queues", "compacted", "checkpoint", "epochs", "done")
#: Bytes of a compacted file copied per read, as REPLICA_FILE chunks would be.
CHUNK_BYTES = 1000


class Crash(Exception):
    """The process dies here (the test's stand-in for kill -9: nothing after it runs)."""


def _config(root: Path, name: str) -> StoreConfig:
    return StoreConfig(
        data_dir=root / name,
        segment_size_bytes=4096,
        index_entries_per_file=4,
        retention_ms=-1,
        disk_reject_ratio=1.0,
    )


def _batch(rng: random.Random, key: str | None) -> bytes:
    return encode_batch(
        [
            MessageRecord(
                rng.randbytes(rng.randint(50, 400)), key=None if key is None else key.encode()
            )
            for _ in range(rng.randint(1, 4))
        ]
    )


def _leader(root: Path) -> MessageStore:
    """A leader whose retention deleted its first segments: an old compact topic
    (compacted), then a topic with a 1 s retention written before and after 10 s."""
    clock = ManualClock(now_ms=T0)
    leader = MessageStore.open(_config(root, "leader"), clock=clock)
    rng = random.Random(7)
    leader.create_topic("kv", 1, cleanup_policy=CleanupPolicy.COMPACT)
    leader.create_topic("t", 2, retention_ms=1_000)
    for i in range(60):
        leader.append("kv", 0, _batch(rng, f"k{i % 7}"))
    for i in range(40):
        leader.append("t", i % 2, _batch(rng, None))
    leader.flush()
    leader.compact("kv", 0)
    clock.advance(10_000)
    for i in range(30):
        leader.append("t", i % 2, _batch(rng, None))
        leader.append("kv", 0, _batch(rng, f"k{i % 7}"))
    leader.flush()
    leader.checkpoint()
    assert leader.enforce_retention() > 0
    assert leader.log.start_position > 0
    return leader


def _stage(leader: MessageStore, plan: StartOverPlan, data_dir: Path) -> None:
    """Copy the leader's compacted files into the follower's staging directory in
    chunks, as the follower does over REPLICA_FILE."""
    fs = OsFileSystem()
    for f in plan.compacted:
        path = staging_path(data_dir, f)
        path.parent.mkdir(parents=True, exist_ok=True)
        data, offset = b"", 0
        while offset < f.size:
            chunk, size = read_compacted_file(
                leader, (f.topic_id, f.queue_id), f.generation, offset, CHUNK_BYTES
            )
            assert size == f.size
            data += chunk
            offset += len(chunk)
        path.write_bytes(data)
        check_staged(fs, path, f)


def _copy_rest(leader: MessageStore, follower: MessageStore) -> None:
    while chunk := leader.replica.read_chunk(
        follower.end_position, 1 << 20, limit=leader.end_position
    ):
        if not chunk.data:
            follower.flush()  # readers see flushed records only
            return
        try:
            follower.replica.append_chunk(LogChunk(chunk.position, chunk.data, chunk.records))
        except TopicsBehind:
            follower.replica.mirror_topics(leader.topics(), leader.metadata.max_topic_id())


def _records(store: MessageStore, topic: str, queue: int, start: int) -> list[tuple[int, bytes]]:
    _, hi = store.queue_bounds(topic, queue)
    out, offset = [], start
    while offset < hi:
        got = store.read(topic, queue, offset, max_bytes=1 << 20)
        assert got.status is ReadStatus.FOUND
        out += [(b.base_offset, b.record) for b in got.batches]
        offset = got.next_offset
    return out


def _follower_with_old_log(root: Path, leader: MessageStore) -> MessageStore:
    """A member that copied the leader's topics and a few records, then stopped."""
    follower = MessageStore.open(_config(root, "follower"), clock=ManualClock(now_ms=T0))
    follower.replica.mirror_topics(leader.topics(), leader.metadata.max_topic_id())
    follower.close()
    return MessageStore.open(_config(root, "follower"), clock=ManualClock(now_ms=T0))


def test_a_follower_starting_over_at_the_leaders_log_start_reads_what_the_leader_reads(
    tmp_path: Path,
) -> None:
    leader = _leader(tmp_path)
    follower = _follower_with_old_log(tmp_path, leader)
    config = follower.config
    plan = plan_start_over(leader)
    assert plan.position == leader.log.start_position
    assert [f.topic_id for f in plan.compacted] == [leader.topic("kv").id]
    _stage(leader, plan, config.data_dir)
    follower.close()
    history = EpochHistory(OsFileSystem(), config.data_dir)
    start_over(
        config, OsFileSystem(), plan, write_epochs=lambda: history.replace([EpochEntry(1, 0)])
    )
    assert not (config.data_dir / MARKER).exists()
    assert not (config.data_dir / STAGING).exists()
    follower = MessageStore.open(config, clock=ManualClock(now_ms=T0 + 10_000))
    try:
        assert follower.log.start_position == follower.end_position == plan.position
        _copy_rest(leader, follower)
        follower.flush()
        assert follower.end_position == leader.end_position
        for q in range(2):
            low, _ = leader.queue_bounds("t", q)
            first = follower.queue_bounds("t", q)[0]
            assert first <= low  # the follower may keep expired records past S
            assert _records(follower, "t", q, low) == _records(leader, "t", q, low)
        assert _records(follower, "kv", 0, 0) == _records(leader, "kv", 0, 0)
        for k in range(7):
            key = b"k%d" % k
            assert follower.lookup_key("kv", 0, key) == leader.lookup_key("kv", 0, key)
        follower.close()
        # And across a restart.
        follower = MessageStore.open(config, clock=ManualClock(now_ms=T0 + 10_000))
        assert _records(follower, "kv", 0, 0) == _records(leader, "kv", 0, 0)
        assert EpochHistory(OsFileSystem(), config.data_dir).entries == [EpochEntry(1, 0)]
    finally:
        follower.close()
        leader.close()


@pytest.mark.parametrize("step", STEPS)
def test_a_start_over_interrupted_at_any_step_is_wiped_at_the_next_open(
    tmp_path: Path, step: str
) -> None:
    leader = _leader(tmp_path)
    follower = _follower_with_old_log(tmp_path, leader)
    config = follower.config
    plan = plan_start_over(leader)
    _stage(leader, plan, config.data_dir)
    follower.close()
    history = EpochHistory(OsFileSystem(), config.data_dir)
    history.replace([EpochEntry(1, 0)])

    def crash_at(name: str) -> None:
        if name == step:
            raise Crash(name)

    with pytest.raises(Crash):
        start_over(
            config,
            OsFileSystem(),
            plan,
            write_epochs=lambda: history.replace([EpochEntry(1, 0)]),
            step=crash_at,
        )
    # Before the marker nothing of the store was touched; from it on, the marker stands.
    assert (config.data_dir / MARKER).exists() == (step != "marker")
    follower = MessageStore.open(config, clock=ManualClock(now_ms=T0))
    try:
        # Nothing half installed: an empty store at position 0, the topics kept, no
        # compacted log, no epoch history; the marker and the staged files gone.
        assert follower.log.start_position == follower.end_position == 0
        assert {t.name for t in follower.topics()} >= {"t", "kv"}
        assert follower.queue_bounds("t", 0) == (0, 0)
        assert follower.queue_bounds("kv", 0) == (0, 0)
        assert follower.compacted_end("kv", 0) == 0
        assert not (config.data_dir / MARKER).exists()
        assert not (config.data_dir / STAGING).exists()
        assert (config.data_dir / EPOCH_FILE).exists() == (step == "marker")
        # The next start-over (asked from 0, below the leader's start) completes.
        plan = plan_start_over(leader)
        _stage(leader, plan, config.data_dir)
        follower.close()
        start_over(config, OsFileSystem(), plan, write_epochs=lambda: None)
        follower = MessageStore.open(config, clock=ManualClock(now_ms=T0 + 10_000))
        _copy_rest(leader, follower)
        assert _records(follower, "kv", 0, 0) == _records(leader, "kv", 0, 0)
    finally:
        follower.close()
        leader.close()


def test_a_log_marked_for_start_over_opens_empty_with_its_topics(tmp_path: Path) -> None:
    """A follower that must cut below its own log start throws its log away instead: the
    marker alone makes the next open wipe it."""
    leader = _leader(tmp_path)
    try:
        config = leader.config
        topics = {t.name for t in leader.topics()}
        leader.close()
        mark_for_start_over(OsFileSystem(), config.data_dir)
        store = MessageStore.open(config, clock=ManualClock(now_ms=T0))
        try:
            assert store.log.start_position == store.end_position == 0
            assert {t.name for t in store.topics()} == topics
            assert store.queue_bounds("t", 1) == (0, 0)
            assert store.compacted_end("kv", 0) == 0
        finally:
            store.close()
    finally:
        leader.close()


def test_a_compacted_generation_replaced_since_the_plan_is_refused(tmp_path: Path) -> None:
    """The leader compacted again after naming a generation: copying it is refused with
    what the generation is now (the follower then starts over again)."""
    leader = _leader(tmp_path)
    try:
        (named,) = plan_start_over(leader).compacted
        key = (named.topic_id, named.queue_id)
        data, size = read_compacted_file(leader, key, named.generation, 0, CHUNK_BYTES)
        assert (len(data), size) == (min(CHUNK_BYTES, named.size), named.size)
        rng = random.Random(3)
        for i in range(10):
            leader.append("kv", 0, _batch(rng, f"k{i % 7}"))
        leader.flush()
        leader.compact("kv", 0)
        with pytest.raises(OffsetOutOfRange, match=r"generation \d+ .* is gone .*current"):
            read_compacted_file(leader, key, named.generation, 0, CHUNK_BYTES)
        with pytest.raises(OffsetOutOfRange, match="outside compacted log"):
            read_compacted_file(leader, key, named.generation + 1, 1 << 40, CHUNK_BYTES)
    finally:
        leader.close()


def test_producer_windows_before_the_log_start_come_with_the_start_over(
    tmp_path: Path,
) -> None:
    """An idempotent producer's batches in the deleted segments: the plan carries their
    windows (only batches ending at or before S, newest first, bounded), and the store
    started over answers a retry of one from them instead of storing it again."""
    clock = ManualClock(now_ms=T0)
    leader = MessageStore.open(_config(tmp_path, "leader"), clock=clock)
    rng = random.Random(3)
    leader.create_topic("t", 2, retention_ms=1_000)
    pid = leader.allocate_producer_id()
    stamps = [ProducerStamp(pid, 0, seq) for seq in range(3)]
    one = encode_batch([MessageRecord(b"one")])  # a message each: sequences 0, 1, 2
    first = [leader.append("t", 0, one, producer=s) for s in stamps]
    for i in range(30):  # enough to fill the first segments
        leader.append("t", i % 2, _batch(rng, None))
    clock.advance(10_000)
    for i in range(40):
        leader.append("t", i % 2, _batch(rng, None))
    leader.flush()
    leader.checkpoint()
    assert leader.enforce_retention() > 0
    follower = _follower_with_old_log(tmp_path, leader)
    config = follower.config
    plan = plan_start_over(leader)
    tid = leader.topic("t").id
    assert [(r[0], r[1], r[2], r[3]) for r in plan.producers] == [(tid, 0, pid, 0)]
    assert [w[0] for w in plan.producers[0][4]] == [0, 1, 2]
    assert all(w[3] <= plan.position for w in plan.producers[0][4])
    assert plan_start_over(leader, max_batches=2).producers == []  # over the bound: none
    follower.note_producer_id(pid)  # as the leader's topic table brings it
    follower.close()
    history = EpochHistory(OsFileSystem(), config.data_dir)
    start_over(config, OsFileSystem(), plan, write_epochs=lambda: history.replace([]))
    follower = MessageStore.open(config, clock=ManualClock(now_ms=T0 + 10_000))
    try:
        _copy_rest(leader, follower)
        end = follower.queue_bounds("t", 0)[1]
        again = follower.append("t", 0, one, producer=stamps[1])
        assert again.duplicate
        assert again.base_offset == first[1].base_offset
        assert follower.queue_bounds("t", 0)[1] == end
    finally:
        follower.close()
        leader.close()
