"""The driver of `test_pipeline_analytics_driver.py`, in its own process: a local session
whose driver accepts at most 1 MiB of task results per Spark job
(`spark.driver.maxResultSize=1m`, the smallest Spark allows; a job whose tasks' results
add up to more fails) with a 512 MiB heap. It runs the analytics pipeline with
AvailableNow to the end, then checks the premise of the test: collecting no more of the
rejected rows it wrote than one micro-batch holds (`premise_rows`) fails on this driver.
It writes what the test checks into `<out>/result.json`.

Argument: one JSON object with `bootstrap`, `topics` (a list), `out` (a directory),
`limit` (messages per micro-batch), `premise_rows` and `name`.
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

#: The windows of tests/support/analytics_results.py's reference.
ANALYTICS = AnalyticsConfig(
    tumbling_s=60, sliding_s=300, slide_s=60, session_gap_s=60, watermark_s=120
)
MAX_RESULT_SIZE = "1m"


def _session() -> SparkSession:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    spark = (
        SparkSession.builder.master("local[2]")
        .appName("tidemq-driver-limit")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "512m")
        .config("spark.driver.maxResultSize", MAX_RESULT_SIZE)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tidemq.spark.register(spark)
    return spark


def main() -> None:
    args: dict[str, Any] = json.loads(sys.argv[1])
    out = Path(args["out"])
    spark = _session()
    result: dict[str, Any] = {"max_result_size": spark.conf.get("spark.driver.maxResultSize")}
    try:
        run = run_analytics(
            spark,
            bootstrap=args["bootstrap"],
            topics=args["topics"],
            output=out / "analytics",
            checkpoint=out / "analytics-cp",
            results_topic=args["name"] + "-out",
            name=args["name"],
            config=ANALYTICS,
            max_offsets_per_trigger=args["limit"],
        )
        progress = run.query.recentProgress
        result["rows"] = run.rows()
        result["rejected"] = run.rejected_rows()
        result["batches"] = len(progress)
        result["watermark"] = progress[-1]["eventTime"]["watermark"]
        result["dropped"] = sum(
            op["numRowsDroppedByWatermark"] for p in progress for op in p["stateOperators"]
        )
        rejected = spark.read.parquet(str(out / "analytics" / "rejected"))
        try:
            rejected.limit(args["premise_rows"]).toArrow()
            result["collect_error"] = None
        except Exception as exc:  # what the driver's limit raises: the test reads it
            result["collect_error"] = str(exc)[:2000]
    finally:
        spark.stop()
    (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
