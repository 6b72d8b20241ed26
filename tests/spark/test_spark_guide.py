"""docs/guide/spark.md runs as written: every python block of the page, the `no-run` ones
included (they need Spark, which the guide's own test does not start), in order, in one
namespace, against the test broker (127.0.0.1:9876 rewritten) and the test session
(the page's `getOrCreate()` returns it), with its /data paths under a temporary
directory."""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from pyspark.sql import SparkSession

from tidemq import Admin

if TYPE_CHECKING:
    from tests.spark.conftest import Load, ThreadedBroker

pytestmark = [pytest.mark.spark, pytest.mark.timeout(600)]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "guide" / "spark.md"
BLOCK = re.compile(r"```python([ \t][^\n]*)?\n(.*?)```", re.DOTALL)


def test_every_block_of_the_spark_guide_runs(
    spark: SparkSession,
    broker: ThreadedBroker,
    admin: Admin,
    load: Load,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    if "spark-orders" in {t.name for t in admin.list_topics()}:
        pytest.skip("the page's topics exist already on this session's broker")
    namespace: dict[str, object] = {"__name__": "__guide__"}
    blocks = [code for _, code in BLOCK.findall(PAGE.read_text())]
    for block in blocks:
        code = block.replace("127.0.0.1:9876", broker.address)
        code = code.replace('"/data/', f'"{tmp_path}/data/')
        exec(compile(code, str(PAGE), "exec"), namespace)
    out = capsys.readouterr().out
    assert "[1000, 1000]" in out

    assert namespace["spark"] is spark
    assert load(subscribe="spark-orders").count() == 2002  # 2000 + the two rows written
    # The batch read of the offsets example, as its comment says.
    assert "\n1477\n" in out
    # The streaming copy created its topic and copied everything there was.
    assert admin.describe_topic("spark-orders-copy").queues == 2
    assert load(subscribe="spark-orders-copy").count() == 2002
    # The stream of clicks-.* went to Parquet; the archive holds both topics.
    assert spark.read.parquet(f"{tmp_path}/data/clicks").count() == 100
    table = namespace["table"]
    assert table.num_rows == 2102  # type: ignore[attr-defined]
