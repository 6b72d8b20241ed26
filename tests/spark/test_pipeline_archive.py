"""The archive pipeline end to end: topics -> Parquet, exactly once, resumable, replayed."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession
from typer.testing import CliRunner

from tidemq import Admin, Producer
from tidemq.cli.main import app
from tidemq.spark.pipelines.archive import META_END_OFFSET, META_START_OFFSET, run_archive

if TYPE_CHECKING:
    from tests.spark.conftest import Options

pytestmark = pytest.mark.spark


def _fill(admin: Admin, producer: Producer, topic: str, queues: int, start: int, n: int) -> None:
    if start == 0:
        admin.create_topic(topic, queues)
    for q in range(queues):
        values = [
            b"%s-%d" % (topic.encode(), i) for i in range(start, start + n) if i % queues == q
        ]
        producer.send_batch(topic, values, queue=q)


def _archived(root: Path) -> Counter[tuple[str, int, int, bytes]]:
    """(topic, queue, offset, value) of every archived row, counted."""
    table = ds.dataset(root, format="parquet", partitioning="hive").to_table()
    return Counter(
        zip(
            table["topic"].to_pylist(),
            table["partition"].to_pylist(),
            table["offset"].to_pylist(),
            table["value"].to_pylist(),
            strict=True,
        )
    )


def _check_files(root: Path) -> None:
    """Every file's name and metadata hold the offset range of its rows."""
    for path in root.rglob("*.parquet"):
        assert not path.name.startswith(".")
        _, queue, start, end = path.stem.split("-")
        table = pq.read_table(path)
        offsets = table["offset"].to_pylist()
        assert offsets == sorted(offsets)
        assert (int(start), int(end)) == (offsets[0], offsets[-1] + 1)
        assert set(table["partition"].to_pylist()) == {int(queue)}
        meta = pq.read_metadata(path).metadata
        assert meta[META_START_OFFSET.encode()] == start.encode()
        assert meta[META_END_OFFSET.encode()] == end.encode()


def _expected(topics: list[str], queues: int, n: int) -> Counter[tuple[str, int, int, bytes]]:
    out: Counter[tuple[str, int, int, bytes]] = Counter()
    for topic in topics:
        for i in range(n):
            out[(topic, i % queues, i // queues, b"%s-%d" % (topic.encode(), i))] += 1
    return out


def _uncommit(checkpoint: Path, batch: int) -> None:
    """As after a crash between the files' publish and Spark's commit log: batch
    `batch` is recorded in the offset log and not committed."""
    (checkpoint / "commits" / str(batch)).unlink()
    (checkpoint / "commits" / f".{batch}.crc").unlink(missing_ok=True)


def test_archive_exactly_once_resume_and_replay(
    spark: SparkSession,
    admin: Admin,
    producer: Producer,
    options: Options,
    topic_name: str,
    tmp_path: Path,
) -> None:
    topics = [topic_name + "-a", topic_name + "-b"]
    for t in topics:
        _fill(admin, producer, t, 2, 0, 50)
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    bootstrap = options()["bootstrap"]

    def run(min_partitions: int | None = None) -> None:
        query = run_archive(
            spark,
            bootstrap=bootstrap,
            topics=topics,
            output=output,
            checkpoint=checkpoint,
            max_offsets_per_trigger=60,
            min_partitions=min_partitions,
        )
        assert query.exception() is None

    run()
    assert _archived(output) == _expected(topics, 2, 50)
    _check_files(output)

    # Resume: only the new messages are added.
    for t in topics:
        _fill(admin, producer, t, 2, 50, 10)
    run()
    assert _archived(output) == _expected(topics, 2, 60)
    _check_files(output)

    # As after a crash between the files' publish and Spark's commit log: Spark replays
    # the last batch over the same ranges, which republishes identical files.
    commits = sorted(int(p.name) for p in (checkpoint / "commits").iterdir() if p.name.isdigit())
    before = {p: p.read_bytes() for p in output.rglob("*.parquet")}
    _uncommit(checkpoint, commits[-1])
    run()
    assert (checkpoint / "commits" / str(commits[-1])).exists()
    assert _archived(output) == _expected(topics, 2, 60)
    assert {p: p.read_bytes() for p in output.rglob("*.parquet")} == before
    assert not [p for p in output.rglob(".*") if p.is_file()]  # no temporary file left

    # A recorded batch too large for its tasks is replayed in smaller pieces: the same
    # offsets read by more tasks (other files), which replace the earlier attempt's.
    _uncommit(checkpoint, commits[-1])
    run(min_partitions=8)
    assert _archived(output) == _expected(topics, 2, 60)
    assert len(list(output.rglob("*.parquet"))) > len(before)
    _check_files(output)


def test_archive_cli(
    spark: SparkSession,
    admin: Admin,
    producer: Producer,
    options: Options,
    topic_name: str,
    tmp_path: Path,
) -> None:
    _fill(admin, producer, topic_name, 1, 0, 5)
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    args = ["pipeline", "archive", "--bootstrap", options()["bootstrap"], "--topic"]
    args += [topic_name, "--output", str(output), "--checkpoint", str(checkpoint)]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "archived 5 message(s)" in result.output
    assert _archived(output) == _expected([topic_name], 1, 5)
    assert spark.sparkContext._jsc is not None  # the CLI kept the session it did not create


def test_archive_cli_counts_every_micro_batch(
    spark: SparkSession,
    admin: Admin,
    producer: Producer,
    options: Options,
    topic_name: str,
    tmp_path: Path,
) -> None:
    """Issue 21: the totals came from the query's recent progress, which keeps the last
    100 reports (here 2), so long runs were undercounted. Every batch counts now."""
    _fill(admin, producer, topic_name, 1, 0, 12)
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    args = ["pipeline", "archive", "--bootstrap", options()["bootstrap"], "--topic"]
    args += [topic_name, "--output", str(output), "--checkpoint", str(checkpoint)]
    args += ["--max-offsets-per-trigger", "3"]
    key = "spark.sql.streaming.numRecentProgressUpdates"
    spark.conf.set(key, "2")
    try:
        result = CliRunner().invoke(app, args)
    finally:
        spark.conf.unset(key)
    assert result.exit_code == 0, result.output
    assert "archived 12 message(s) in 4 micro-batch(es)" in result.output
    assert _archived(output) == _expected([topic_name], 1, 12)
