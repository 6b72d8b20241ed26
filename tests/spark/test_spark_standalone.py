"""tidemq on a Spark standalone cluster: a master and a worker started from the pyspark
package (`tests/support/spark_standalone.py`), a driver in its own process
(`standalone_job.py`) whose tasks run in an executor on the worker. A batch read, a
streaming read to Parquet and to a topic (the exactly-once sink), and every pipeline
(archive, db-sync, analytics), each checked here: every message exactly once."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.dataset as ds
import pytest
from tests.spark.test_pipeline_archive import _archived
from tests.spark.test_pipeline_db_sync import _state
from tests.support.analytics_results import parquet_rows, reference, sample_events, topic_rows
from tests.support.spark_standalone import standalone_cluster

from tidemq import Admin, Producer
from tidemq.spark.pipelines.changes import expected_state, generate_changes, produce_changes
from tidemq.spark.pipelines.events import produce_events

if TYPE_CHECKING:
    from tests.spark.conftest import Consume, Options

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

JOB = Path(__file__).with_name("standalone_job.py")
#: The driver's whole run: JVMs start, then six queries run.
JOB_TIMEOUT_S = 600


def _source(producer: Producer, admin: Admin, topic: str) -> None:
    admin.create_topic(topic, 2)
    for q in range(2):
        for b in range(6):
            producer.send_batch(
                topic,
                [b"%s-%d-%d-%d" % (topic.encode(), q, b, i) for i in range(150)],
                keys=[b"k%d" % (i % 7) for i in range(150)],
                queue=q,
            )


def test_reads_sinks_and_pipelines_on_a_standalone_cluster(
    admin: Admin,
    producer: Producer,
    options: Options,
    consume: Consume,
    topic_name: str,
    tmp_path: Path,
) -> None:
    bootstrap = options()["bootstrap"]
    source, target = f"{topic_name}-src", f"{topic_name}-dst"
    changes_topic, events_topic = f"{topic_name}-changes", f"{topic_name}-events"
    _source(producer, admin, source)
    admin.create_topic(target, 2)
    changes = generate_changes(120, seed=3)
    admin.create_topic(changes_topic, 2)
    produce_changes(bootstrap, changes_topic, changes)
    events = sample_events()
    produce_events(bootstrap, events_topic, events, queues=2)
    info = admin.describe_topic(source)
    expected = consume({(source, q.queue): (q.min_offset, q.max_offset) for q in info.queue_info})

    out = tmp_path / "out"
    out.mkdir()
    args = {
        "bootstrap": bootstrap, "source": source, "target": target, "changes": changes_topic,
        "events": events_topic, "out": str(out), "name": topic_name,
    }  # fmt: skip
    with standalone_cluster(tmp_path) as cluster:
        args["master"] = cluster.master
        log = tmp_path / "driver.log"
        with log.open("wb") as sink:
            done = subprocess.run(
                [sys.executable, str(JOB), json.dumps(args)],
                stdout=sink,
                stderr=subprocess.STDOUT,
                timeout=JOB_TIMEOUT_S,
                check=False,
            )
        assert done.returncode == 0, log.read_text(errors="replace")[-4000:]
        # The tasks ran in an executor the worker launched, not in the driver.
        assert list(cluster.work_dir.glob("app-*/*/stderr"))
    result = json.loads((out / "result.json").read_text())
    assert result["master"] == cluster.master
    assert result["executors"] >= 2  # the driver's block manager and an executor's

    rows = sorted((m.queue, m.offset, m.value) for m in expected)
    assert [(p, o, bytes.fromhex(v)) for p, o, v in result["batch"]] == rows
    streamed = ds.dataset(out / "stream", format="parquet").to_table()
    assert sorted(
        zip(streamed["partition"].to_pylist(), streamed["offset"].to_pylist(),
            streamed["value"].to_pylist(), strict=True)
    ) == rows  # fmt: skip
    dst = admin.describe_topic(target)
    copied = consume({(target, q.queue): (q.min_offset, q.max_offset) for q in dst.queue_info})
    assert Counter(m.value for m in copied) == Counter(m.value for m in expected)
    assert _archived(out / "archive") == Counter(
        (source, m.queue, m.offset, m.value) for m in expected
    )
    assert _state(out, 2) == expected_state(changes, 2)

    analytics = result["analytics"]
    assert all(a["dropped"] == 0 for a in analytics.values())
    want: Counter[tuple[Any, ...]] = Counter()
    for kind, a in analytics.items():
        ref = reference(events, kind, a["watermark_ms"])
        assert ref, kind
        assert parquet_rows(out / "analytics", kind) == sorted(ref), kind
        want.update((kind, *r) for r in ref)
    assert topic_rows(admin, consume, events_topic + "-out") == want
