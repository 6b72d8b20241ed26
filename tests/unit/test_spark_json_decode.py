"""`valueFormat=json`'s batch path gives the column the value-by-value path gives, on
generated values of every kind the JSON Schema maps (missing, extra and null fields,
nested objects, arrays of objects, maps, Arrow's own conversions), and leaves the values
it cannot take to that path, which fails naming the same offset and problem as before."""

from __future__ import annotations

import json
import random
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import StructType

from tidemq.core.errors import InvalidBatch
from tidemq.spark.json_decode import decode_json_column, json_batch_column, json_rows
from tidemq.spark.json_types import spark_json_of_json_schema

SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"},
        "price": {"type": ["number", "null"]},
        "item": {"type": "string"},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "buyer": {
            "type": "object",
            "properties": {
                "name": {"type": "string"},
                "address": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        },
        "lines": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}},
            },
        },
        "counts": {"type": "object", "additionalProperties": {"type": "integer"}},
        "grid": {"type": "array", "items": {"type": "array", "items": {"type": "number"}}},
    },
}
ARROW_TYPE = to_arrow_type(StructType.fromJson(spark_json_of_json_schema(SCHEMA)), timezone="UTC")
HEADER = b"\x00\x00\x00\x00\x07"
WHERE = ("orders", 3)


def _order(rng: random.Random, i: int) -> Any:
    """A value that fits the struct: fields left out, null, extra, nested, and values
    Arrow converts (an integer for a number, a float for an integer)."""
    order: dict[str, Any] = {
        "id": rng.choice([i, -i, 2**62, 0]),
        "price": rng.choice([None, 1.5 * i, i, 1e300, -0.0]),
        "item": rng.choice(["", f"item-{i}", "é\u2603\U0001f600", 'q"\\\n\t']),
        "ok": rng.choice([True, False, None]),
        "tags": rng.choice([[], ["a"] * (i % 4), None, ["x", None]]),
        "buyer": rng.choice([None, {}, {"name": "ann"}, {"address": {"city": "Oslo"}}]),
        "lines": [{"sku": f"s{k}", "qty": k} for k in range(i % 3)],
        "counts": rng.choice([{}, {"a": i}, {"a": 1, "b": None}, None]),
        "grid": rng.choice([[], [[1.0, 2], []], [[None]], None]),
        "extra": rng.choice([1, "x", [1, {"y": 2}], None]),
    }
    for name in rng.sample(sorted(order), rng.randrange(4)):
        del order[name]
    return order


def _framed(values: list[Any]) -> Any:
    return pa.array(
        [None if v is None else HEADER + json.dumps(v).encode() for v in values], pa.binary()
    )


def _both(column: Any) -> tuple[Any, Any]:
    offsets = list(range(100, 100 + len(column)))
    try:
        expected = json_rows(column.to_pylist(), offsets, ARROW_TYPE, WHERE)
    except InvalidBatch as exc:
        expected = str(exc)
    try:
        found = decode_json_column(column, offsets, ARROW_TYPE, WHERE)
    except InvalidBatch as exc:
        found = str(exc)
    return expected, found


@pytest.mark.parametrize("seed", range(5))
def test_the_batch_path_gives_the_value_by_value_column(seed: int) -> None:
    rng = random.Random(seed)
    values = [_order(rng, i) if rng.random() > 0.1 else None for i in range(300)]
    column = _framed(values)
    expected = json_rows(column.to_pylist(), [0] * len(values), ARROW_TYPE, WHERE)
    found = json_batch_column(column, ARROW_TYPE)
    assert found is not None  # the batch path took every value
    assert found.type == expected.type == ARROW_TYPE
    assert found.to_pylist() == expected.to_pylist()
    assert found.to_pylist()[0] is None or isinstance(found.to_pylist()[0], dict)


def test_a_batch_slice_a_json_null_and_blanks_read_as_before() -> None:
    column = _framed([{"id": 1}, None, {"id": 2}, {"id": 3}]).slice(1, 3)
    column = pa.concat_arrays([column, pa.array([HEADER + b"null", HEADER + b' {"id": 4}\n'])])
    expected, found = _both(column)
    assert isinstance(found, pa.Array)
    assert found.to_pylist() == expected.to_pylist()
    empty = dict.fromkeys(SCHEMA["properties"])
    assert found.to_pylist() == [
        None,
        {**empty, "id": 2},
        {**empty, "id": 3},
        None,
        {**empty, "id": 4},
    ]


@pytest.mark.parametrize(
    ("bad", "problem"),
    [
        (b"\x05\x00\x00\x00\x07{}", "not framed JSON"),
        (b"\x00\x00", "not framed JSON"),
        (HEADER + b'{"id": 1', "not framed JSON"),
        (HEADER + b'{"id": 1} {"id": 2}', "not framed JSON"),
        (HEADER + b"", "not framed JSON"),
        (HEADER + b'{"id": "one"}', "does not fit"),
        (HEADER + b'{"tags": [1]}', "does not fit"),
        (HEADER + b'{"buyer": 5}', "does not fit"),
        (HEADER + b'{"id": 99999999999999999999}', "does not fit"),
        (HEADER + b"[1]", "does not fit"),
    ],
)
def test_a_bad_value_fails_naming_its_offset_as_before(bad: bytes, problem: str) -> None:
    column = pa.concat_arrays([_framed([{"id": 1}, None]), pa.array([bad], pa.binary())])
    assert json_batch_column(column, ARROW_TYPE) is None
    expected, found = _both(column)
    assert isinstance(found, str)
    assert found == expected
    assert "orders/3 offset 102: " in found
    assert problem in found


def test_guid_framed_values_go_through_the_value_by_value_path() -> None:
    guid = b"\x01" + bytes(range(16)) + b'{"id": 5}'
    column = pa.array([guid, HEADER + b'{"id": 6}'], pa.binary())
    assert json_batch_column(column, ARROW_TYPE) is None
    expected, found = _both(column)
    assert found == expected
    assert [row["id"] for row in found.to_pylist()] == [5, 6]
