"""The Spark type of a JSON Schema (valueFormat=json), and what has none."""

from __future__ import annotations

import pytest

from tidemq.spark.json_types import spark_json_of_json_schema


def test_objects_arrays_and_scalars_map_to_spark_types() -> None:
    schema = {
        "type": "object",
        "properties": {
            "n": {"type": "integer"},
            "x": {"type": ["number", "null"]},
            "ok": {"type": "boolean"},
            "when": {"type": "string", "format": "date-time"},
            "list": {"type": "array", "items": {"type": "integer"}},
        },
    }
    got = spark_json_of_json_schema(schema)
    assert [(f["name"], f["type"]) for f in got["fields"]] == [
        ("n", "long"),
        ("x", "double"),
        ("ok", "boolean"),
        ("when", "string"),
        ("list", {"type": "array", "elementType": "long", "containsNull": True}),
    ]
    assert all(f["nullable"] for f in got["fields"])


@pytest.mark.parametrize(
    ("schema", "problem"),
    [
        ({"type": "object", "properties": {"a": {"oneOf": []}}}, "property 'a' has no Spark"),
        ({"type": ["string", "integer"]}, "has no Spark type"),
        ({"type": "object"}, "has no Spark type"),
        ({"type": "array"}, "items is not a JSON Schema object"),
        ("string", "is not a JSON Schema object"),
    ],
)
def test_what_has_no_spark_type_is_refused_naming_where(schema: object, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        spark_json_of_json_schema(schema)
