"""MessageStore against an in-memory model, on real files in a temp dir.

The model is a dict of (topic, queue) -> the batches still retained, each with its offsets,
messages, store time and record size. Rules drive the store (topics, appends, idempotent
producers, flushes, checkpoints, retention, reopening with and without a clean close) and
every answer is checked against the model: offsets are dense and never reused, every read
returns exactly the batches the model says, byte for byte, and a reopened store has lost
nothing (the files are real, so even what was never fsynced is still there).

Small segments and index files make rolls, segment deletion and index file deletion
happen within a few steps; a fake clock (advanced by a rule, sometimes stepped back like
a wall clock) drives time retention and store times.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from tidemq.core.batch import MessageRecord, decode_messages, encode_batch, tag_bit
from tidemq.core.errors import (
    ConfigError,
    OutOfOrderSequence,
    TopicAlreadyExists,
    TopicNotFound,
)
from tidemq.core.record import HEADER, parse_header
from tidemq.store.config import FlushMode, StoreConfig
from tidemq.store.message_store import MessageStore, ReadResult, ReadStatus
from tidemq.store.producer_state import ProducerStamp

T0 = 1_700_000_000_000
TOPIC_NAMES = ("t0", "t1", "t2")
TAGS = ("a", "b", "c")
MAX_QUEUES = 5


class FakeClock:
    """Wall time can be stepped back (as NTP does); monotonic time never goes back."""

    def __init__(self) -> None:
        self.wall = T0
        self.mono = 0.0

    def now_ms(self) -> int:
        return self.wall

    def monotonic_ms(self) -> float:
        return self.mono


@dataclass(frozen=True)
class _Batch:
    base: int
    messages: tuple[MessageRecord, ...]
    store_time: int
    size: int  # the whole record, as the queue index counts it for size retention
    end_position: int
    tag_summary: int

    @property
    def end(self) -> int:
        return self.base + len(self.messages)


@dataclass
class _Producer:
    producer_id: int
    next_sequence: int = 0
    # the last batch sent: (base sequence, payload, base offset, count)
    last: tuple[int, bytes, int, int] | None = None


@dataclass
class _Queue:
    batches: list[_Batch] = field(default_factory=list)  # retained, oldest first
    min_offset: int = 0
    next_offset: int = 0
    producer: _Producer | None = None


@dataclass
class _Topic:
    queues: list[_Queue]
    retention_ms: int = -1
    retention_bytes: int = -1


_messages = st.lists(
    st.builds(
        MessageRecord,
        value=st.one_of(st.none(), st.binary(max_size=40)),
        key=st.one_of(st.none(), st.binary(max_size=8)),
        tag=st.sampled_from([None, *TAGS]),
        keys=st.lists(st.sampled_from(["k1", "k2"]), max_size=2).map(tuple),
        headers=st.lists(
            st.tuples(st.sampled_from(["h", "trace"]), st.binary(max_size=4)), max_size=2
        ).map(tuple),
        timestamp_ms=st.integers(min_value=T0 - 1000, max_value=T0 + 1000),
    ),
    min_size=1,
    max_size=20,
)

_tag_masks = st.sampled_from(
    [0, tag_bit("a"), tag_bit("b"), tag_bit("a") | tag_bit("c"), 1 << 63 | 1]
)


class StoreMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="tidemq-store-model-"))
        self.clock = FakeClock()
        self.topics: dict[str, _Topic] = {}
        self.offsets: dict[tuple[str, int], int] = {}  # committed by group "g"
        self.flushed = 0  # log position up to which a sync-mode reader sees
        self.last_store_time = 0
        self.config = StoreConfig(data_dir=self.root / "data")  # replaced by initialize
        self.store: MessageStore | None = None

    @initialize(
        segment_size=st.sampled_from([4096, 8192, 65536]),
        entries_per_file=st.integers(min_value=4, max_value=8),
        flush_mode=st.sampled_from(FlushMode),
    )
    def open_store(self, segment_size: int, entries_per_file: int, flush_mode: FlushMode) -> None:
        self.config = StoreConfig(
            data_dir=self.root / "data",
            segment_size_bytes=segment_size,
            index_entries_per_file=entries_per_file,
            flush_mode=flush_mode,
            retention_ms=-1,
            disk_reject_ratio=1.0,  # the machine's real disk may be fuller than the default
        )
        self.store = MessageStore.open(self.config, clock=self.clock)

    def teardown(self) -> None:
        if self.store is not None:
            self.store.close()
        shutil.rmtree(self.root, ignore_errors=True)

    @property
    def s(self) -> MessageStore:
        assert self.store is not None
        return self.store

    def _queues(self) -> list[tuple[str, int]]:
        return [(name, q) for name, t in sorted(self.topics.items()) for q in range(len(t.queues))]

    def _visible(self, batch: _Batch) -> bool:
        return self.config.flush_mode is FlushMode.ASYNC or batch.end_position <= self.flushed

    # ------------------------------------------------------------------ topics

    @rule(name=st.sampled_from(TOPIC_NAMES), queues=st.integers(min_value=1, max_value=3))
    def create_topic(self, name: str, queues: int) -> None:
        if name in self.topics:
            try:
                self.s.create_topic(name, queues)
            except TopicAlreadyExists:
                return
            raise AssertionError(f"topic {name} created twice")
        self.s.create_topic(name, queues)
        self.topics[name] = _Topic([_Queue() for _ in range(queues)])

    @precondition(lambda self: bool(self.topics))
    @rule(data=st.data(), more=st.integers(min_value=-1, max_value=2))
    def alter_topic_queues(self, data: st.DataObject, more: int) -> None:
        name = data.draw(st.sampled_from(sorted(self.topics)))
        topic = self.topics[name]
        wanted = min(len(topic.queues) + more, MAX_QUEUES)
        if wanted < len(topic.queues):
            try:
                self.s.alter_topic(name, queues=wanted)
            except ConfigError:
                return
            raise AssertionError("a topic lost queues")
        self.s.alter_topic(name, queues=wanted)
        topic.queues.extend(_Queue() for _ in range(wanted - len(topic.queues)))

    @precondition(lambda self: bool(self.topics))
    @rule(data=st.data())
    def delete_topic(self, data: st.DataObject) -> None:
        name = data.draw(st.sampled_from(sorted(self.topics)))
        self.s.delete_topic(name)
        del self.topics[name]
        self.offsets = {k: v for k, v in self.offsets.items() if k[0] != name}
        try:
            self.s.read(name, 0, 0, max_bytes=1024)
        except TopicNotFound:
            return
        raise AssertionError("a deleted topic is still readable")

    # ------------------------------------------------------------------ appends

    def _append(
        self, name: str, queue: int, messages: list[MessageRecord], payload: bytes, seq: int | None
    ) -> None:
        q = self.topics[name].queues[queue]
        stamp = None
        if seq is not None:
            assert q.producer is not None
            stamp = ProducerStamp(q.producer.producer_id, 0, seq)
        end_before = self.s.end_position
        result = self.s.append(name, queue, payload, producer=stamp)
        assert not result.duplicate
        assert (result.base_offset, result.count) == (q.next_offset, len(messages))
        # Store times never go backwards, whatever the wall clock does.
        assert result.store_time_ms == max(self.last_store_time, self.clock.wall)
        size = HEADER.size + len(payload)
        # Log positions are dense, across segment rolls too: the record starts at the old end.
        assert result.end_position - size == end_before
        assert result.end_position == self.s.end_position
        self.last_store_time = result.store_time_ms
        tags = 0
        for m in messages:
            if m.tag is not None:
                tags |= tag_bit(m.tag)
        q.batches.append(
            _Batch(q.next_offset, tuple(messages), result.store_time_ms, size,
                   result.end_position, tags)
        )  # fmt: skip
        q.next_offset += len(messages)
        if q.producer is not None and seq is not None:
            q.producer.next_sequence = seq + len(messages)
            q.producer.last = (seq, payload, result.base_offset, result.count)

    @precondition(lambda self: bool(self.topics))
    @rule(data=st.data(), messages=_messages, idempotent=st.booleans())
    def append(self, data: st.DataObject, messages: list[MessageRecord], idempotent: bool) -> None:
        name, queue = data.draw(st.sampled_from(self._queues()))
        q = self.topics[name].queues[queue]
        seq = None
        if idempotent:
            if q.producer is None:
                q.producer = _Producer(self.s.allocate_producer_id())
            seq = q.producer.next_sequence
        self._append(name, queue, messages, encode_batch(messages), seq)

    def _with_last_batch(self) -> list[tuple[str, int]]:
        return [
            (name, q)
            for name, q in self._queues()
            if (p := self.topics[name].queues[q].producer) is not None and p.last is not None
        ]

    @precondition(lambda self: bool(self._with_last_batch()))
    @rule(data=st.data())
    def retry_last_batch(self, data: st.DataObject) -> None:
        """A producer that never got the answer sends the same batch again."""
        self._retry_last_batch(*data.draw(st.sampled_from(self._with_last_batch())))

    def _retry_last_batch(self, name: str, queue: int) -> None:
        producer = self.topics[name].queues[queue].producer
        assert producer is not None
        assert producer.last is not None
        seq, payload, base, count = producer.last
        end, bounds = self.s.end_position, self.s.queue_bounds(name, queue)
        stamp = ProducerStamp(producer.producer_id, 0, seq)
        result = self.s.append(name, queue, payload, producer=stamp)
        assert result.duplicate
        assert (result.base_offset, result.count) == (base, count)
        assert self.s.end_position == end
        assert self.s.queue_bounds(name, queue) == bounds

    @precondition(lambda self: bool(self.topics))
    @rule(data=st.data(), messages=_messages, gap=st.integers(min_value=1, max_value=5))
    def out_of_order_sequence(
        self, data: st.DataObject, messages: list[MessageRecord], gap: int
    ) -> None:
        """A sequence past the next expected one (or not 0 for a new producer) is refused
        and nothing is written; so is a remembered sequence reused for another batch."""
        name, queue = data.draw(st.sampled_from(self._queues()))
        producer = self.topics[name].queues[queue].producer
        if producer is None:
            stamp = ProducerStamp(self.s.allocate_producer_id(), 0, gap)
        elif producer.last is not None and producer.last[3] != len(messages) and gap == 1:
            stamp = ProducerStamp(producer.producer_id, 0, producer.last[0])
        else:
            stamp = ProducerStamp(producer.producer_id, 0, producer.next_sequence + gap)
        end, bounds = self.s.end_position, self.s.queue_bounds(name, queue)
        try:
            self.s.append(name, queue, encode_batch(messages), producer=stamp)
        except OutOfOrderSequence:
            assert self.s.end_position == end
            assert self.s.queue_bounds(name, queue) == bounds
            return
        raise AssertionError(f"sequence {stamp} was accepted")

    # ------------------------------------------------------------------ durability

    @rule()
    def flush(self) -> None:
        self.flushed = self.s.flush()
        assert self.flushed == self.s.end_position

    @rule()
    def checkpoint(self) -> None:
        self.s.checkpoint()
        self.flushed = self.s.flushed_position
        assert self.flushed == self.s.end_position == self.s.indexed_position

    @rule(how=st.sampled_from(["close", "crash", "crash_after_flush", "crash_torn_tail"]))
    def reopen(self, how: str) -> None:
        """Close cleanly, or drop the store as kill -9 would (no checkpoint; the files are
        real, so what was written is still there), maybe leaving garbage after the log."""
        end = self.s.end_position
        if how == "close":
            self.s.close()
        else:
            if how == "crash_after_flush":
                self.s.flush()
            # The process is gone: its descriptors close, nothing else happens.
            self.s.log.close()
            self.s.metadata.close()
            if how == "crash_torn_tail":
                last = sorted((self.config.data_dir / "commitlog").glob("*.log"))[-1]
                with last.open("ab") as f:
                    f.write(b"\xc7\x01" + bytes(100) + b"torn")
        self.store = MessageStore.open(self.config, clock=self.clock)
        assert self.s.end_position == end
        self.flushed = end  # recovery makes what it kept durable
        # Store times stay monotone across the restart, even if the clock stepped back.
        assert self.s.log.last_store_time_ms >= self.last_store_time
        for name, queue in self._queues():
            self._check_whole_queue(name, queue)
        for name, queue in self._with_last_batch():
            self._retry_last_batch(name, queue)  # producer state survived

    # ------------------------------------------------------------------ retention

    @precondition(lambda self: bool(self.topics))
    @rule(
        data=st.data(),
        retention_ms=st.sampled_from([-1, 0, 500, 2000, 10_000]),
        retention_bytes=st.sampled_from([-1, 0, 300, 2000, 6000]),
    )
    def retention(self, data: st.DataObject, retention_ms: int, retention_bytes: int) -> None:
        name = data.draw(st.sampled_from(sorted(self.topics)))
        self.s.alter_topic(name, retention_ms=retention_ms, retention_bytes=retention_bytes)
        self.topics[name].retention_ms = retention_ms
        self.topics[name].retention_bytes = retention_bytes
        deleted = self.s.enforce_retention()
        assert deleted >= 0
        now = self.clock.wall
        for topic in self.topics.values():
            for q in topic.queues:
                _apply_retention(q, now, topic.retention_ms, topic.retention_bytes)

    @rule(
        ms=st.integers(min_value=0, max_value=3000),
        step_back=st.sampled_from([0, 0, 0, 1500]),
    )
    def advance_clock(self, ms: int, step_back: int) -> None:
        self.clock.wall += ms - step_back
        self.clock.mono += ms

    # ------------------------------------------------------------------ reads

    @precondition(lambda self: bool(self.topics))
    @rule(
        data=st.data(),
        max_bytes=st.integers(min_value=1, max_value=6000),
        tag_mask=_tag_masks,
    )
    def read(self, data: st.DataObject, max_bytes: int, tag_mask: int) -> None:
        name, queue = data.draw(st.sampled_from(self._queues()))
        q = self.topics[name].queues[queue]
        offset = data.draw(
            st.integers(min_value=max(q.min_offset - 2, 0), max_value=q.next_offset + 2)
        )
        got = self.s.read(name, queue, offset, max_bytes=max_bytes, tag_mask=tag_mask)
        self._check_read(q, offset, max_bytes, tag_mask, got)

    def _check_read(
        self, q: _Queue, offset: int, max_bytes: int, tag_mask: int, got: ReadResult
    ) -> None:
        assert (got.min_offset, got.max_offset) == (q.min_offset, q.next_offset)
        if offset < q.min_offset or offset > q.next_offset:
            assert (got.status, got.batches, got.next_offset) == (
                ReadStatus.OFFSET_OUT_OF_RANGE,
                [],
                offset,
            )
            return
        expected: list[_Batch] = []
        budget = max_bytes
        next_offset = offset
        for b in q.batches:
            if b.end <= offset:
                continue
            if not self._visible(b) or (expected and b.size > budget):
                break
            next_offset = b.end
            if tag_mask and not b.tag_summary & tag_mask:
                continue
            expected.append(b)
            budget -= b.size
            if budget <= 0:
                break
        assert got.status is (ReadStatus.FOUND if expected else ReadStatus.NO_NEW_MESSAGE)
        assert got.next_offset == next_offset
        assert len(got.batches) == len(expected)
        for stored, b in zip(got.batches, expected, strict=True):
            assert (stored.base_offset, stored.count, stored.store_time_ms) == (
                b.base,
                len(b.messages),
                b.store_time,
            )
            assert len(stored.record) == b.size
            header = parse_header(stored.record)
            assert (header.base_offset, header.count) == (b.base, len(b.messages))
            assert tuple(decode_messages(stored.record[header.payload_start :])) == b.messages

    def _check_whole_queue(self, name: str, queue: int) -> None:
        """Read the queue from its min offset to the end: dense, and all of it there."""
        q = self.topics[name].queues[queue]
        offset = q.min_offset
        while True:
            got = self.s.read(name, queue, offset, max_bytes=1 << 20)
            self._check_read(q, offset, 1 << 20, 0, got)
            if not got.batches:
                break
            offset = got.next_offset
        assert offset == q.next_offset

    # ------------------------------------------------------------------ consumer offsets

    @precondition(lambda self: bool(self.topics))
    @rule(data=st.data(), offset=st.integers(min_value=0, max_value=500))
    def commit_offset(self, data: st.DataObject, offset: int) -> None:
        key = data.draw(st.sampled_from(self._queues()))
        self.s.commit_offsets("g", {key: offset})
        self.offsets[key] = offset

    # ------------------------------------------------------------------ invariants

    @invariant()
    def bounds_match_the_model(self) -> None:
        if self.store is None:
            return
        for name, queue in self._queues():
            q = self.topics[name].queues[queue]
            assert self.s.queue_bounds(name, queue) == (q.min_offset, q.next_offset)
            assert [t.name for t in self.s.topics()] == sorted(self.topics)

    @invariant()
    def segments_deleted_only_behind_the_checkpoint(self) -> None:
        if self.store is None:
            return
        assert self.s.log.start_position <= self.s.indexed_position <= self.s.flushed_position
        assert self.s.flushed_position <= self.s.end_position

    @invariant()
    def committed_offsets_match(self) -> None:
        if self.store is None:
            return
        # Deleting a topic forgets its offsets, so a namesake created later starts afresh.
        assert self.s.committed_offsets("g") == self.offsets


def _apply_retention(q: _Queue, now: int, retention_ms: int, retention_bytes: int) -> None:
    """Whole batches go from the front: those stored before now - retention_ms, then the
    oldest until the rest add up to at most retention_bytes."""
    new_min = q.min_offset
    if retention_ms >= 0:
        kept = [b for b in q.batches if b.store_time >= now - retention_ms]
        new_min = max(new_min, kept[0].base if kept else q.next_offset)
    if retention_bytes >= 0:
        live = [b for b in q.batches if b.end > new_min]
        total = sum(b.size for b in live)
        for b in live:
            if total <= retention_bytes:
                break
            total -= b.size
            new_min = b.end
    if new_min > q.min_offset:
        q.min_offset = new_min
        q.batches = [b for b in q.batches if b.end > new_min]


StoreMachine.TestCase.settings = settings(max_examples=50, stateful_step_count=30, deadline=None)
TestStoreModel = StoreMachine.TestCase
