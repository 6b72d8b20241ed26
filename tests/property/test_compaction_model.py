"""Compact topics against a dict model: puts, tombstones, compaction runs, restarts and
process crashes (kill -9, on the fault-injecting file system), with a ManualClock.

The model keeps every message written, by offset, and which were acknowledged (flushed).
After every step, a read of each queue from its start must give, in offset order:

* only messages as they were written, at their offsets (compaction moves nothing);
* for every key, the latest message written (acknowledged, or written since the last
  crash), unless it is a tombstone whose `delete.retention.ms` ran out;
* older values of a key only above the compacted log's end (not yet compacted);

and `lookup_key` must agree with the read. A kill -9 keeps what was written (the page
cache survives), so the model keeps everything across it too.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tidemq.core.batch import MessageRecord, encode_batch
from tidemq.core.message import messages_from_records
from tidemq.store.config import StoreConfig
from tidemq.store.message_store import MessageStore
from tidemq.store.metadata import CleanupPolicy
from tidemq.testing.clock import ManualClock
from tidemq.testing.files import FaultFileSystem

TOPIC = "kv"
KEYS = [b"a", b"b", b"c", b"d", b"e"]
RETENTION_MS = 1_000
DATA = Path("/model/data")


class CompactionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.meta_dir = tempfile.TemporaryDirectory()
        self.meta = Path(self.meta_dir.name) / "meta.sqlite"
        self.fs = FaultFileSystem()
        self.clock = ManualClock()
        self.store = self._open()
        self.store.create_topic(
            TOPIC,
            2,
            cleanup_policy=CleanupPolicy.COMPACT,
            config={"delete.retention.ms": str(RETENTION_MS)},
        )
        #: queue -> offset -> (key, value, store time)
        self.written: dict[int, dict[int, tuple[bytes, bytes | None]]] = {0: {}, 1: {}}
        #: queue -> tombstone offset -> when compaction first reached it
        self.reached: dict[int, dict[int, int]] = {0: {}, 1: {}}
        #: queue -> offsets below this are readable (sync flush: once flushed)
        self.visible = {0: 0, 1: 0}

    def _all_visible(self) -> None:
        for queue, written in self.written.items():
            self.visible[queue] = max(written, default=-1) + 1

    def _open(self) -> MessageStore:
        config = StoreConfig(data_dir=DATA, segment_size_bytes=4096, index_entries_per_file=4)
        return MessageStore.open(config, fs=self.fs, clock=self.clock, metadata_path=self.meta)

    def teardown(self) -> None:
        self.store.close()
        self.meta_dir.cleanup()

    @rule(
        queue=st.integers(0, 1),
        puts=st.lists(
            st.tuples(st.sampled_from(KEYS), st.none() | st.binary(max_size=20)),
            min_size=1,
            max_size=5,
        ),
        flush=st.booleans(),
    )
    def put(self, queue: int, puts: list[tuple[bytes, bytes | None]], flush: bool) -> None:
        records = [MessageRecord(v, k, None, (), (), self.clock.now_ms()) for k, v in puts]
        base = self.store.append(TOPIC, queue, encode_batch(records)).base_offset
        for i, (k, v) in enumerate(puts):
            self.written[queue][base + i] = (k, v)
        if flush:
            self.store.flush()
            self._all_visible()

    @rule(queue=st.integers(0, 1))
    def compact(self, queue: int) -> None:
        self.store.flush()
        self._all_visible()
        compacted_before = self._compacted_end(queue)
        result = self.store.compact(TOPIC, queue)
        # Tombstones the run reached for the first time start their grace period now.
        for offset, (_, value) in self.written[queue].items():
            if value is None and compacted_before <= offset < result.end:
                self.reached[queue].setdefault(offset, self.clock.now_ms())

    @rule(ms=st.integers(0, 2 * RETENTION_MS))
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule()
    def restart(self) -> None:
        self.store.close()
        self.store = self._open()
        self._all_visible()  # close flushes

    @rule()
    def kill(self) -> None:
        self.store.metadata.close()  # the process dies: only its SQLite handle to let go
        self.fs = self.fs.crash_process()
        self.store = self._open()
        self._all_visible()  # the page cache survived; recovery syncs it

    def _compacted_end(self, queue: int) -> int:
        found = self.store.compacted.get((self.store.topic(TOPIC).id, queue))
        return 0 if found is None else found.end

    def _read(self, queue: int) -> list[tuple[int, bytes | None, bytes | None]]:
        out: list[tuple[int, bytes | None, bytes | None]] = []
        offset = self.store.queue_bounds(TOPIC, queue)[0]
        for _ in range(10_000):
            result = self.store.read(TOPIC, queue, offset, max_bytes=300)
            if not result.batches and result.next_offset <= offset:
                break
            body = b"".join(b.record for b in result.batches)
            sizes = [len(b.record) for b in result.batches]
            found = messages_from_records(TOPIC, queue, body, sizes, offset)
            out += [(m.offset, m.key, m.value) for m in found]
            offset = result.next_offset
        return out

    @invariant()
    def reads_match_the_model(self) -> None:
        for queue in (0, 1):
            got = self._read(queue)
            written = {o: m for o, m in self.written[queue].items() if o < self.visible[queue]}
            assert [o for o, _, _ in got] == sorted({o for o, _, _ in got})
            for offset, key, value in got:
                assert written[offset] == (key, value)
            last_read = {k: (o, v) for o, k, v in got}
            end = self._compacted_end(queue)
            for key in KEYS:
                latest = max((o for o, (k, _) in written.items() if k == key), default=None)
                if latest is None:
                    assert key not in last_read
                    continue
                if key not in last_read:
                    # Only an expired tombstone may go.
                    assert written[latest][1] is None
                    reached = self.reached[queue].get(latest)
                    assert reached is not None
                    assert reached + RETENTION_MS <= self.clock.now_ms()
                else:
                    assert last_read[key][0] == latest
                below = [o for o, k, _ in got if k == key and o < end]
                assert len(below) <= 1, "an older value below the compacted end"
                found = self.store.lookup_key(TOPIC, queue, key)
                seen = last_read.get(key)
                assert (None if found is None else (found.offset, found.value)) == seen


CompactionMachine.TestCase.settings = settings(
    max_examples=100, stateful_step_count=40, deadline=None
)
TestCompactionModel = CompactionMachine.TestCase
