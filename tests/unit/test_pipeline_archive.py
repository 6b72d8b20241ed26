"""The archive pipeline's file layout, metadata and idempotent publish (no JVM)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from tidemq.spark.pipelines.archive import (
    META_END_OFFSET,
    META_QUEUE,
    META_START_OFFSET,
    META_TOPIC,
    hour_partition,
    part_path,
    publish,
    stage_table,
    write_table,
)
from tidemq.spark.pipelines.archive_files import GroupSize, Stager

T0 = datetime(2026, 3, 1, 23, 59, 59, tzinfo=UTC)


def _table(rows: list[tuple[str, int, int, datetime]]) -> pa.Table:
    return pa.table(
        {
            "key": pa.array([None] * len(rows), pa.binary()),
            "value": pa.array([b"v%d" % r[2] for r in rows], pa.binary()),
            "topic": pa.array([r[0] for r in rows], pa.string()),
            "partition": pa.array([r[1] for r in rows], pa.int32()),
            "offset": pa.array([r[2] for r in rows], pa.int64()),
            "timestamp": pa.array([r[3] for r in rows], pa.timestamp("us", tz="UTC")),
            "timestampType": pa.array([0] * len(rows), pa.int32()),
        }
    )


def test_part_path_layout() -> None:
    path = part_path(
        Path("/r"),
        topic="orders",
        queue=3,
        dt="2026-03-01",
        hour=7,
        start_offset=100,
        end_offset=250,
    )
    assert path == Path("/r/topic=orders/dt=2026-03-01/hour=07/part-3-100-250.parquet")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("t", 0, "2026-03-01", 24, 0, 1), "hour"),
        (("t", 0, "2026-03-01", 1, 5, 5), "offset range"),
        (("a/b", 0, "2026-03-01", 1, 0, 1), "topic"),
    ],
)
def test_part_path_rejects(args: tuple[str, int, str, int, int, int], message: str) -> None:
    topic, queue, dt, hour, start, end = args
    with pytest.raises(ValueError, match=message):
        part_path(
            Path("/r"),
            topic=topic,
            queue=queue,
            dt=dt,
            hour=hour,
            start_offset=start,
            end_offset=end,
        )


def test_hour_partition_is_utc() -> None:
    assert hour_partition(T0) == ("2026-03-01", 23)
    plus2 = timezone(timedelta(hours=2))
    assert hour_partition(datetime(2026, 3, 2, 0, 30, tzinfo=plus2)) == ("2026-03-01", 22)
    assert hour_partition(datetime(2026, 3, 1, 5, 0)) == ("2026-03-01", 5)


def _rows() -> list[tuple[str, int, int, datetime]]:
    later = T0 + timedelta(seconds=1)  # the next hour, and the next day
    return [
        ("a", 0, 10, T0),
        ("a", 0, 11, T0),
        ("a", 0, 12, later),
        ("a", 1, 4, T0),
        ("b", 0, 7, later),
        ("b", 0, 8, later),
    ]


def test_write_table_files_and_metadata(tmp_path: Path) -> None:
    files = write_table(_table(_rows()[::-1]), tmp_path)
    names = sorted(str(f.path.relative_to(tmp_path)) for f in files)
    assert names == [
        "topic=a/dt=2026-03-01/hour=23/part-0-10-12.parquet",
        "topic=a/dt=2026-03-01/hour=23/part-1-4-5.parquet",
        "topic=a/dt=2026-03-02/hour=00/part-0-12-13.parquet",
        "topic=b/dt=2026-03-02/hour=00/part-0-7-9.parquet",
    ]
    by_name = {f.path.name: f for f in files}
    assert by_name["part-0-10-12.parquet"].rows == 2
    meta = pq.read_metadata(tmp_path / names[0]).metadata
    assert meta[META_TOPIC.encode()] == b"a"
    assert meta[META_QUEUE.encode()] == b"0"
    assert meta[META_START_OFFSET.encode()] == b"10"
    assert meta[META_END_OFFSET.encode()] == b"12"
    assert pq.read_metadata(tmp_path / names[0]).row_group(0).column(0).compression == "ZSTD"
    assert pq.read_table(tmp_path / names[0]).column("offset").to_pylist() == [10, 11]

    table = ds.dataset(tmp_path, format="parquet", partitioning="hive").to_table()
    got = sorted(zip(table["topic"].to_pylist(), table["offset"].to_pylist(), strict=True))
    assert got == sorted((r[0], r[2]) for r in _rows())
    assert set(table["hour"].to_pylist()) == {0, 23}


def test_replayed_batch_replaces_identical_files(tmp_path: Path) -> None:
    first = write_table(_table(_rows()), tmp_path)
    before = {f.path: f.path.read_bytes() for f in first}
    again = write_table(_table(_rows()[::-1]), tmp_path)  # same rows, any order
    assert [f.path for f in again] == [f.path for f in first]
    assert {f.path: f.path.read_bytes() for f in again} == before
    assert sorted(p for p in tmp_path.rglob("*") if p.is_file()) == sorted(before)  # no tmp


def test_empty_batch_writes_nothing(tmp_path: Path) -> None:
    assert write_table(_table([]), tmp_path) == []
    assert list(tmp_path.iterdir()) == []


def test_failed_write_leaves_no_temporary_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: object, **kwargs: object) -> None:
        raise OSError("disk full")

    monkeypatch.setattr("os.replace", broken)
    with pytest.raises(OSError, match="disk full"):
        write_table(_table(_rows()[:1]), tmp_path)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_a_replay_split_otherwise_replaces_the_earlier_files(tmp_path: Path) -> None:
    """A batch published by one attempt as one file per queue and hour, then by a replay
    whose tasks split queue a/0's hour in two: its earlier file goes (it overlaps both new
    ones), queue a/1's file beside it stays, and every message is read once."""
    table = _table(_rows())
    first = write_table(table, tmp_path)
    staged = stage_table(table.slice(0, 1), tmp_path) + stage_table(table.slice(1), tmp_path)
    publish(staged)
    names = sorted(p.name for p in tmp_path.rglob("*.parquet"))
    assert "part-0-10-12.parquet" in {f.path.name for f in first}
    assert "part-0-10-12.parquet" not in names  # replaced by part-0-10-11 and part-0-11-12
    assert {"part-0-10-11.parquet", "part-0-11-12.parquet", "part-1-4-5.parquet"} <= set(names)
    read = ds.dataset(tmp_path, format="parquet", partitioning="hive").to_table()
    offsets = list(
        zip(*(read.column(c).to_pylist() for c in ("topic", "partition", "offset")), strict=True)
    )
    assert sorted(offsets) == sorted((r[0], r[1], r[2]) for r in _rows())  # once each
    assert not [p for p in tmp_path.rglob(".*") if p.is_file()]


def _queue_rows(n: int) -> pa.Table:
    """`n` rows of queue a/0 in one hour, values of growing sizes."""
    table = _table([("a", 0, i, T0) for i in range(n)])
    values = pa.array([b"x" * (i % 7 * 100) for i in range(n)], pa.binary())
    return table.set_column(table.schema.get_field_index("value"), "value", values)


def _staged_bytes(root: Path, table: pa.Table, chunks: list[int], group: GroupSize) -> bytes:
    """The one file staged from `table` fed to a Stager in batches of `chunks` rows."""
    stager = Stager(root, group)
    at = 0
    for n in chunks:
        for batch in table.slice(at, n).to_batches():
            stager.add(batch)
        at += n
    (staged,) = stager.close()
    assert staged.file.rows == table.num_rows
    return staged.tmp.read_bytes()


def test_row_groups_do_not_depend_on_how_the_rows_came(tmp_path: Path) -> None:
    """A replayed task's fetch answers may end elsewhere: its file is the same."""
    table = _queue_rows(100)
    group = GroupSize(rows=30, bytes=2_000)
    one = _staged_bytes(tmp_path / "one", table, [100], group)
    split = _staged_bytes(tmp_path / "split", table, [1, 13, 50, 2, 34], group)
    assert one == split
    (path,) = (tmp_path / "one").rglob(".part-*")
    meta = pq.read_metadata(path)
    sizes = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
    assert sum(sizes) == 100
    assert len(sizes) > 100 // 30  # cut by bytes as well as by rows
    assert max(sizes) <= 30
    assert pq.read_table(path).column("offset").to_pylist() == list(range(100))


def test_stager_refuses_rows_out_of_order_and_abort_leaves_nothing(tmp_path: Path) -> None:
    table = _queue_rows(10)
    stager = Stager(tmp_path)
    stager.add(table.slice(5).to_batches()[0])
    with pytest.raises(ValueError, match="increasing offset order"):
        stager.add(table.slice(0, 5).to_batches()[0])
    assert [p for p in tmp_path.rglob("*") if p.is_file()]  # the file in the making
    stager.abort()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
