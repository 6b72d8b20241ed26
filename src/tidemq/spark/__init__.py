"""Spark connector: the PySpark data source `tidemq` (extra `spark`).

    import tidemq.spark
    tidemq.spark.register(spark)
    df = spark.read.format("tidemq").option("bootstrap", "127.0.0.1:9876") \\
        .option("subscribe", "orders").load()

Importing this package imports neither pyspark nor pyarrow; `register` does.
"""

from __future__ import annotations

import os
import sys
from typing import Any, Final

__all__ = ["register", "use_this_python"]

#: What PySpark runs Python workers with when nobody chose (`SparkContext.pythonExec`
#: when PYSPARK_PYTHON was unset as the context started): the first python3 on PATH.
_PYSPARK_DEFAULT_PYTHON: Final = "python3"


def register(spark: Any) -> None:
    """Register the data source `tidemq` with a SparkSession (the same as
    `spark.dataSource.register(tidemq.spark.source.TidemqDataSource)`).

    In local mode, when nobody chose the workers' Python (no PYSPARK_PYTHON, no
    `spark.pyspark.python`), the workers are made to run this interpreter
    (`sys.executable`), which has tidemq: PySpark's default is the first `python3` on
    PATH, which outside an activated virtual environment is another Python
    ("No module named 'tidemq'")."""
    from tidemq.spark.source import TidemqDataSource  # noqa: PLC0415 - pyspark on demand

    use_this_python(spark)
    spark.dataSource.register(TidemqDataSource)


def use_this_python(spark: Any) -> bool:
    """Local mode only: run the context's Python workers with `sys.executable` unless a
    Python was chosen (PYSPARK_PYTHON, `spark.pyspark.python`, or `pythonExec` set by
    hand). True when it changed it.

    The workers' Python is `SparkContext.pythonExec`, read when a data source is
    registered and when a UDF or RDD function is wrapped; PySpark sets it from
    PYSPARK_PYTHON once, when the context starts, so changing the environment later has
    no effect, and setting the attribute is what works for a running context."""
    if os.environ.get("PYSPARK_PYTHON"):
        return False
    try:
        sc = spark.sparkContext
    except Exception:  # Spark Connect: no context on this side; the server's Python runs
        return False
    if getattr(sc, "pythonExec", None) != _PYSPARK_DEFAULT_PYTHON:
        return False
    if sc.getConf().get("spark.pyspark.python") or not str(sc.master).startswith("local"):
        return False
    sc.pythonExec = sys.executable
    return True
