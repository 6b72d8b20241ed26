"""Spark pipelines built on the `tidemq` data source (`tidemq pipeline ...`).

* `archive`: topics -> Parquet files, Hive-style (conventions §7), exactly once and
  resumable from its checkpoint (`tidemq.spark.pipelines.archive.run_archive`).
* `analytics`: user-behaviour events -> windowed counts and sessions, exactly once to a
  topic and to Parquet (`analytics.run_analytics`; events and generator in `events`).
* `db-sync`: change events -> a database sharded by another key, idempotent through
  applied offsets (`db_sync.run_db_sync`; events and generator in `changes`).

Importing this package imports neither pyspark nor pyarrow; the pipeline modules do.
"""

from __future__ import annotations

__all__: list[str] = []
