"""The analytics pipeline's driver receives no data rows (issue 21): its driver runs with
`spark.driver.maxResultSize=1m`, so that a Spark job whose tasks answer more than 1 MiB in
all fails, and the pipeline still writes every output of micro-batches that each hold
about 2 MB of rejected rows. The tasks write the outputs and answer the driver with file
names, transaction refs and counts. The job checks its own premise: collecting one
micro-batch's worth of those rejected rows on that driver fails (as the earlier
`df.toArrow()` in foreachBatch did: measured against that code).

The driver runs in its own process (`driver_limit_job.py`): the limit is a setting of the
SparkContext, fixed when it starts.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.dataset as ds
import pytest
from tests.support.analytics_results import parquet_rows, reference, sample_events, topic_rows

from tidemq import Admin, Producer
from tidemq.spark.pipelines.events import produce_events

if TYPE_CHECKING:
    from tests.spark.conftest import Consume, Options

pytestmark = [pytest.mark.spark, pytest.mark.timeout(900)]

JOB = Path(__file__).with_name("driver_limit_job.py")
JOB_TIMEOUT_S = 600
#: Values that are not events (random bytes), on a topic of one queue of their own.
JUNK = 3000
JUNK_BYTES = 2048
#: Messages per micro-batch: the source shares it fairly among the 3 queues (2 of
#: events, 1 of junk), so batch 0 holds 1,000 junk values (2 MB) and batch 1 the other
#: 2,000 (the events' queues need less than their share): each at least twice the
#: driver's limit.
LIMIT = 3000


def test_the_driver_receives_descriptors_not_rows(
    admin: Admin,
    producer: Producer,
    options: Options,
    consume: Consume,
    topic_name: str,
    tmp_path: Path,
) -> None:
    bootstrap = options()["bootstrap"]
    events_topic, junk_topic = f"{topic_name}-events", f"{topic_name}-junk"
    events = sample_events()
    produce_events(bootstrap, events_topic, events, queues=2)
    admin.create_topic(junk_topic, 1)
    rng = random.Random(5)
    for _ in range(JUNK // 100):
        producer.send_batch(junk_topic, [rng.randbytes(JUNK_BYTES) for _i in range(100)], queue=0)

    out = tmp_path / "out"
    out.mkdir()
    args = {
        "bootstrap": bootstrap,
        "topics": [events_topic, junk_topic],
        "out": str(out),
        "limit": LIMIT,
        "premise_rows": LIMIT // 3,
        "name": topic_name,
    }
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
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    assert result["max_result_size"] == "1m"
    assert "maxResultSize" in (result["collect_error"] or "")  # the premise holds
    assert result["rows"] == len(events) + JUNK
    assert result["rejected"] == JUNK
    assert result["batches"] == 2  # the second one emits windows: the first moved the watermark
    assert result["dropped"] == 0

    root = out / "analytics"
    rejected = ds.dataset(root / "rejected", format="parquet", partitioning="hive").to_table()
    assert sorted(rejected["offset"].to_pylist()) == list(range(JUNK))
    watermark = datetime.fromisoformat(result["watermark"].replace("Z", "+00:00"))
    watermark_ms = int(watermark.timestamp() * 1000)
    expected: Counter[tuple[Any, ...]] = Counter()
    for kind in ("tumbling", "sliding", "session"):
        ref = reference(events, kind, watermark_ms)
        assert ref, kind
        assert parquet_rows(root, kind) == sorted(ref), kind
        expected.update((kind, *r) for r in ref)
    assert topic_rows(admin, consume, topic_name + "-out") == expected
