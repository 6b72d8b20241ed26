"""Spark connector: the PySpark data source `tidemq` (extra `spark`).

    import tidemq.spark
    tidemq.spark.register(spark)
    df = spark.read.format("tidemq").option("bootstrap", "127.0.0.1:9876") \\
        .option("subscribe", "orders").load()

Importing this package imports neither pyspark nor pyarrow; `register` does.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register"]


def register(spark: Any) -> None:
    """Register the data source `tidemq` with a SparkSession (the same as
    `spark.dataSource.register(tidemq.spark.source.TidemqDataSource)`)."""
    from tidemq.spark.source import TidemqDataSource  # noqa: PLC0415 - pyspark on demand

    spark.dataSource.register(TidemqDataSource)
