"""QueueIndex against a model: its files as lists of entries, on real files in a temp dir.

The model mirrors the on-disk layout the index promises: files named by the base offset of
their first entry, at most `entries_per_file` entries each, entries reaching the file only
at `write_pending` or when the file is sealed by a roll (a file is made when its first
entries are written). Reopening from the files loses the
unwritten tail entries and nothing else; `cut_from_position` (recovery) keeps each file's
valid prefix below the position, dropping torn or garbage entries too.
"""

from __future__ import annotations

import random
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

from tidemq.store.files import OsFileSystem
from tidemq.store.queue_index import IndexEntry, IndexFileCache, QueueIndex

_NO_LIMIT = 1 << 30
_CHECKS = 24


def _spread(values: list[int]) -> list[int]:
    """At most `_CHECKS` of `values`, evenly spaced, always keeping both ends."""
    if len(values) <= _CHECKS:
        return values
    step = (len(values) - 1) / (_CHECKS - 1)
    return [values[round(i * step)] for i in range(_CHECKS)]


@dataclass
class _ModelFile:
    name: int  # base offset of its first entry (the next offset when it was created)
    entries: list[IndexEntry] = field(default_factory=list)
    written: int = 0  # leading entries that are in the file on disk
    #: The file exists on disk: made when its first entries are written (a new file is
    #: only in memory until then).
    on_disk: bool = False


class _IndexModel:
    def __init__(self, per_file: int) -> None:
        self.per_file = per_file
        self.files: list[_ModelFile] = []
        self.next_offset = 0
        self.min_offset = 0
        self.last_position = -1

    def entries(self) -> list[IndexEntry]:
        return [e for f in self.files for e in f.entries]

    def append(self, position: int, size: int, count: int, store_time: int, tags: int) -> int:
        if not self.files or len(self.files[-1].entries) >= self.per_file:
            if self.files:  # a roll seals (writes) the previous file
                self.files[-1].written = len(self.files[-1].entries)
                self.files[-1].on_disk = True
            self.files.append(_ModelFile(self.next_offset))
        base = self.next_offset
        self.files[-1].entries.append(IndexEntry(position, size, count, base, store_time, tags))
        self.next_offset = base + count
        self.last_position = position
        return base

    def write_pending(self) -> None:
        if self.files:
            last = self.files[-1]
            if len(last.entries) > last.written:
                last.on_disk = True
            last.written = len(last.entries)

    def reopen(self) -> None:
        """A fresh QueueIndex over the files: unwritten entries are gone."""
        if self.files:
            last = self.files[-1]
            del last.entries[last.written :]
        while self.files and not self.files[-1].on_disk:  # never written: never made
            self.files.pop()
        self._load_bounds()
        self.min_offset = self.files[0].name if self.files else 0

    def _load_bounds(self) -> None:
        self.last_position = -1
        if not self.files:
            self.next_offset = 0
            return
        self.next_offset = self.files[-1].name
        for i, f in enumerate(reversed(self.files)):
            if f.entries:
                if i == 0:
                    last = f.entries[-1]
                    self.next_offset = last.base_offset + last.count
                self.last_position = f.entries[-1].log_position
                break

    def cut_from_position(self, position: int) -> None:
        old_min = self.min_offset
        while self.files:
            last = self.files[-1]
            keep = sum(1 for e in last.entries if e.log_position < position)
            if keep == 0 and len(self.files) > 1:
                self.files.pop()
                continue
            del last.entries[keep:]
            last.written = keep
            break
        self._load_bounds()
        first_name = self.files[0].name if self.files else 0
        self.min_offset = min(max(old_min, first_name), self.next_offset)

    def advance_min_offset(self, offset: int) -> None:
        offset = min(max(offset, self.min_offset), self.next_offset)
        self.min_offset = offset
        while len(self.files) > 1 and self.files[1].name <= offset:
            self.files.pop(0)

    def entries_from(self, offset: int, max_entries: int) -> list[IndexEntry]:
        if offset >= self.next_offset or not self.files:
            return []
        offset = max(offset, self.min_offset)
        live = [e for e in self.entries() if e.base_offset + e.count > offset]
        return live[:max_entries]

    def offset_for_time(self, timestamp_ms: int) -> int:
        for e in self.entries():
            if e.store_time_ms >= timestamp_ms:
                return max(e.base_offset, self.min_offset)
        return self.next_offset


class QueueIndexMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.root = Path(tempfile.mkdtemp(prefix="tidemq-qindex-"))
        self.dir = self.root / "queue"
        self.fs = OsFileSystem()
        # Tiny, and shared across reopens like a store's: eviction and stale entries show.
        self.cache = IndexFileCache(2)
        self.model = _IndexModel(4)
        self.index = self._open()
        self.position = 0  # next log position to hand out (always rising, as in a log)
        self.store_time = 1_000

    def _open(self) -> QueueIndex:
        return QueueIndex(self.fs, self.dir, entries_per_file=self.model.per_file, cache=self.cache)

    def teardown(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    @initialize(per_file=st.integers(min_value=1, max_value=6))
    def choose_file_size(self, per_file: int) -> None:
        self.model = _IndexModel(per_file)
        self.index = self._open()

    # ------------------------------------------------------------------ writing

    @rule(
        count=st.integers(min_value=1, max_value=5),
        size=st.integers(min_value=104, max_value=5000),
        gap=st.integers(min_value=0, max_value=300),
        dt=st.integers(min_value=0, max_value=50),
        tags=st.integers(min_value=0, max_value=(1 << 64) - 1),
    )
    def append(self, count: int, size: int, gap: int, dt: int, tags: int) -> None:
        position = self.position + gap
        self.position = position + size
        self.store_time += dt
        base = self.index.append(position, size, count, self.store_time, tags)
        assert base == self.model.append(position, size, count, self.store_time, tags)

    @rule(n=st.integers(min_value=2, max_value=8), count=st.integers(min_value=1, max_value=3))
    def append_many(self, n: int, count: int) -> None:
        for _ in range(n):
            self.append(count, 200, 0, 1, 1 << count)

    @rule()
    def write_pending(self) -> None:
        self.index.write_pending(sync=False)
        self.model.write_pending()
        assert not self.index.has_pending()

    @rule(data=st.data())
    def advance_min_offset(self, data: st.DataObject) -> None:
        m = self.model
        offset = data.draw(st.integers(min_value=m.min_offset - 2, max_value=m.next_offset + 2))
        self.index.advance_min_offset(offset)
        m.advance_min_offset(offset)

    @rule(write_first=st.booleans())
    def reopen(self, write_first: bool) -> None:
        if write_first:
            self.write_pending()
        self.index = self._open()
        self.model.reopen()

    @rule(write_first=st.booleans(), data=st.data())
    def reopen_and_cut(self, write_first: bool, data: st.DataObject) -> None:
        """Recovery's sequence: a fresh index, then everything at or past the position cut."""
        self.reopen(write_first)
        positions = [e.log_position for e in self.model.entries()]
        choices = [0, self.position, *positions, *(p + 1 for p in positions)]
        position = data.draw(st.sampled_from(choices))
        self.index.cut_from_position(position)
        self.model.cut_from_position(position)

    @precondition(lambda self: bool(self.model.files))
    @rule(kind=st.sampled_from(["partial", "zeros", "garbage"]), seed=st.integers(0, 2**32))
    def torn_tail_then_recover(self, kind: str, seed: int) -> None:
        """Bytes a crash may leave after the last whole entry; recovery's cut drops them."""
        self.write_pending()
        rng = random.Random(seed)
        tail = {
            "partial": rng.randbytes(rng.randint(1, 39)),
            "zeros": bytes(40 * rng.randint(1, 2)),
            "garbage": rng.randbytes(40 * rng.randint(1, 2) + rng.randint(0, 39)),
        }[kind]
        last = self.dir / f"{self.model.files[-1].name:020d}.idx"
        with last.open("ab") as f:
            f.write(tail)
        self.index = self._open()
        self.model.reopen()
        self.index.cut_from_position(self.position + 1)
        self.model.cut_from_position(self.position + 1)

    # ------------------------------------------------------------------ reading

    @rule(data=st.data(), max_entries=st.integers(min_value=1, max_value=12))
    def entries_from(self, data: st.DataObject, max_entries: int) -> None:
        m = self.model
        offset = data.draw(st.integers(min_value=max(m.min_offset - 3, 0),
                                        max_value=m.next_offset + 3))  # fmt: skip
        got = self.index.entries_from(offset, max_entries)
        assert got == m.entries_from(offset, max_entries)

    @rule(data=st.data())
    def offset_for_time(self, data: st.DataObject) -> None:
        times = [e.store_time_ms for e in self.model.entries()]
        timestamp = data.draw(
            st.sampled_from([0, self.store_time + 1, *times, *(t + 1 for t in times)])
        )
        assert self.index.offset_for_time(timestamp) == self.model.offset_for_time(timestamp)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def bounds_match(self) -> None:
        assert self.index.next_offset == self.model.next_offset
        assert self.index.min_offset == self.model.min_offset
        assert self.index.last_position == self.model.last_position

    @invariant()
    def files_match(self) -> None:
        # A queue never written has no directory yet (it is made with the first file).
        on_disk = sorted(p.name for p in self.dir.iterdir()) if self.dir.exists() else []
        assert on_disk == [f"{f.name:020d}.idx" for f in self.model.files if f.on_disk]

    @invariant()
    def every_lookup_matches(self) -> None:
        """entries_from at batch boundaries and offset_for_time at stored times (a spread of
        at most `_CHECKS` of each: the index's time lookup reads every file before the hit)."""
        m = self.model
        entries = m.entries()
        offsets = {m.min_offset - 1, m.min_offset, m.next_offset, m.next_offset + 1}
        offsets.update(o for e in entries for o in (e.base_offset, e.base_offset + e.count - 1))
        for offset in _spread(sorted(o for o in offsets if o >= 0)):
            assert self.index.entries_from(offset, 2) == m.entries_from(offset, 2)
        times = sorted({0, *(e.store_time_ms + d for e in entries for d in (0, 1))})
        for t in _spread(times):
            assert self.index.offset_for_time(t) == m.offset_for_time(t)

    @invariant()
    def all_entries_match(self) -> None:
        got = [IndexEntry(*(int(v) for v in row)) for row in self.index.all_entries().tolist()]
        assert got == self.model.entries()
        first = self.index.first_entry()
        expected = self.model.entries_from(self.model.min_offset, 1)
        assert ([first] if first is not None else []) == expected
        everything = self.index.entries_from(self.model.min_offset, _NO_LIMIT)
        assert everything == self.model.entries_from(self.model.min_offset, _NO_LIMIT)


QueueIndexMachine.TestCase.settings = settings(
    max_examples=60, stateful_step_count=40, deadline=None
)
TestQueueIndexModel = QueueIndexMachine.TestCase
