"""Where a micro-batch of the `analytics` pipeline goes: Parquet files per kind, the
archive layout for rejected rows, and the results topic in one transaction per batch.
Pure pyarrow and the client: no pyspark (see `analytics` for the guarantees)."""

from __future__ import annotations

import json
import os
import threading
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from tidemq.client.sync import TransactionProducer
from tidemq.spark.options import ClientOptions
from tidemq.spark.pipelines.analytics_frames import KINDS, Kind
from tidemq.spark.pipelines.archive import write_table

__all__ = [
    "RESULT_BATCH",
    "BatchOutputs",
    "ResultSink",
    "result_messages",
    "split_kinds",
    "write_results",
]

#: Messages per batch sent to the results topic inside a transaction.
RESULT_BATCH: Final = 500


def _start_column(kind: Kind) -> str:
    return "session_start" if kind == "session" else "window_start"


def write_results(table: pa.Table, root: Path, kind: Kind, batch_id: int) -> list[Path]:
    """Write one micro-batch of results to ``root/<kind>/dt=.../part-<batch_id>.parquet``
    (one file per UTC day of the window or session start); returns the files. Rows are
    sorted, so a replayed batch writes byte-identical files. Pure pyarrow."""
    if table.num_rows == 0:
        return []
    if batch_id < 0:
        raise ValueError(f"batch_id must be >= 0, got {batch_id}")
    start = table.column(_start_column(kind))
    if start.type.tz != "UTC":
        start = start.cast(pa.timestamp(start.type.unit, tz="UTC"))
    days = pc.strftime(start, format="%Y-%m-%d")
    order = [(name, "ascending") for name in table.column_names]
    out = []
    for day in sorted(pc.unique(days).to_pylist()):
        part = table.filter(pc.equal(days, day)).sort_by(order)
        target = root / kind / f"dt={day}" / f"part-{batch_id:08d}.parquet"
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.tmp-{uuid.uuid4().hex}")
        try:
            pq.write_table(part, tmp, compression="zstd")
            os.replace(tmp, target)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        out.append(target)
    return out


def _ms(value: datetime) -> int:
    utc = value.replace(tzinfo=UTC) if value.tzinfo is None else value
    return int(utc.timestamp() * 1000)


def result_messages(table: pa.Table, kind: Kind) -> list[tuple[bytes, bytes]]:
    """(key, JSON value) of each result row, in the order `write_results` sorts them.
    Times become epoch milliseconds; the value carries `kind` too."""
    if kind == "rejected":
        raise ValueError("rejected rows are not sent to the results topic")
    order = [(name, "ascending") for name in table.column_names]
    rows = table.sort_by(order).to_pylist()
    key_field = "user_id" if kind == "session" else "item_id"
    out = []
    for row in rows:
        doc: dict[str, Any] = {"kind": kind}
        for name, value in row.items():
            doc[name] = _ms(value) if isinstance(value, datetime) else value
        out.append((str(row[key_field]).encode(), json.dumps(doc, separators=(",", ":")).encode()))
    return out


def split_kinds(table: pa.Table) -> dict[Kind, pa.Table]:
    """The rows of each kind of a collected micro-batch (`analytics_frame`'s columns: `kind`
    and one struct column per kind)."""
    out: dict[Kind, pa.Table] = {}
    for kind in KINDS:
        rows = table.filter(pc.equal(table.column("kind"), kind)).column(kind)
        out[kind] = pa.Table.from_struct_array(rows.combine_chunks())
    return out


@dataclass(slots=True)
class ResultSink:
    """Sends a micro-batch's results (every kind) to the topic in one transaction committed
    with the marker (`sink_id`, batch id), exactly once per batch id. foreachBatch calls of
    one query never overlap; the lock guards the producer against `close` only."""

    bootstrap: str
    topic: str
    group: str
    sink_id: str
    client: ClientOptions
    _producer: TransactionProducer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def publish(self, tables: dict[Kind, pa.Table], batch_id: int) -> int:
        """Send the rows of `batch_id` unless its marker says it was; the count sent."""
        messages = [
            (kind, message)
            for kind in KINDS
            if kind != "rejected"
            for message in result_messages(tables[kind], kind)
        ]
        if not messages:
            return 0
        with self._lock:
            if self._producer is None:
                self._producer = TransactionProducer(
                    self.bootstrap, self.group, client_config=self.client.client_config()
                )
            producer = self._producer
        if producer.sink_marker(self.sink_id) >= batch_id:
            return 0  # a replay of a batch already published
        with producer.transaction() as tx:
            for i in range(0, len(messages), RESULT_BATCH):
                chunk = messages[i : i + RESULT_BATCH]
                tx.send_batch(
                    self.topic,
                    [v for _, (_, v) in chunk],
                    keys=[k for _, (k, _) in chunk],
                    tags=[kind for kind, _ in chunk],
                )
            tx.commit(sink_id=self.sink_id, batch_id=batch_id)
        return len(messages)

    def close(self) -> None:
        with self._lock:
            if self._producer is not None:
                self._producer.close()
                self._producer = None


@dataclass(slots=True)
class BatchOutputs:
    """Writes every output of one micro-batch, in an order that a replay repeats: Parquet
    per kind, the results topic, the rejected rows. Counts the rejected rows per batch id
    (a replay in the same run counts once)."""

    root: Path
    sink: ResultSink | None
    rejected: dict[int, int] = field(default_factory=dict)

    def write(self, table: pa.Table, batch_id: int) -> None:
        tables = split_kinds(table)
        for kind in KINDS:
            if kind != "rejected":
                write_results(tables[kind], self.root, kind, batch_id)
        if self.sink is not None:
            self.sink.publish(tables, batch_id)
        write_table(tables["rejected"], self.root / "rejected")
        self.rejected[batch_id] = tables["rejected"].num_rows

    def close(self) -> None:
        if self.sink is not None:
            self.sink.close()
