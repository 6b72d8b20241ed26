"""Offloaded data as Parquet: one row per message, and back to the exact stored records.

A tier file holds whole batches (commit-log records) of one queue, offsets
[start, end). Its columns are the Spark source's (conventions §4, `source_schema` with
headers), so Spark, DuckDB and pyarrow read a tier file as they read the topic, then the
system columns that give back each record exactly as it was stored::

    key binary · value binary · topic string · partition int32 · offset int64 ·
    timestamp timestamp[us, UTC] · timestampType int32 ·
    headers list<struct<key string, value binary>> · tag string · keys list<string>
    batch_offset     int64   the base offset of the message's record (batch)
    store_time_ms    int64   the record's store time
    create_time_ms   int64   the producer's timestamp, only where `timestamp` is not it
                             (LogAppendTime records); null elsewhere
    record_flags     int32   the record's flags (RecordFlags)
    producer_id      int64   idempotence fields of the record (-1: none)
    producer_seq     int32
    producer_epoch   int32
    properties       binary  the record's system properties (null: none)
    payload_codec    int32   the batch's compression codec (0 none, 1 zstd, 2 lz4)

zstd; row groups hold whole records only (a row group is the unit of a ranged read, and a
reader rebuilds records from one). The Parquet key-value metadata names the format,
topic, queue, broker and offset range (`tidemq.*` keys).

Reading back (`table_to_records`) rebuilds each record's batch payload from the Arrow
columns (`tidemq.core.arrow_encode`) and writes the record header with every stored
field: message offsets, keys, values, tags, keys, headers, timestamps, flags, producer
fields and properties come back equal;
the payload is compressed with the producer's codec again (the compressed bytes may
differ; they are never visible).
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tidemq.core.arrow import records_to_arrow, source_schema
from tidemq.core.arrow_encode import rows_to_payload
from tidemq.core.batch import Codec, decode_columns, parse_envelope
from tidemq.core.errors import CorruptRecordError
from tidemq.core.record import RecordFlags, encode_header, parse_header

__all__ = ["FILE_FORMAT", "SCHEMA", "EncodedFile", "encode_file", "table_to_records"]

#: Written to every file's metadata (`tidemq.format`); readers refuse other values.
FILE_FORMAT: Final = "tidemq-tier-1"

_SYSTEM: Final = [
    ("batch_offset", pa.int64()),
    ("store_time_ms", pa.int64()),
    ("create_time_ms", pa.int64()),
    ("record_flags", pa.int32()),
    ("producer_id", pa.int64()),
    ("producer_seq", pa.int32()),
    ("producer_epoch", pa.int32()),
    ("properties", pa.binary()),
    ("payload_codec", pa.int32()),
]
SCHEMA: Final = pa.schema([*source_schema(True), *_SYSTEM])
_US_PER_MS: Final = 1000


@dataclass(frozen=True, slots=True)
class EncodedFile:
    data: bytes
    start: int  # first offset
    end: int  # one past the last offset
    messages: int
    #: The first offset of each row group (ranged reads pick the group by offset).
    row_groups: list[int]
    min_store_time_ms: int
    max_store_time_ms: int


def _system_columns(records: Sequence[bytes]) -> tuple[list[Any], list[int]]:
    """The system columns of the records' messages, and each record's message count."""
    headers = [parse_header(r) for r in records]
    counts = [h.count for h in headers]

    def per_message(values: list[int], arrow_type: Any) -> Any:
        return pa.array(np.repeat(np.array(values, dtype=np.int64), counts), type=arrow_type)

    create: list[Any] = []
    for h, r in zip(headers, records, strict=True):
        if h.flags & RecordFlags.LOG_APPEND_TIME:
            cols = decode_columns(memoryview(r)[h.payload_start : h.size], verify_crc=False)
            create.append(pa.array(cols.timestamps_ms, type=pa.int64()))
        else:
            create.append(pa.nulls(h.count, pa.int64()))
    props = [bytes(r[64 : h.payload_start]) or None for h, r in zip(headers, records, strict=True)]
    columns = [
        per_message([h.base_offset for h in headers], pa.int64()),
        per_message([h.store_time_ms for h in headers], pa.int64()),
        pa.concat_arrays(create) if create else pa.array([], pa.int64()),
        per_message([h.flags for h in headers], pa.int32()),
        per_message([h.producer_id for h in headers], pa.int64()),
        per_message([h.base_sequence for h in headers], pa.int32()),
        per_message([h.producer_epoch for h in headers], pa.int32()),
        pa.array(np.repeat(np.array(props, dtype=object), counts), type=pa.binary()),
        per_message(
            [
                parse_envelope(memoryview(r)[h.payload_start :], verify_crc=False).codec
                for h, r in zip(headers, records, strict=True)
            ],
            pa.int32(),
        ),
    ]
    return columns, counts


def encode_file(
    records: Sequence[bytes],
    *,
    topic: str,
    queue: int,
    broker: str,
    row_group_bytes: int,
) -> EncodedFile:
    """One tier file of whole consecutive records (at least one) of a queue."""
    if not records:
        raise ValueError("a tier file holds at least one record")
    first, last = parse_header(records[0]), parse_header(records[-1])
    start, end = first.base_offset, last.base_offset + last.count
    body = b"".join(records)
    rows = records_to_arrow(
        topic, queue, body, [len(r) for r in records], start=start, end=end,
        include_headers=True,
    )  # fmt: skip
    system, counts = _system_columns(records)
    if rows is None or rows.num_rows != sum(counts):
        raise CorruptRecordError(f"{topic}/{queue}: records at {start}..{end} do not decode whole")
    table = pa.Table.from_batches([rows]).select(rows.schema.names)
    for (name, _), column in zip(_SYSTEM, system, strict=True):
        table = table.append_column(name, column)
    store_times = table.column("store_time_ms")
    meta = {
        "tidemq.format": FILE_FORMAT,
        "tidemq.topic": topic,
        "tidemq.queue": str(queue),
        "tidemq.broker": broker,
        "tidemq.start_offset": str(start),
        "tidemq.end_offset": str(end),
    }
    table = table.replace_schema_metadata(meta)
    out = io.BytesIO()
    groups: list[int] = []
    with pq.ParquetWriter(
        out, table.schema, compression="zstd", write_page_checksum=True
    ) as writer:
        row = 0
        group_rows = group_bytes = 0
        for record, count in zip(records, counts, strict=True):
            if group_rows and group_bytes + len(record) > row_group_bytes:
                writer.write_table(table.slice(row, group_rows), row_group_size=group_rows)
                groups.append(int(table.column("offset")[row].as_py()))
                row += group_rows
                group_rows = group_bytes = 0
            group_rows += count
            group_bytes += len(record)
        writer.write_table(table.slice(row, group_rows), row_group_size=group_rows)
        groups.append(int(table.column("offset")[row].as_py()))
    return EncodedFile(
        data=out.getvalue(),
        start=start,
        end=end,
        messages=table.num_rows,
        row_groups=groups,
        min_store_time_ms=int(pa.compute.min(store_times).as_py()),
        max_store_time_ms=int(pa.compute.max(store_times).as_py()),
    )


def check_file_metadata(meta: dict[bytes, bytes] | None, topic: str, queue: int) -> None:
    """Refuse a file that is not a tier file of this queue."""
    meta = meta or {}
    fmt = meta.get(b"tidemq.format", b"").decode()
    if fmt != FILE_FORMAT:
        raise CorruptRecordError(f"not a tidemq tier file (format {fmt!r})")
    if meta.get(b"tidemq.topic", b"").decode() != topic or meta.get(
        b"tidemq.queue", b""
    ).decode() != str(queue):
        raise CorruptRecordError(f"tier file is not of {topic}/{queue}")


def table_to_records(table: Any, topic_id: int, queue_id: int) -> list[bytes]:
    """The stored records of a table of whole records (a row group, or several), in order:
    each payload rebuilt from the Arrow columns (`rows_to_payload`, no Python object per
    message), each header with the stored fields."""
    if table.num_rows == 0:
        return []
    rows = table.combine_chunks().to_batches()
    batch = rows[0] if len(rows) == 1 else pa.RecordBatch.from_pylist(table.to_pylist())
    stamps = table.column("timestamp").cast(pa.int64()).to_numpy() // _US_PER_MS
    create = table.column("create_time_ms")
    if create.null_count < len(create):
        stamps = np.where(create.is_null().to_numpy(), stamps, create.fill_null(0).to_numpy())
    base = table.column("batch_offset").to_numpy()
    offsets = table.column("offset").to_numpy()
    starts = np.flatnonzero(np.diff(base, prepend=base[0] - 1))
    ends = np.append(starts[1:], table.num_rows)
    at = pa.array(starts)
    fields = {
        name: table.column(name).take(at).to_pylist()
        for name in (
            "store_time_ms", "record_flags", "producer_id", "producer_seq", "producer_epoch",
            "properties", "payload_codec",
        )
    }  # fmt: skip
    records: list[bytes] = []
    for i, (s, e) in enumerate(zip(starts.tolist(), ends.tolist(), strict=True)):
        first = int(base[s])
        if offsets[s] != first or offsets[e - 1] != first + e - s - 1:
            raise CorruptRecordError(f"tier rows of the batch at offset {first} are not whole")
        payload = rows_to_payload(
            batch.slice(s, e - s), stamps[s:e], Codec(fields["payload_codec"][i])
        )
        properties = fields["properties"][i] or b""
        header = encode_header(
            payload_size=len(payload),
            properties=properties,
            flags=fields["record_flags"][i],
            topic_id=topic_id,
            queue_id=queue_id,
            count=e - s,
            base_offset=first,
            store_time_ms=fields["store_time_ms"][i],
            producer_id=fields["producer_id"][i],
            base_sequence=fields["producer_seq"][i],
            producer_epoch=fields["producer_epoch"][i],
            payload_crc=parse_envelope(payload, verify_crc=False).crc,
        )
        records.append(header + properties + payload)
    return records
