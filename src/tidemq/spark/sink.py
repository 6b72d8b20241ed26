"""The exactly-once streaming sink: the place reserved for it. Not implemented yet.

`df.writeStream.format("tidemq")` comes here (`TidemqDataSource.streamWriter`). tidemq
offers no non-transactional streaming writer on purpose: a micro-batch replayed after a
failure would be written twice. The sink to build here, on top of transactions:

* a required option `sinkId` naming the sink (one set of markers per sink);
* `write()` (executors, `DataSourceStreamArrowWriter`) sends its rows inside a
  transaction (the grouping of `tidemq.spark.write.group_rows` applies unchanged) and
  returns a commit message holding the transaction ids; the batch id comes from
  `TaskContext.get().getLocalProperty("streaming.sql.batchId")`;
* `commit(messages, batchId)` (driver) publishes every transaction of the batch
  atomically with the marker (`sinkId`, batchId); a replayed batch whose marker is
  already committed is skipped (its transactions aborted);
* `abort(messages, batchId)` rolls back the batch's transactions, but must not undo a
  batch whose marker is committed (Spark calls abort after a failed commit).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NoReturn

__all__ = ["exactly_once_stream_writer"]


def exactly_once_stream_writer(options: Mapping[str, str], *, overwrite: bool) -> NoReturn:
    """The streaming writer of the data source; raises until the transactional sink exists."""
    raise NotImplementedError(
        "streaming writes to tidemq need the exactly-once sink (option sinkId), which is not "
        "implemented yet; write each micro-batch with foreachBatch and df.write instead "
        "(at least once)"
    )
