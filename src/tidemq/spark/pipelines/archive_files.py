"""The `archive` pipeline's files: their layout, their staging under hidden temporary names
and their publishing. Pure pyarrow (no JVM): staging runs in Spark's tasks, publishing on
the driver (see `archive` for how the two make the output exactly once).

Layout (conventions §7), Hive-style so that Spark, DuckDB and pyarrow read it::

    <output>/topic=<t>/dt=YYYY-MM-DD/hour=HH/part-<queue>-<startOffset>-<endOffset>.parquet

zstd-compressed, with the source's columns (conventions §4, headers included). A file
holds the messages of one queue whose timestamp (UTC) falls in one hour, out of one
task's offset range, in offset order; `startOffset` is the smallest offset in it and
`endOffset` the largest plus one. The same range and the topic/queue are in the Parquet
key-value metadata (`tidemq.topic`, `tidemq.queue`, `tidemq.start_offset`,
`tidemq.end_offset`).

`Stager` writes the files as the rows come, one fetch answer at a time, so a task holds
about one row group per open file (`GROUP_BYTES`), not its whole range. Row groups are
cut where the rows' sizes say, not where fetch answers ended, so the same rows give the
same bytes whatever the answers' sizes were: a replayed batch publishes identical files.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

__all__ = [
    "GROUP_BYTES",
    "GROUP_ROWS",
    "META_END_OFFSET",
    "META_QUEUE",
    "META_START_OFFSET",
    "META_TOPIC",
    "STALE_TMP_S",
    "ArchiveFile",
    "GroupSize",
    "Staged",
    "Stager",
    "hour_partition",
    "part_path",
    "publish",
    "skip_temporary",
    "stage_file",
    "stage_table",
    "write_table",
]

#: Temporary files older than this, left by a crashed attempt, are removed by the next
#: publish into their directory (an attempt in flight is far younger).
STALE_TMP_S: Final = 3600.0
#: A row group is cut once its rows' keys and values reach this many bytes (plus
#: `_ROW_OVERHEAD` a row) or `GROUP_ROWS` rows: what a task holds per open file.
GROUP_BYTES: Final = 64 * 1024 * 1024
#: pyarrow's own default row group length.
GROUP_ROWS: Final = 1024 * 1024
#: What a row's other columns count for in `GROUP_BYTES` (offset, timestamp, topic...).
_ROW_OVERHEAD: Final = 64

META_TOPIC = "tidemq.topic"
META_QUEUE = "tidemq.queue"
META_START_OFFSET = "tidemq.start_offset"
META_END_OFFSET = "tidemq.end_offset"


@dataclass(frozen=True, slots=True)
class ArchiveFile:
    """One published file: messages of `topic`/`queue` in [start_offset, end_offset)
    whose timestamps fall in hour `hour` (0-23) of day `dt` (YYYY-MM-DD, UTC)."""

    topic: str
    queue: int
    dt: str
    hour: int
    start_offset: int
    end_offset: int
    rows: int
    path: Path


@dataclass(frozen=True, slots=True)
class Staged:
    """A file written under a temporary name, to be published as `file.path`."""

    tmp: Path
    file: ArchiveFile


def hour_partition(ts: datetime) -> tuple[str, int]:
    """The (`dt`, `hour`) partition of a timestamp, in UTC (naive means UTC)."""
    utc = ts.replace(tzinfo=UTC) if ts.tzinfo is None else ts.astimezone(UTC)
    return utc.strftime("%Y-%m-%d"), utc.hour


def _directory(root: Path, topic: str, dt: str, hour: int) -> Path:
    if not 0 <= hour < 24:
        raise ValueError(f"hour must be 0-23, got {hour}")
    if not topic or "/" in topic or topic in (".", ".."):
        raise ValueError(f"bad topic name {topic!r}")
    return root / f"topic={topic}" / f"dt={dt}" / f"hour={hour:02d}"


def part_path(
    root: Path, *, topic: str, queue: int, dt: str, hour: int, start_offset: int, end_offset: int
) -> Path:
    """Where the file of that range goes (conventions §7)."""
    directory = _directory(root, topic, dt, hour)
    if not 0 <= start_offset < end_offset:
        raise ValueError(f"bad offset range [{start_offset}, {end_offset})")
    return directory / f"part-{queue}-{start_offset}-{end_offset}.parquet"


# --------------------------------------------------------------------------- staging


def _row_bytes(batch: pa.RecordBatch) -> pa.Array:
    """What each row counts for in `GROUP_BYTES`: a function of the row alone."""
    size: pa.Array = pa.array(np.full(batch.num_rows, _ROW_OVERHEAD, dtype=np.int64))
    for name in ("key", "value"):
        index = batch.schema.get_field_index(name)
        if index >= 0 and pa.types.is_binary(batch.schema.field(index).type):
            length = pc.fill_null(pc.binary_length(batch.column(index)), 0)
            size = pc.add(size, length.cast(pa.int64()))
    return size


@dataclass(frozen=True, slots=True)
class GroupSize:
    """Where `Stager` cuts row groups: at `rows` rows, or once the rows' keys and values
    reach `bytes` (plus `_ROW_OVERHEAD` a row), whichever comes first."""

    rows: int = GROUP_ROWS
    bytes: int = GROUP_BYTES


class _File:
    """One staged file in the making: rows of one (topic, queue, hour), in offset order,
    appended to a ParquetWriter under a hidden temporary name."""

    def __init__(
        self, directory: Path, topic: str, queue: int, slot: datetime, group: GroupSize
    ) -> None:
        self.directory = directory
        self.topic = topic
        self.queue = queue
        self.dt, self.hour = hour_partition(slot)
        self.group = group
        self.tmp: Path | None = None
        self.writer: pq.ParquetWriter | None = None
        self.start = -1
        self.last = -1
        self.rows = 0
        # Rows not written yet (less than a row group), with each row's size.
        self.pending: list[pa.RecordBatch] = []
        self.sizes: list[pa.Array] = []
        self.pending_rows = 0
        self.pending_bytes = 0

    def add(self, batch: pa.RecordBatch) -> None:
        offsets = batch.column("offset")
        first = offsets[0].as_py()
        ordered = len(offsets) < 2 or pc.all(pc.less(offsets[:-1], offsets[1:])).as_py()
        if first <= self.last or not ordered:
            raise ValueError(
                f"rows of {self.topic}/{self.queue} must come in increasing offset order"
            )
        if self.writer is None:
            self.directory.mkdir(parents=True, exist_ok=True)
            name = f".part-{self.queue}-{first}.parquet.tmp-{uuid.uuid4().hex}"
            self.tmp = self.directory / name
            self.writer = pq.ParquetWriter(self.tmp, batch.schema, compression="zstd")
            self.start = first
        self.last = offsets[-1].as_py()
        self.rows += batch.num_rows
        sizes = _row_bytes(batch)
        self.pending.append(batch)
        self.sizes.append(sizes)
        self.pending_rows += batch.num_rows
        self.pending_bytes += pc.sum(sizes).as_py()
        while self.pending_rows >= self.group.rows or self.pending_bytes >= self.group.bytes:
            self._write_group()

    def _write_group(self) -> None:
        """Write the first row group of the pending rows: `group.rows` rows, or fewer
        whose sizes reach `group.bytes`; keep the rest pending."""
        assert self.writer is not None
        table = pa.Table.from_batches(self.pending)
        cumulative = pc.cumulative_sum(pa.concat_arrays(self.sizes))
        full = pc.index(pc.greater_equal(cumulative, self.group.bytes), True).as_py()
        cut = min(self.group.rows, table.num_rows if full < 0 else full + 1)
        self.writer.write_table(table.slice(0, cut), row_group_size=cut)
        self.pending = table.slice(cut).to_batches()
        rest = pa.concat_arrays(self.sizes).slice(cut)
        self.sizes = [rest]
        self.pending_rows = len(rest)
        self.pending_bytes = pc.sum(rest).as_py() or 0

    def _write_rest(self) -> None:
        assert self.writer is not None
        if self.pending_rows:
            table = pa.Table.from_batches(self.pending)
            self.writer.write_table(table, row_group_size=table.num_rows)
        self.pending, self.sizes, self.pending_rows, self.pending_bytes = [], [], 0, 0

    def close(self, root: Path) -> Staged:
        """Finish the file; renamed to `.<its target's name>.tmp-<random>` (what the
        driver publishes)."""
        assert self.writer is not None
        assert self.tmp is not None
        self._write_rest()
        end = self.last + 1
        self.writer.add_key_value_metadata(
            {
                META_TOPIC: self.topic,
                META_QUEUE: str(self.queue),
                META_START_OFFSET: str(self.start),
                META_END_OFFSET: str(end),
            }
        )
        self.writer.close()
        self.writer = None
        target = part_path(
            root,
            topic=self.topic,
            queue=self.queue,
            dt=self.dt,
            hour=self.hour,
            start_offset=self.start,
            end_offset=end,
        )
        tmp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex}")
        os.replace(self.tmp, tmp)
        self.tmp = tmp
        file = ArchiveFile(
            self.topic, self.queue, self.dt, self.hour, self.start, end, self.rows, target
        )
        return Staged(tmp, file)

    def abort(self) -> None:
        if self.writer is not None:
            with contextlib.suppress(Exception):
                self.writer.close()
            self.writer = None
        if self.tmp is not None:
            self.tmp.unlink(missing_ok=True)


def _same(column: pa.Array) -> bool:
    return len(column) < 2 or bool(pc.all(pc.equal(column, column[0])).as_py())


class Stager:
    """Stages rows (the source's columns) under `root`, one file per (topic, queue,
    dt, hour) of the message timestamp (UTC). Rows of each (topic, queue) must come in
    increasing offset order, as a task reads its range; each batch goes straight to its
    file's writer. `close` finishes the files; `abort` removes them.

    Deterministic: the same rows give the same target names and the same bytes."""

    def __init__(self, root: Path, group: GroupSize | None = None) -> None:
        self.root = root
        self.group = group or GroupSize()
        self._files: dict[tuple[str, int, datetime], _File] = {}

    def add(self, batch: pa.RecordBatch) -> None:
        if batch.num_rows == 0:
            return
        ts = batch.column("timestamp")
        if not pa.types.is_timestamp(ts.type):
            raise ValueError(f"column 'timestamp' must be a timestamp, got {ts.type}")
        if ts.type.tz != "UTC":  # none: Spark's UTC wall-clock values
            ts = ts.cast(pa.timestamp(ts.type.unit, tz="UTC"))
        # Grouped by the hour's start, formatted once per file: formatting every row's day
        # (strftime) took a third of a task's staging time (0.11 of 0.31 s for 75,000 rows).
        slots = pc.floor_temporal(ts, unit="hour")
        topics, queues = batch.column("topic"), batch.column("partition")
        if _same(slots) and _same(topics) and _same(queues):
            # A task reads one queue, whose rows mostly fall in one hour: no copy.
            self._file(topics[0].as_py(), queues[0].as_py(), slots[0].as_py()).add(batch)
            return
        keyed = pa.table({"topic": topics, "queue": queues, "slot": slots})
        keys = keyed.group_by(["topic", "queue", "slot"], use_threads=False).aggregate([])
        for key in keys.sort_by([("topic", "ascending"), ("queue", "ascending")]).to_pylist():
            mask = pc.and_(
                pc.and_(pc.equal(topics, key["topic"]), pc.equal(queues, key["queue"])),
                pc.equal(slots, pa.scalar(key["slot"], slots.type)),
            )
            self._file(key["topic"], key["queue"], key["slot"]).add(batch.filter(mask))

    def _file(self, topic: str, queue: int, slot: datetime) -> _File:
        key = (topic, queue, slot)
        file = self._files.get(key)
        if file is None:
            dt, hour = hour_partition(slot)
            directory = _directory(self.root, topic, dt, hour)
            file = self._files[key] = _File(directory, topic, queue, slot, self.group)
        return file

    def close(self) -> list[Staged]:
        """Finish every file, in (topic, queue, hour) order."""
        try:
            return [self._files[key].close(self.root) for key in sorted(self._files)]
        except BaseException:
            self.abort()
            raise

    def abort(self) -> None:
        """Remove what was staged (a failed task: its retry stages everything again)."""
        for file in self._files.values():
            file.abort()
        self._files.clear()


def stage_table(table: pa.Table, root: Path, group: GroupSize | None = None) -> list[Staged]:
    """Stage rows (the source's columns, in any order) under `root` (see `Stager`)."""
    if table.num_rows == 0:
        return []
    ordered = table.sort_by(
        [("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")]
    )
    stager = Stager(root, group)
    try:
        for batch in ordered.to_batches():
            stager.add(batch)
    except BaseException:
        stager.abort()
        raise
    return stager.close()


def write_table(table: pa.Table, root: Path) -> list[ArchiveFile]:
    """Stage and publish the rows of one micro-batch in one process (see `stage_table`,
    `publish`)."""
    staged = stage_table(table, root)
    publish(staged)
    return [s.file for s in staged]


# --------------------------------------------------------------------------- publishing


def publish(staged: Sequence[Staged]) -> None:
    """Rename staged files into place (atomic on one file system; a replayed batch's file
    replaces an identical one), after removing published files of the same topic and
    queue whose offset ranges overlap theirs (an earlier attempt split otherwise)."""
    by_dir: dict[Path, list[Staged]] = {}
    for s in staged:
        by_dir.setdefault(s.file.path.parent, []).append(s)
    try:
        for directory, files in by_dir.items():
            _remove_overlapping(directory, files)
            for s in files:
                os.replace(s.tmp, s.file.path)
    except BaseException:
        for s in staged:  # what is not published yet: the replay stages it again
            s.tmp.unlink(missing_ok=True)
        raise


def stage_file(table: pa.Table, target: Path) -> Path:
    """Write `table` (zstd) under a hidden temporary name next to `target`, creating the
    directory; returns that name. Readers (Spark, DuckDB, pyarrow) skip it. (The
    analytics pipeline's tasks stage their outputs with it.)"""
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex}")
    try:
        pq.write_table(table, tmp, compression="zstd")
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def skip_temporary(entry: Path, now: float) -> bool:
    """Whether `entry` is a staged temporary file; one older than `STALE_TMP_S`, left by
    a crashed attempt, is removed."""
    name = entry.name
    if not (name.startswith(".") and ".tmp-" in name):
        return False
    with contextlib.suppress(FileNotFoundError):  # published or removed meanwhile
        if now - entry.stat().st_mtime > STALE_TMP_S:
            entry.unlink(missing_ok=True)
    return True


def _remove_overlapping(directory: Path, files: list[Staged]) -> None:
    new = {s.file.path.name for s in files}
    now = time.time()
    for existing in directory.iterdir():
        name = existing.name
        if skip_temporary(existing, now):
            continue
        parsed = _parse_part(name)
        if parsed is None or name in new:
            continue
        queue, start, end = parsed
        for s in files:
            f = s.file
            if f.queue == queue and start < f.end_offset and f.start_offset < end:
                existing.unlink(missing_ok=True)
                break


def _parse_part(name: str) -> tuple[int, int, int] | None:
    """(queue, start, end) of a `part-<queue>-<start>-<end>.parquet` name."""
    if not (name.startswith("part-") and name.endswith(".parquet")):
        return None
    fields = name[len("part-") : -len(".parquet")].split("-")
    if len(fields) != 3 or not all(f.isdigit() for f in fields):
        return None
    return int(fields[0]), int(fields[1]), int(fields[2])
