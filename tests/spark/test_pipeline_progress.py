"""Pipeline totals count every micro-batch, even when Spark delivers the progress events
late: closing the counter first waits for them.

Spark calls streaming listeners one after the other on one thread, so a listener
registered first that blocks holds back every event to the counter: the test makes the
delivery as late as a loaded machine can.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from pyspark.sql.streaming.listener import StreamingQueryListener

from tidemq.spark.pipelines.progress import ProgressTotals

pytestmark = pytest.mark.spark

#: Bounds every wait of the test: nothing here may hang.
WAIT_S = 60


class _Gate(StreamingQueryListener):
    """Holds Spark's listener thread at the first progress event until opened."""

    def __init__(self) -> None:
        self.opened = threading.Event()

    def onQueryStarted(self, event: Any) -> None:
        pass

    def onQueryProgress(self, event: Any) -> None:
        self.opened.wait(WAIT_S)

    def onQueryIdle(self, event: Any) -> None:
        pass

    def onQueryTerminated(self, event: Any) -> None:
        pass


def test_close_waits_for_the_last_progress_events(spark: SparkSession, tmp_path: Path) -> None:
    source = tmp_path / "in"
    source.mkdir()
    for n, lines in enumerate((3, 4, 5)):
        (source / f"part-{n}.txt").write_text("".join(f"line {i}\n" for i in range(lines)))
    gate = _Gate()
    spark.streams.addListener(gate)  # first: it holds back the counter's events
    try:
        progress = ProgressTotals(spark)
        query = (
            spark.readStream.option("maxFilesPerTrigger", 1)
            .text(str(source))
            .writeStream.format("noop")
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(WAIT_S)
        closing = threading.Thread(target=progress.close, args=([query],))
        closing.start()
        # The counter has not seen a single event yet; close() must wait for them, not
        # drop the listener now. (A close that does not wait ends within this join.)
        closing.join(1.0)
        gate.opened.set()
        closing.join(WAIT_S)
        assert not closing.is_alive()
        totals = progress.totals(query, wait_s=0)
        assert (totals.rows, totals.batches) == (12, 3)
    finally:
        gate.opened.set()
        spark.streams.removeListener(gate)
