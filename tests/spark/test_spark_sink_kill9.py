"""A Spark driver killed with SIGKILL in the middle of a streaming query into tidemq, then
restarted from its checkpoint: the output topic holds exactly the input, once. (The
restart reads larger micro-batches: a replayed batch keeps the range in its offset log.)

The driver runs in its own process (`_DRIVER` below): it streams topic `src` into topic
`dst` through the exactly-once sink, in micro-batches of a few rows, with a trigger that
keeps it going. The test kills it (and its JVM) with SIGKILL once some batches are out,
wherever it is: inside a task's transaction, between the sink's commit and Spark's commit
log, or idle. A second driver then runs with AvailableNow from the same checkpoint to the
end of the input.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from tidemq import Admin, Producer, StreamConsumer

if TYPE_CHECKING:
    from tests.spark.conftest import ThreadedBroker

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

ROWS = 2000

_DRIVER = r"""
import os, sys
os.environ["PYSPARK_PYTHON"] = sys.executable
os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
from pyspark.sql import SparkSession
import tidemq.spark
bootstrap, src, dst, checkpoint, mode = sys.argv[1:6]
spark = (
    SparkSession.builder.master("local[2]").appName("kill9-driver")
    .config("spark.ui.enabled", "false")
    .config("spark.ui.showConsoleProgress", "false")
    .config("spark.sql.shuffle.partitions", "2")
    .config("spark.sql.session.timeZone", "UTC")
    .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xss16m")
    .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    .getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")
tidemq.spark.register(spark)
stream = (
    spark.readStream.format("tidemq")
    .option("bootstrap", bootstrap).option("subscribe", src)
    .option("startingOffsets", "earliest")
    .option("maxOffsetsPerTrigger", "10" if mode == "forever" else "1000")
    .load()
)
writer = (
    stream.select("key", "value").writeStream.format("tidemq")
    .option("bootstrap", bootstrap).option("topic", dst).option("sinkId", "kill9")
    .option("checkpointLocation", checkpoint)
)
if mode == "forever":
    # Slow on purpose (10 rows every 500 ms): the test must find it mid-stream.
    query = writer.trigger(processingTime="500 milliseconds").start()
    print("started", flush=True)
    query.awaitTermination()
else:
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination(240)
    print("finished", flush=True)
"""


def _driver(broker: ThreadedBroker, tmp: Path, mode: str) -> subprocess.Popen[bytes]:
    script = tmp / "driver.py"
    script.write_text(_DRIVER)
    return subprocess.Popen(
        [sys.executable, str(script), broker.address, "kill9-src", "kill9-dst",
         str(tmp / "checkpoint"), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its JVM is in its group: one SIGKILL takes both
    )  # fmt: skip


def _count(broker: ThreadedBroker, topic: str) -> Counter[bytes]:
    consumer = StreamConsumer(broker.address, start="earliest")
    consumer.assign([(topic, q) for q in range(2)])
    got: Counter[bytes] = Counter()
    while batch := consumer.poll(timeout_ms=500):
        got.update(m.value or b"" for m in batch)
    consumer.close()
    return got


def test_a_killed_driver_restarts_without_loss_or_duplicates(
    broker: ThreadedBroker, admin: Admin, producer: Producer, tmp_path: Path
) -> None:
    admin.create_topic("kill9-src", 2)
    admin.create_topic("kill9-dst", 2)
    for q in range(2):
        producer.send_batch("kill9-src", [b"r%d" % i for i in range(ROWS) if i % 2 == q], queue=q)
    first = _driver(broker, tmp_path, "forever")
    try:
        deadline = time.monotonic() + 120
        while sum(_count(broker, "kill9-dst").values()) < 40:  # a few batches out
            assert time.monotonic() < deadline, "the first driver wrote nothing"
            assert first.poll() is None, "the first driver exited"
            time.sleep(0.1)
        os.killpg(first.pid, signal.SIGKILL)
    finally:
        if first.poll() is None:
            os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
        if first.stdout is not None:
            first.stdout.close()
    partial = _count(broker, "kill9-dst")
    assert 0 < sum(partial.values()) < ROWS
    second = _driver(broker, tmp_path, "available_now")
    try:
        out, _ = second.communicate(timeout=240)
    finally:
        if second.poll() is None:
            os.killpg(second.pid, signal.SIGKILL)
            second.wait(30)
    assert b"finished" in out
    final = _count(broker, "kill9-dst")
    assert set(final) == {b"r%d" % i for i in range(ROWS)}, "lost rows"
    assert max(final.values()) == 1, f"duplicated: {[v for v, n in final.items() if n > 1][:5]}"
