"""The source the `archive` pipeline reads with: the `tidemq` stream source whose tasks
write the Parquet files themselves (`archive_files.Stager`) and hand Spark only what they
staged.

Why a source of its own (issue 21): with the plain source, every message went from the
source's Python worker into the JVM (Arrow to Spark rows) and back out to another Python
worker (`mapInArrow`) that wrote the files, which cost more than reading and writing
them. Here one Python process per task fetches its offset range and writes it, and the
messages never enter the JVM. The offsets, the plan and Spark's checkpoint are the
`tidemq` source's, unchanged: a replayed micro-batch reads the same ranges in the same
tasks, as before.

The rows a task answers: one per message it read, so that the query's progress counts
messages (`numInputRows`), as with the plain source; the column `staged` holds a JSON
description of a staged file on as many rows as the task staged files, and is null on the
others (about 5 bytes a message cross into the JVM).
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition
from pyspark.sql.types import StringType, StructField, StructType

from tidemq.spark.fetch import read_range
from tidemq.spark.options import OptionError
from tidemq.spark.pipelines.archive_files import ArchiveFile, Staged, Stager
from tidemq.spark.source import QueueRangePartition, TidemqStreamReader

__all__ = ["ROOT_OPTION", "SOURCE_NAME", "ArchiveDataSource", "staged_of"]

SOURCE_NAME: Final = "tidemq-archive"
#: The directory the tasks stage their files in (the archive's output).
ROOT_OPTION: Final = "archiveRoot"
#: Rows per answer batch (the padding that makes one row a message).
_ANSWER_ROWS: Final = 1 << 20

_SCHEMA: Final = StructType([StructField("staged", StringType())])
_ARROW_SCHEMA: Final = pa.schema([("staged", pa.string())])


def _describe(s: Staged) -> str:
    f = s.file
    return json.dumps(
        {
            "tmp": str(s.tmp),
            "target": str(f.path),
            "topic": f.topic,
            "queue": f.queue,
            "dt": f.dt,
            "hour": f.hour,
            "start_offset": f.start_offset,
            "end_offset": f.end_offset,
            "rows": f.rows,
        }
    )


def staged_of(text: str) -> Staged:
    """The `Staged` a task described in a row's `staged` column."""
    d = json.loads(text)
    file = ArchiveFile(
        d["topic"],
        int(d["queue"]),
        d["dt"],
        int(d["hour"]),
        int(d["start_offset"]),
        int(d["end_offset"]),
        int(d["rows"]),
        Path(d["target"]),
    )
    return Staged(Path(d["tmp"]), file)


def _answer(staged: list[Staged], rows: int) -> Iterator[pa.RecordBatch]:
    """`rows` rows (at least one per file), the first ones describing the files."""
    described = [_describe(s) for s in staged]
    rows = max(rows, len(described))
    first = min(rows, max(len(described), _ANSWER_ROWS))
    column = pa.array(described, pa.string())
    if first > len(described):
        column = pa.concat_arrays([column, pa.nulls(first - len(described), pa.string())])
    yield pa.RecordBatch.from_arrays([column], schema=_ARROW_SCHEMA)
    left = rows - first
    while left > 0:
        n = min(left, _ANSWER_ROWS)
        yield pa.RecordBatch.from_arrays([pa.nulls(n, pa.string())], schema=_ARROW_SCHEMA)
        left -= n


class ArchiveStreamReader(TidemqStreamReader):
    """The `tidemq` stream reader, whose `read` stages the range's files under `root`."""

    def __init__(self, options: Mapping[str, str], root: str) -> None:
        super().__init__(options, None)
        self._root = root

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if not isinstance(partition, QueueRangePartition):
            return iter(())  # Spark's placeholder when there is nothing to read
        return self._stage(partition)

    def _stage(self, partition: QueueRangePartition) -> Iterator[pa.RecordBatch]:
        stager = Stager(Path(self._root))
        rows = 0
        try:
            for batch in read_range(self._options, partition.range):
                stager.add(batch)
                rows += batch.num_rows
        except BaseException:
            stager.abort()
            raise
        staged = stager.close()
        if staged:
            yield from _answer(staged, rows)


class ArchiveDataSource(DataSource):
    """`spark.readStream.format("tidemq-archive")`: the `tidemq` source's options, plus
    `archiveRoot`; streaming reads only (the `archive` pipeline registers it)."""

    @classmethod
    def name(cls) -> str:
        return SOURCE_NAME

    def schema(self) -> StructType:
        return _SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        options = {k: v for k, v in self.options.items() if k.lower() != ROOT_OPTION.lower()}
        root = next((v for k, v in self.options.items() if k.lower() == ROOT_OPTION.lower()), None)
        if not root:
            raise OptionError(f"the {SOURCE_NAME} source needs the option {ROOT_OPTION!r}")
        return ArchiveStreamReader(options, root)
