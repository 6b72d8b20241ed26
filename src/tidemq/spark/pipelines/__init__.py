"""Spark pipelines built on the `tidemq` data source (`tidemq pipeline ...`).

* `archive`: topics -> Parquet files, Hive-style (conventions §7), exactly once and
  resumable from its checkpoint (`tidemq.spark.pipelines.archive.run_archive`).

Importing this package imports neither pyspark nor pyarrow; the pipeline modules do.
"""

from __future__ import annotations

__all__: list[str] = []
