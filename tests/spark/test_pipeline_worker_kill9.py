"""kill -9 of Spark's Python workers in the middle of `archive` and `analytics` tasks: Spark
runs each killed task again and the output is exactly once.

The pipeline runs in a driver process of its own (`worker_kill_job.py`, `local[2,4]`: a
task may fail up to 3 times) whose Python workers are `tests/support/spark_task_gate.py`.
The test arms the gate; the next task attempt to produce output claims it and waits,
its work done (an archive task has staged its Parquet files) and its result not yet
sent; the test sees the claim, SIGKILLs that worker and arms the gate again, KILLS times
(archive 5, 40 under TIDEMQ_SOAK=1; analytics only under soak, 4 rounds of 10), at most
once per task attempt. Archive's killed tasks are its source's, which fetch their ranges
and stage the Parquet files in one Python worker (ADR 21), killed with the files staged
and not yet reported; analytics' are the tidemq source's reads. Then: Spark's event log
shows one failed task attempt per kill ("Python worker exited unexpectedly") and no other
failure; the archive holds every message once, and the analytics outputs equal the
pure-Python reference, in Parquet and in the results topic, once each.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
from tests.spark.test_pipeline_archive import _archived
from tests.support.analytics_results import parquet_rows, reference, topic_rows
from tests.support.spark_task_gate import ARMED, CLAIMED_PREFIX, GATE_ENV, KILLED_PREFIX

from tidemq import Admin, Producer
from tidemq.spark.pipelines.events import generate_events, produce_events

if TYPE_CHECKING:
    from tests.spark.conftest import Consume, Options

SOAK = os.environ.get("TIDEMQ_SOAK") == "1"
#: Analytics runs in rounds of ROUND_KILLS kills (a round's micro-batches have room for
#: about 10 first task attempts); archive kills as many times in one run.
ROUNDS = 4 if SOAK else 1
ROUND_KILLS = 10 if SOAK else 5
#: Each kill needs a first task attempt of its own: more micro-batches under soak.
KILLS = ROUNDS * ROUND_KILLS
#: The longest a job may run (JVM start, the micro-batches, a retry per kill; each Python
#: worker is a process of its own: see spark_task_gate).
RUN_TIMEOUT_S = 1800.0 if SOAK else 600.0

pytestmark = [pytest.mark.spark, pytest.mark.timeout(ROUNDS * RUN_TIMEOUT_S + 300)]

QUEUES = 4
JOB = Path(__file__).with_name("worker_kill_job.py")
GATE_MODULE_DIR = Path(__file__).resolve().parent.parent / "support"
#: Spark's message for a Python worker that did not connect back in time.
LAUNCH_TIMEOUT = "Python worker failed to connect back"
#: How often the test looks for a claimed gate (a file appearing: no event to wait on).
POLL_S = 0.02


def _is_gated_worker(pid: int) -> bool:
    try:
        return b"spark_task_gate" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return False


def _claimed(gate: Path) -> tuple[Path, int, int] | None:
    """(the claim, the worker's pid, the task attempt id) of a claimed gate."""
    for entry in gate.iterdir():
        if entry.name.startswith(CLAIMED_PREFIX):
            pid, task = entry.name.removeprefix(CLAIMED_PREFIX).split("-")
            return entry, int(pid), int(task)
    return None


def _run_killing_workers(
    tmp_path: Path, args: dict[str, Any], wanted: int
) -> tuple[int, dict[str, Any]]:
    """Run the job, killing `wanted` gated workers; (kills, the job's result)."""
    gate = tmp_path / "gate"
    gate.mkdir()
    path = os.pathsep.join(filter(None, [str(GATE_MODULE_DIR), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, GATE_ENV: str(gate), "PYTHONPATH": path}
    log = tmp_path / "driver.log"
    (gate / ARMED).touch()
    kills = 0
    deadline = time.monotonic() + RUN_TIMEOUT_S
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, str(JOB), json.dumps(args)],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            while proc.poll() is None and time.monotonic() < deadline:
                claimed = _claimed(gate)
                if claimed is None:
                    time.sleep(POLL_S)
                    continue
                claim, pid, task = claimed
                assert _is_gated_worker(pid), pid
                os.kill(pid, signal.SIGKILL)
                kills += 1
                (gate / f"{KILLED_PREFIX}{task}").touch()  # before the gate opens again
                claim.unlink()
                if kills < wanted:
                    (gate / ARMED).touch()
            proc.wait(max(1.0, deadline - time.monotonic()))
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
    assert proc.returncode == 0, log.read_text(errors="replace")[-4000:]
    result: dict[str, Any] = json.loads((Path(args["out"]) / "result.json").read_text())
    # Each kill failed one task attempt, which Spark ran again; nothing else failed but
    # launches: Spark gives a new Python worker 10 s to connect back, which a loaded
    # machine can miss (seen with six sessions on two cores); that attempt never ran.
    failed = result["failed_tasks"]
    crashed = [f for f in failed if "Python worker exited unexpectedly" in f]
    assert len(crashed) == kills, failed
    assert all(f in crashed or LAUNCH_TIMEOUT in f for f in failed), failed
    return kills, result


def test_archive_with_python_workers_killed_mid_task_is_exactly_once(
    admin: Admin,
    producer: Producer,
    options: Options,
    consume: Consume,
    topic_name: str,
    tmp_path: Path,
) -> None:
    per_queue = 900 if SOAK else 300
    admin.create_topic(topic_name, QUEUES)
    for q in range(QUEUES):
        for b in range(0, per_queue, 100):
            values = [b"%s-%d-%d" % (topic_name.encode(), q, b + i) for i in range(100)]
            producer.send_batch(topic_name, values, queue=q)
    args = {
        "pipeline": "archive",
        "bootstrap": options()["bootstrap"],
        "topic": topic_name,
        "out": str(tmp_path),
        "limit": QUEUES * 75,  # 4 batches (12 with soak) of a task per queue
        "name": topic_name,
    }
    kills, result = _run_killing_workers(tmp_path, args, KILLS)
    assert kills == KILLS
    expected = Counter(
        (m.topic, m.queue, m.offset, m.value)
        for m in consume({(topic_name, q): (0, per_queue) for q in range(QUEUES)})
    )
    assert len(expected) == QUEUES * per_queue
    assert _archived(tmp_path / "archive") == expected
    assert result["rows"] == QUEUES * per_queue


def test_analytics_with_python_workers_killed_mid_task_is_exactly_once(
    admin: Admin, options: Options, consume: Consume, topic_name: str, tmp_path: Path
) -> None:
    # 6.5 minutes on two cores since analytics' tasks write its outputs (ADR 18): with
    # the rest of the suite that is past make test's budget. Its replays after failed
    # tasks and publishes are in make test (test_pipeline_analytics_replay.py).
    if not SOAK:
        pytest.skip("TIDEMQ_SOAK=1 runs it (make soak)")
    # Under soak, more rounds rather than bigger ones. (When the source shared a batch's
    # limit equally over the queues, a queue with sparser events got ahead in event time,
    # and with 3,000 events per queue or micro-batches of 240 Spark dropped late rows,
    # 8,144 and 70, without any kill; the limit is now split in proportion.)
    for n in range(ROUNDS):
        round_dir = tmp_path / f"round-{n}"
        round_dir.mkdir()
        _analytics_round(admin, options()["bootstrap"], consume, f"{topic_name}-{n}", round_dir)


def _analytics_round(admin: Admin, bootstrap: str, consume: Consume, topic: str, out: Path) -> None:
    events = generate_events(
        3000, users=200, items=40, seed=7, idle_s=120, session_pause_s=20, disorder_s=10
    )
    produce_events(bootstrap, topic, events, queues=QUEUES)
    args = {
        "pipeline": "analytics",
        "bootstrap": bootstrap,
        "topic": topic,
        "out": str(out),
        "limit": 600,  # 5 batches of a read task per queue
        "name": topic,
    }
    kills, result = _run_killing_workers(out, args, ROUND_KILLS)
    assert kills == ROUND_KILLS
    assert result["rows"] == len(events)
    assert result["dropped"] == 0
    watermark = datetime.fromisoformat(result["watermark"].replace("Z", "+00:00"))
    watermark_ms = int(watermark.timestamp() * 1000)
    expected: Counter[tuple[Any, ...]] = Counter()
    for kind in ("tumbling", "sliding", "session"):
        ref = reference(events, kind, watermark_ms)
        assert ref, kind
        assert parquet_rows(out / "analytics", kind) == sorted(ref), kind
        expected.update((kind, *r) for r in ref)
    assert topic_rows(admin, consume, topic + "-out") == expected
