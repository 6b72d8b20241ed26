"""The Spark type of a JSON Schema (`valueFormat=json`), in Spark's JSON form of a type (as
`StructType.fromJson` reads it: this module stays free of pyspark).

Objects with `properties` become structs (fields in the schema's order, all nullable: a
JSON document may leave a property out), `array` with `items` arrays, `string` strings
(`format: date-time` and `date` too: JSON carries text), `integer` longs, `number`
doubles, `boolean` booleans, objects without `properties` whose `additionalProperties` is
a schema maps of strings to that type; `["T", "null"]` is a nullable T. Anything else
(`oneOf`, `$ref`, several non-null types, an object with neither) has no single Spark
type and is refused, naming where it is.
"""

from __future__ import annotations

from typing import Any, Final

__all__ = ["spark_json_of_json_schema"]

_SCALARS: Final[dict[str, str]] = {
    "string": "string",
    "integer": "long",
    "number": "double",
    "boolean": "boolean",
}


def spark_json_of_json_schema(schema: Any, where: str = "the schema") -> Any:
    if not isinstance(schema, dict):
        raise ValueError(f"{where} is not a JSON Schema object")
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        if len(kinds) != 1:
            raise ValueError(f'{where}: type {kind} has no Spark type (only [T, "null"])')
        kind = kinds[0]
    if kind in _SCALARS:
        return _SCALARS[kind]
    if kind == "array":
        return {
            "type": "array",
            "elementType": spark_json_of_json_schema(schema.get("items"), f"{where}'s items"),
            "containsNull": True,
        }
    if kind == "object" and isinstance(schema.get("properties"), dict):
        return {
            "type": "struct",
            "fields": [
                {
                    "name": name,
                    "type": spark_json_of_json_schema(prop, f"property {name!r}"),
                    "nullable": True,
                    "metadata": {},
                }
                for name, prop in schema["properties"].items()
            ],
        }
    if kind == "object" and isinstance(schema.get("additionalProperties"), dict):
        return {
            "type": "map",
            "keyType": "string",
            "valueType": spark_json_of_json_schema(
                schema["additionalProperties"], f"{where}'s additionalProperties"
            ),
            "valueContainsNull": True,
        }
    raise ValueError(
        f"{where} has no Spark type (use type object with properties or additionalProperties, "
        "array with items, "
        "string, integer, number or boolean)"
    )
