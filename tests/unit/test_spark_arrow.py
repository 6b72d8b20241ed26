"""Fetched records as the Spark source's Arrow rows: the same messages `StreamConsumer`
decodes (messages_from_records), in the schema Spark expects. No JVM (pyspark is imported
only for its pure-Python `to_arrow_schema`)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.core.arrow import SOURCE_COLUMNS, records_to_arrow, source_schema
from tidemq.core.batch import MessageRecord, encode_batch, parse_envelope
from tidemq.core.errors import CorruptRecordError
from tidemq.core.message import Message, messages_from_records
from tidemq.core.record import encode_header

TS = 1_700_000_000_000
PROFILE = settings(
    deadline=timedelta(seconds=2),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def record(messages: list[MessageRecord], base_offset: int, properties: bytes = b"") -> bytes:
    payload = encode_batch(messages)
    header = encode_header(
        payload_size=len(payload),
        properties=properties,
        flags=0,
        topic_id=1,
        queue_id=3,
        count=len(messages),
        base_offset=base_offset,
        store_time_ms=TS,
        producer_id=-1,
        base_sequence=0,
        producer_epoch=0,
        payload_crc=parse_envelope(payload).crc,
    )
    return header + properties + payload


def fetch_body(batches: list[list[MessageRecord]], first: int) -> tuple[bytes, list[int]]:
    records = []
    offset = first
    for i, messages in enumerate(batches):
        records.append(record(messages, offset, b"p" * (i % 3)))
        offset += len(messages)
    return b"".join(records), [len(r) for r in records]


def as_messages(batch: Any) -> list[Message]:
    """Rows of a source RecordBatch as the client's Message objects."""
    micros = batch.column("timestamp").cast(pa.int64()).to_pylist()
    out = []
    for row, us in zip(batch.to_pylist(), micros, strict=True):
        assert us % 1000 == 0
        assert row["timestampType"] == 0
        out.append(
            Message(
                row["topic"],
                row["partition"],
                row["offset"],
                row["value"],
                row["key"],
                row["tag"],
                tuple(row["keys"]),
                {h["key"]: h["value"] for h in row["headers"]},
                us // 1000,
            )
        )
    return out


messages_st = st.builds(
    MessageRecord,
    st.none() | st.binary(max_size=20),
    st.none() | st.binary(max_size=8),
    st.none() | st.sampled_from(["paid", "shipped", "\u00e9t\u00e9"]),
    st.lists(st.text(max_size=5), max_size=2).map(tuple),
    st.lists(st.tuples(st.text(min_size=1, max_size=4), st.binary(max_size=4)), max_size=2).map(
        lambda hs: tuple(dict(hs).items())  # unique header keys, as Message keeps a dict
    ),
    st.integers(TS, TS + 10_000),
)


@PROFILE
@given(
    st.lists(st.lists(messages_st, min_size=1, max_size=6), min_size=1, max_size=5),
    st.integers(0, 1000),
    st.data(),
)
def test_rows_equal_stream_consumer_messages(
    batches: list[list[MessageRecord]], first: int, data: st.DataObject
) -> None:
    body, sizes = fetch_body(batches, first)
    total = sum(len(b) for b in batches)
    start = data.draw(st.integers(first, first + total))
    end = data.draw(st.integers(start, first + total + 3))
    batch = records_to_arrow("orders", 3, body, sizes, start=start, end=end, include_headers=True)
    expected = [m for m in messages_from_records("orders", 3, body, sizes, start) if m.offset < end]
    if not expected:
        assert batch is None
        return
    batch.validate(full=True)
    assert batch.schema == source_schema(True)
    assert as_messages(batch) == expected


def test_schema_without_headers_and_column_order() -> None:
    body, sizes = fetch_body([[MessageRecord(b"v", b"k", "t", ("a",), (("h", b"x"),), TS)]], 7)
    batch = records_to_arrow("orders", 0, body, sizes, start=0, end=100)
    assert batch.schema.names == [c for c in SOURCE_COLUMNS if c != "headers"]
    assert batch.schema == source_schema(False)
    assert batch.column("offset").to_pylist() == [7]
    assert batch.column("partition").type == pa.int32()
    assert batch.column("timestamp").type == pa.timestamp("us", tz="UTC")


def test_schema_is_what_spark_expects() -> None:
    pytest.importorskip("pyspark")
    from pyspark.sql.pandas.types import to_arrow_schema  # noqa: PLC0415

    from tidemq.spark.source import spark_schema  # noqa: PLC0415

    for headers in (False, True):
        expected = to_arrow_schema(spark_schema(headers), timezone="UTC")
        assert source_schema(headers).equals(expected)
        assert str(source_schema(headers)) == str(expected)  # list children named alike


def test_records_outside_the_range_are_not_decoded() -> None:
    good = record([MessageRecord(b"a", timestamp_ms=TS)], 10)
    damaged = bytearray(record([MessageRecord(b"b", timestamp_ms=TS)], 11))
    damaged[-1] ^= 0xFF  # payload CRC no longer matches: decoding it would fail
    body = good + bytes(damaged)
    batch = records_to_arrow("t", 0, body, [len(good), len(damaged)], start=10, end=11)
    assert batch.column("value").to_pylist() == [b"a"]


def test_damaged_record_header_is_refused() -> None:
    raw = bytearray(record([MessageRecord(b"a", timestamp_ms=TS)], 0))
    raw[30] ^= 0xFF
    with pytest.raises(CorruptRecordError):
        records_to_arrow("t", 0, bytes(raw), [len(raw)], start=0, end=1)
    with pytest.raises(CorruptRecordError, match="sizes do not match"):
        records_to_arrow("t", 0, bytes(raw), [len(raw) + 1], start=0, end=1)
