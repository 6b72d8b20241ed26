"""The `archive` pipeline's driver killed with SIGKILL in the middle of a micro-batch, twice,
then restarted from its checkpoint: the archive holds exactly the input, once.

The driver runs in its own process (`_DRIVER` below) with `trigger="continuous"` and small
micro-batches over 2 topics x 3 queues, while the test produces more. Spark's tasks stage
a batch's files under hidden temporary names; the driver publishes them, and reports each
step on stdout (`begin`, `publish` and `tmp` for a file about to be renamed from its
hidden temporary name, `published` once renamed into place, `end`) and stops dead at a
point the test chooses, where the test checks the state and kills it with its JVM (its
whole process group):

1. mid-file: two files of batch N published, the third written under its temporary name
   but not renamed, Spark's offset log holding batch N and its commit log not;
2. after a whole batch is published but before Spark's commit log records it.

A last driver then runs with AvailableNow from the same checkpoint to the end. Each
restart first replays the uncommitted batch over the same ranges: the same rows, hence the
same file names with the same bytes, so nothing is duplicated or lost, and what a kill
leaves behind is only hidden temporary files that readers skip.

To fit the time budget, the three drivers start together: each builds its session and
warms up (the same pipeline over a topic, a directory and a checkpoint of its own), then
waits for the test's "go" before it starts the query under test. A restarted driver is
still a new process with a new JVM that opens the checkpoint only after the kill.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from tidemq import Admin, Producer
from tidemq.spark.pipelines.archive import (
    META_END_OFFSET,
    META_QUEUE,
    META_START_OFFSET,
    META_TOPIC,
    hour_partition,
)

if TYPE_CHECKING:
    from tests.spark.conftest import ThreadedBroker

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

QUEUES = 3
FIRST = 900  # messages per topic before the first driver starts
SECOND = 600  # messages per topic produced while it runs
LIMIT = 300  # maxOffsetsPerTrigger of the killed drivers: 50 rows per queue and batch
# How long a stopped driver is left alone before it is killed: time enough for Spark to
# commit the batch and start the next if the pipeline let it before its files are out.
SETTLE_S = 1.0
STEP_S = 180.0  # the longest wait for a driver's next step (3 JVMs start at once)

Row = tuple[str, int, int, bytes]

_DRIVER = r"""
import os, sys, time
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
from pathlib import Path
import pyarrow.parquet as pq
from pyspark.sql import SparkSession
from tidemq.spark.pipelines import archive

bootstrap, topics, output, checkpoint, trigger, limit, stop_at, warm = sys.argv[1:9]
root = Path(output)
stop_at = tuple(stop_at.split(":"))  # ("tmp", call, file) | ("end", call) | ("",)


def say(*words):
    print("KILL9", *words, flush=True)


def stop_here():
    say("stopped")
    time.sleep(3600)  # until the test kills the process group
    os._exit(3)


calls = 0
publish = archive.publish


def traced_publish(staged):
    # The driver's publish of one batch (its tasks staged the files): file by file, so
    # that the test can stop it between two renames.
    global calls
    calls += 1
    say("begin", calls, sum(s.file.rows for s in staged))
    for n, s in enumerate(staged, 1):
        target = s.file.path.relative_to(root)
        say("publish", calls, n, target)
        say("tmp", calls, n, s.tmp.relative_to(root))
        if stop_at == ("tmp", str(calls), str(n)):
            stop_here()
        publish([s])
        say("published", calls, n, target)
    say("end", calls, len(staged))
    if stop_at == ("end", str(calls)):
        stop_here()


spark = (
    SparkSession.builder.master("local[2]").appName("archive-kill9-driver")
    .config("spark.ui.enabled", "false")
    .config("spark.ui.showConsoleProgress", "false")
    .config("spark.sql.shuffle.partitions", "2")
    .config("spark.sql.session.timeZone", "UTC")
    .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xss16m")
    .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    .getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")
# Warm up (the test starts a restarted driver while the one before it still runs): the
# same pipeline over a topic of its own, into a directory and a checkpoint of its own.
archive.run_archive(
    spark, bootstrap=bootstrap, topics=[warm], output=root.parent / f"{warm}-{os.getpid()}",
    checkpoint=root.parent / f"{warm}-checkpoint-{os.getpid()}",
)
archive.publish = traced_publish
say("ready")
if sys.stdin.readline().strip() != "go":
    sys.exit(2)
query = archive.run_archive(
    spark, bootstrap=bootstrap, topics=topics.split(","), output=output,
    checkpoint=checkpoint, trigger=trigger, max_offsets_per_trigger=int(limit),
)
if trigger == "continuous":
    say("started")
    query.awaitTermination()
else:
    assert query.exception() is None
    say("finished")
spark.stop()
"""


class _Driver:
    """One driver process (and its JVM, in its process group), and its `KILL9` lines."""

    def __init__(self, tmp: Path, name: str, args: list[str]) -> None:
        # A file per driver: rewriting one shared file while an earlier driver's
        # interpreter is still reading it gave that driver an empty script (exit 0, no
        # output; seen once in CI).
        script = tmp / f"{name}.py"
        script.write_text(_DRIVER)
        self.name = name
        self.log = tmp / f"{name}.log"
        with self.log.open("wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(script), *args],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                start_new_session=True,  # its JVM is in its group: one SIGKILL takes both
                text=True,
                encoding="utf-8",
                errors="replace",
            )
        self.lines: list[list[str]] = []  # the words after "KILL9", in order
        self._queue: queue.Queue[list[str] | None] = queue.Queue()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("KILL9 "):
                self._queue.put(line.split()[1:])
        self._queue.put(None)  # EOF: every process holding the pipe is gone

    def _failure(self, what: str) -> str:
        tail = self.log.read_text(errors="replace")[-3000:]
        return f"driver {self.name}: {what}; its lines: {self.lines[-8:]}\n{tail}"

    def wait_for(self, *words: str) -> list[str]:
        """The driver's next line that starts with `words` (the lines before it are kept)."""
        deadline = time.monotonic() + STEP_S
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(self._failure(f"no {words} within {STEP_S} s"))
            if line is None:
                pytest.fail(self._failure(f"exited ({self.proc.wait()}) before {words}"))
            self.lines.append(line)
            if line[: len(words)] == list(words):
                return line

    def go(self) -> None:
        """Let it start its query, once its session is up."""
        self.wait_for("ready")
        assert self.proc.stdin is not None
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        """SIGKILL to the whole process group, then the lines it printed before dying."""
        if self.proc.poll() is None:  # not reaped: its id still names its group
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)
        self._reader.join(30)
        while not self._queue.empty():
            if (line := self._queue.get_nowait()) is not None:
                self.lines.append(line)
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):  # broken pipe
                    pipe.close()

    def files(self, kind: str, call: int) -> list[str]:
        """The paths of its `kind` lines (publish, tmp, published) of write_table call
        `call`, in file order."""
        return [w[3] for w in self.lines if w[0] == kind and w[1] == str(call)]


def _fill(producer: Producer, topics: list[str], start: int, n: int) -> Counter[Row]:
    """Produce messages `start`..`start+n-1` of each topic (message i to queue i % QUEUES);
    what was stored, as (topic, queue, offset, value)."""
    out: Counter[Row] = Counter()
    for topic in topics:
        for q in range(QUEUES):
            values = [b"%s-%d" % (topic.encode(), i) for i in range(start, start + n)]
            values = [v for i, v in enumerate(values, start) if i % QUEUES == q]
            receipts = producer.send_batch(topic, values, queue=q)
            out.update(
                (r.topic, r.queue, r.offset, v) for r, v in zip(receipts, values, strict=True)
            )
    return out


def _archived(root: Path) -> Counter[Row]:
    """(topic, queue, offset, value) of every row a reader sees (hidden files skipped)."""
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
    """Every published file sits in its rows' topic/dt/hour directory, under the name and
    with the metadata of its rows' queue and offset range; everything else is a hidden
    temporary file."""
    for path in root.rglob("*"):
        if path.is_dir():
            continue
        rel = path.relative_to(root)
        if path.name.startswith("."):
            assert fnmatch.fnmatch(path.name, ".part-*.parquet.tmp-*"), f"stray {rel}"
            continue
        assert fnmatch.fnmatch(path.name, "part-*-*-*.parquet"), f"stray {rel}"
        _, queue, start, end = path.stem.split("-")
        table = pq.read_table(path)
        offsets = table["offset"].to_pylist()
        assert offsets == sorted(set(offsets)), rel
        assert (int(start), int(end)) == (offsets[0], offsets[-1] + 1), rel
        assert set(table["partition"].to_pylist()) == {int(queue)}, rel
        (topic,) = set(table["topic"].to_pylist())
        hours = {hour_partition(ts) for ts in table["timestamp"].to_pylist()}
        assert [(f"topic={topic}", f"dt={dt}", f"hour={h:02d}") for dt, h in hours] == [
            rel.parts[:3]
        ], rel
        meta = pq.read_metadata(path).metadata
        assert meta[META_TOPIC.encode()] == topic.encode(), rel
        assert meta[META_QUEUE.encode()] == queue.encode(), rel
        assert meta[META_START_OFFSET.encode()] == start.encode(), rel
        assert meta[META_END_OFFSET.encode()] == end.encode(), rel


def _published(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("part-*.parquet")}


def _log(checkpoint: Path, name: str) -> set[int]:
    """The batch ids in the checkpoint's `offsets` or `commits` log."""
    directory = checkpoint / name
    return {int(p.name) for p in directory.iterdir() if p.name.isdigit()}


def _uncommitted(checkpoint: Path) -> int:
    """The one batch of the offset log that the commit log lacks: the last one."""
    offsets, commits = _log(checkpoint, "offsets"), _log(checkpoint, "commits")
    assert offsets - commits == {max(offsets)}, (sorted(offsets), sorted(commits))
    return max(offsets)


def _no_duplicate_and_nothing_foreign(root: Path, expected: Counter[Row]) -> None:
    """What a reader sees at any time: a part of the input, each message at most once."""
    seen = _archived(root)
    assert max(seen.values()) == 1, [r for r, n in seen.items() if n > 1][:5]
    assert set(seen) <= set(expected), list(set(seen) - set(expected))[:5]


def test_archive_driver_killed_mid_batch_restarts_exactly_once(
    broker: ThreadedBroker, admin: Admin, producer: Producer, topic_name: str, tmp_path: Path
) -> None:
    topics = [topic_name + "-a", topic_name + "-b"]
    for topic in topics:
        admin.create_topic(topic, QUEUES)
    expected = _fill(producer, topics, 0, FIRST)
    warm = topic_name + "-warm"
    admin.create_topic(warm, 1)
    producer.send_batch(warm, [b"warm"])
    output, checkpoint = tmp_path / "out", tmp_path / "checkpoint"
    base = [broker.address, ",".join(topics), str(output), str(checkpoint)]
    drivers: list[_Driver] = []

    def start(trigger: str, limit: int, stop_at: str) -> _Driver:
        args = [*base, trigger, str(limit), stop_at, warm]
        drivers.append(_Driver(tmp_path, f"driver-{len(drivers)}", args))
        return drivers[-1]

    try:
        # All three start (and warm up) now; each starts its query when told to.
        first = start("continuous", LIMIT, "tmp:2:3")
        second = start("continuous", LIMIT, "end:2")
        third = start("available_now", 100_000, "")

        # Kill 1, mid-file: in the second batch, files 1-2 published, file 3 written under
        # its temporary name and not renamed.
        first.go()
        first.wait_for("end", "1")
        expected += _fill(producer, topics, FIRST, SECOND)  # while it runs
        first.wait_for("stopped")
        time.sleep(SETTLE_S)
        assert _uncommitted(checkpoint) == 1  # write_table's call 2 is batch 1
        *published, cut = first.files("publish", 2)
        (tmp,) = first.files("tmp", 2)[2:]
        assert first.files("published", 2) == published
        assert len(published) == 2
        assert Path(tmp).name.startswith(f".{Path(cut).name}.tmp-")
        first.kill()
        # It died where it stopped: a "publish" without its "published", and no "end".
        assert first.lines[-3:] == [["publish", "2", "3", cut], ["tmp", "2", "3", tmp], ["stopped"]]
        assert (output / tmp).is_file()  # left behind, hidden
        assert not (output / cut).exists()
        _no_duplicate_and_nothing_foreign(output, expected)
        _check_files(output)
        before = _published(output)
        assert all(output / p in before for p in published)

        # Kill 2, between publish and commit: the replay of that batch, then the next one
        # published entirely, and the driver dies before Spark's commit log records it.
        second.go()
        second.wait_for("end", "1")
        replayed = second.files("published", 1)
        assert replayed[:3] == [*published, cut]  # the same files again, then the rest
        assert second.files("publish", 1) == replayed
        begins = [w[2] for w in (*first.lines, *second.lines) if w[0] == "begin"]
        assert begins[1] == begins[2]  # the same rows
        second.wait_for("stopped")
        time.sleep(SETTLE_S)
        assert _uncommitted(checkpoint) == 2  # batch 1 again, then batch 2
        last = second.files("published", 2)
        assert last
        assert second.files("publish", 2) == last
        second.kill()
        assert second.lines[-2:] == [["end", "2", str(len(last))], ["stopped"]]
        assert all((output / p).is_file() for p in last)
        _no_duplicate_and_nothing_foreign(output, expected)
        _check_files(output)
        assert {p: b for p, b in _published(output).items() if p in before} == before
        before = _published(output)

        # To the end: that batch replayed, then the rest in one batch.
        third.go()
        third.wait_for("finished")  # its query ended without error (no need to wait more)
        third.kill()
        assert third.files("published", 1) == last
        assert next(w[2] for w in third.lines if w[0] == "begin") == begins[-1]
    finally:
        for d in drivers:
            d.kill()

    assert _archived(output) == expected
    _check_files(output)
    assert {p: b for p, b in _published(output).items() if p in before} == before
    assert not _log(checkpoint, "offsets") - _log(checkpoint, "commits")
