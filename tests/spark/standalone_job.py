"""The Spark side of `test_spark_standalone.py`, run in its own process (a process has one
SparkContext, and the test process's is a local one): a driver connected to a standalone
master, whose executors run on the worker, reads and writes through tidemq and runs every
pipeline; it writes what the test needs to check into `<out>/result.json`. The data was
produced, and the outputs are checked, by the test.

Argument: one JSON object with `master`, `bootstrap`, `source`, `target`, `events`,
`changes` (topics), `out` (a directory) and `name`.
"""

from __future__ import annotations

import json
import os
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession

import tidemq.spark
from tidemq.spark.pipelines.analytics import AnalyticsConfig, run_analytics
from tidemq.spark.pipelines.archive import run_archive
from tidemq.spark.pipelines.db_sync import run_db_sync

#: What test_pipeline_analytics checks against its reference (the same windows).
ANALYTICS = AnalyticsConfig(
    tumbling_s=60, sliding_s=300, slide_s=60, session_gap_s=60, watermark_s=120
)
PER_TRIGGER = 400


def _session(master: str) -> SparkSession:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    spark = (
        SparkSession.builder.master(master)
        .appName("tidemq-standalone-test")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.executor.memory", "512m")
        .config("spark.executor.cores", "2")
        .config("spark.cores.max", "2")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    tidemq.spark.register(spark)
    return spark


def _stream(spark: SparkSession, bootstrap: str, topic: str) -> Any:
    return (
        spark.readStream.format("tidemq")
        .option("bootstrap", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", str(PER_TRIGGER))
        .load()
    )


def _watermark_ms(query: Any) -> int:
    text = query.lastProgress["eventTime"]["watermark"]
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp() * 1000)


def main() -> None:
    a = json.loads(sys.argv[1])
    out = Path(a["out"])
    bootstrap = a["bootstrap"]
    spark = _session(a["master"])
    result: dict[str, Any] = {"master": spark.sparkContext.master}
    try:
        # A batch read, on the executors.
        rows = (
            spark.read.format("tidemq")
            .option("bootstrap", bootstrap)
            .option("subscribe", a["source"])
            .load()
            .select("partition", "offset", "value")
            .collect()
        )
        result["batch"] = sorted([r.partition, r.offset, bytes(r.value).hex()] for r in rows)

        # A streaming read to Parquet, and to a topic with the exactly-once sink.
        to_files = (
            _stream(spark, bootstrap, a["source"])
            .writeStream.format("parquet")
            .option("path", str(out / "stream"))
            .option("checkpointLocation", str(out / "stream-cp"))
            .trigger(availableNow=True)
            .start()
        )
        to_files.awaitTermination()
        to_topic = (
            _stream(spark, bootstrap, a["source"])
            .select("key", "value")
            .writeStream.format("tidemq")
            .option("bootstrap", bootstrap)
            .option("topic", a["target"])
            .option("sinkId", f"{a['name']}-sink")
            .option("checkpointLocation", str(out / "sink-cp"))
            .trigger(availableNow=True)
            .start()
        )
        to_topic.awaitTermination()

        # Every pipeline.
        run_archive(
            spark,
            bootstrap=bootstrap,
            topics=[a["source"]],
            output=out / "archive",
            checkpoint=out / "archive-cp",
            max_offsets_per_trigger=PER_TRIGGER,
        )
        run_db_sync(
            spark,
            bootstrap=bootstrap,
            topics=[a["changes"]],
            target=f"sqlite:///{out}/shard_{{shard}}.db",
            shards=2,
            checkpoint=out / "db-sync-cp",
            max_offsets_per_trigger=PER_TRIGGER,
        )
        run = run_analytics(
            spark,
            bootstrap=bootstrap,
            topics=[a["events"]],
            output=out / "analytics",
            checkpoint=out / "analytics-cp",
            results_topic=a["events"] + "-out",
            name=a["name"],
            config=ANALYTICS,
            max_offsets_per_trigger=1002,
        )
        dropped = sum(
            op["numRowsDroppedByWatermark"]
            for p in run.query.recentProgress
            for op in p["stateOperators"]
        )
        result["analytics"] = {
            kind: {"watermark_ms": _watermark_ms(run.query), "dropped": dropped}
            for kind in ("tumbling", "sliding", "session")
        }
        result["executors"] = spark.sparkContext._jsc.sc().getExecutorMemoryStatus().size()
    finally:
        spark.stop()
    (out / "result.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
