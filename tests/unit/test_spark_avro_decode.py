"""`valueFormat=avro`'s columnar path: an Avro container read by polars into Arrow
columns gives the same struct column as fastavro's records do, for every type the Spark
source maps; a type polars does not read raises (the decoder then uses fastavro)."""

from __future__ import annotations

import datetime as dt
import io
from typing import Any

import fastavro
import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import StructType

from tidemq.spark.avro_decode import columns_of_block, polars_reads
from tidemq.spark.value_format import spark_json_of

SCHEMA: dict[str, Any] = {
    "type": "record",
    "name": "Order",
    "namespace": "shop",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "qty", "type": "int"},
        {"name": "price", "type": ["null", "double"], "default": None},
        {"name": "ratio", "type": "float"},
        {"name": "ok", "type": "boolean"},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "raw", "type": "bytes"},
        {"name": "speed", "type": {"type": "enum", "name": "Speed", "symbols": ["SLOW", "FAST"]}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
        {"name": "day", "type": {"type": "int", "logicalType": "date"}},
        {"name": "tags", "type": {"type": "array", "items": ["null", "string"]}},
        {
            "name": "to",
            "type": [
                "null",
                {
                    "type": "record",
                    "name": "Address",
                    "fields": [{"name": "city", "type": "string"}],
                },
            ],
            "default": None,
        },
    ],
}


def _record(i: int) -> dict[str, Any]:
    return {
        "id": i * 10_000_000_000,
        "qty": i,
        "price": None if i % 3 == 0 else i * 1.5,
        "ratio": 0.5,
        "ok": i % 2 == 0,
        "note": None if i % 2 else f"n{i}",
        "raw": bytes([i % 256]),
        "speed": "FAST" if i % 2 else "SLOW",
        "at": dt.datetime(2024, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i),
        "day": dt.date(2024, 1, 1) + dt.timedelta(days=i),
        "tags": ["a", None][: i % 3],
        "to": None if i % 4 == 0 else {"city": f"c{i}"},
    }


def _container(schema: dict[str, Any], records: list[dict[str, Any]]) -> bytes:
    out = io.BytesIO()
    fastavro.writer(out, fastavro.parse_schema(schema), records)
    return out.getvalue()


def _arrow_type(schema: dict[str, Any]) -> Any:
    return to_arrow_type(StructType.fromJson(spark_json_of(schema, {})), timezone="UTC")


def test_polars_columns_equal_fastavros_records() -> None:
    pytest.importorskip("polars")
    records = [_record(i) for i in range(50)]
    block = _container(SCHEMA, records)
    arrow_type = _arrow_type(SCHEMA)
    columnar = columns_of_block(block, arrow_type)
    expected = pa.array(list(fastavro.reader(io.BytesIO(block))), type=arrow_type)
    assert columnar.type == expected.type
    assert columnar.to_pylist() == expected.to_pylist()


@pytest.mark.parametrize(
    ("field_type", "columnar"),
    [
        ("long", True),
        ({"type": "array", "items": ["null", "string"]}, True),
        ({"type": "map", "values": "long"}, False),  # polars panics on maps
        (["null", "string", "long"], False),  # and on unions other than [null, T]
        ({"type": "long", "logicalType": "time-micros"}, False),
    ],
)
def test_schemas_polars_does_not_read_go_to_fastavro(field_type: Any, columnar: bool) -> None:
    schema = {"type": "record", "name": "R", "fields": [{"name": "f", "type": field_type}]}
    assert polars_reads(schema) is columnar
    assert polars_reads(SCHEMA)
