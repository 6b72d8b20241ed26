"""The driver of `test_pipeline_worker_kill9.py`, in its own process: a local session whose
Python workers are `tests/support/spark_task_gate.py` (so that the test can kill one in
the middle of a task) and which allows a task 4 attempts (`local[2,4]`; plain `local[2]`
fails the job on the first task failure). It runs one pipeline with AvailableNow to the
end and writes what the test checks into `<out>/result.json`: the pipeline's counts and
the task attempts that failed (from Spark's event log).

Argument: one JSON object with `pipeline` (archive or analytics), `bootstrap`, `topic`,
`out` (a directory), `limit` (messages per micro-batch) and `name`.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

import tidemq.spark
from tidemq.spark.pipelines.analytics import AnalyticsConfig, run_analytics
from tidemq.spark.pipelines.archive import run_archive

#: The windows of test_pipeline_analytics's reference.
ANALYTICS = AnalyticsConfig(
    tumbling_s=60, sliding_s=300, slide_s=60, session_gap_s=60, watermark_s=120
)


def _session(events: Path) -> SparkSession:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    spark = (
        SparkSession.builder.master("local[2,4]")
        .appName("tidemq-worker-kill9")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.python.use.daemon", "false")
        .config("spark.python.worker.module", "spark_task_gate")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        # Spark's event log: the test counts the task attempts that failed in it.
        .config("spark.eventLog.enabled", "true")
        .config("spark.eventLog.dir", events.as_uri())
        .config("spark.eventLog.compress", "false")
        .config("spark.eventLog.rolling.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tidemq.spark.register(spark)
    return spark


def main() -> None:
    args: dict[str, Any] = json.loads(sys.argv[1])
    out = Path(args["out"])
    events = out / "spark-events"
    events.mkdir()
    spark = _session(events)
    result: dict[str, Any] = {}
    try:
        if args["pipeline"] == "archive":
            query = run_archive(
                spark,
                bootstrap=args["bootstrap"],
                topics=[args["topic"]],
                output=out / "archive",
                checkpoint=out / "archive-cp",
                max_offsets_per_trigger=args["limit"],
            )
            result["rows"] = sum(p["numInputRows"] for p in query.recentProgress)
        else:
            run = run_analytics(
                spark,
                bootstrap=args["bootstrap"],
                topics=[args["topic"]],
                output=out / "analytics",
                checkpoint=out / "analytics-cp",
                results_topic=args["topic"] + "-out",
                name=args["name"],
                config=ANALYTICS,
                max_offsets_per_trigger=args["limit"],
            )
            progress = run.query.recentProgress
            result["rows"] = run.rows()
            result["watermark"] = progress[-1]["eventTime"]["watermark"]
            result["dropped"] = sum(
                op["numRowsDroppedByWatermark"] for p in progress for op in p["stateOperators"]
            )
    finally:
        spark.stop()
    result["failed_tasks"] = _failed_tasks(events)
    (out / "result.json").write_text(json.dumps(result))


def _failed_tasks(events: Path) -> list[str]:
    """The reason of every task attempt that failed, from Spark's event log."""
    failed = []
    for log in (p for p in events.rglob("*") if p.is_file()):
        if log.name.startswith("appstatus"):
            continue
        for line in log.read_text().splitlines():
            event = json.loads(line)
            if event["Event"] != "SparkListenerTaskEnd":
                continue
            reason = event["Task End Reason"]
            if reason["Reason"] != "Success":
                failed.append(f"{reason['Reason']}: {reason.get('Description', '')[:200]}")
    return failed


if __name__ == "__main__":
    main()
