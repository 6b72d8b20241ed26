"""Schemas derived from a Spark struct (as its Arrow type) for a write whose subject has
none: the Protobuf message (built by protobuf's own descriptor pool) and the JSON Schema
(checked by `jsonschema`) have the struct's fields, and types with no counterpart are
refused naming the field."""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

import jsonschema
import pyarrow as pa
import pytest
from google.protobuf import (
    descriptor_pb2,
    descriptor_pool,
    json_format,
    message_factory,
    timestamp_pb2,  # noqa: F401 - the well-known type joins the pool
)

from tidemq.spark.value_schemas import derived_schema

ORDER = pa.struct(
    [
        pa.field("id", pa.int64(), nullable=False),
        pa.field("price", pa.float64()),
        pa.field("qty", pa.int32()),
        pa.field("buyer", pa.struct([pa.field("name", pa.string())])),
        pa.field("lines", pa.list_(pa.struct([pa.field("sku", pa.string())]))),
        pa.field("counts", pa.map_(pa.string(), pa.int64())),
        pa.field("at", pa.timestamp("us", tz="UTC")),
        pa.field("Buyer", pa.string()),  # its nested type must not take this name
    ]
)


def _message_class(text: str) -> Any:
    proto = descriptor_pb2.FileDescriptorProto.FromString(base64.b64decode(text))
    pool = descriptor_pool.DescriptorPool()
    pool.AddSerializedFile(
        descriptor_pool.Default().FindFileByName(proto.dependency[0]).serialized_pb
    )
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("topLevelRecord"))


def test_a_struct_derives_a_proto3_message() -> None:
    text, kind = derived_schema("protobuf", ORDER)
    assert kind == "PROTOBUF"
    cls = _message_class(text)
    d = cls.DESCRIPTOR
    assert [f.name for f in d.fields] == [ORDER.field(i).name for i in range(ORDER.num_fields)]
    assert [f.number for f in d.fields] == list(range(1, 9))
    assert d.fields_by_name["buyer"].message_type.name == "Buyer_"
    assert d.fields_by_name["lines"].message_type.name == "Lines"
    assert d.fields_by_name["counts"].message_type.GetOptions().map_entry
    assert d.fields_by_name["at"].message_type.full_name == "google.protobuf.Timestamp"
    # Nullable scalars are proto3 `optional` (null and zero stay apart); id is not nullable.
    assert d.fields_by_name["price"].has_presence
    assert not d.fields_by_name["id"].has_presence
    value = json_format.ParseDict(
        {"id": 1, "qty": 0, "buyer": {"name": "ann"}, "lines": [{"sku": "x"}],
         "counts": {"a": 2}, "at": "2024-01-01T00:00:00Z"},
        cls(),
    )  # fmt: skip
    back = cls.FromString(value.SerializeToString())
    assert back.HasField("qty")
    assert not back.HasField("price")
    assert back.at.ToDatetime(tzinfo=dt.UTC) == dt.datetime(2024, 1, 1, tzinfo=dt.UTC)


def test_a_struct_derives_a_json_schema() -> None:
    text, kind = derived_schema("json", ORDER)
    assert kind == "JSON"
    schema = json.loads(text)
    jsonschema.Draft7Validator.check_schema(schema)
    assert schema["title"] == "topLevelRecord"
    assert schema["required"] == ["id"]
    assert schema["properties"]["price"] == {"type": ["number", "null"]}
    assert schema["properties"]["counts"] == {
        "type": ["object", "null"],
        "additionalProperties": {"type": ["integer", "null"]},
    }
    assert schema["properties"]["at"] == {"type": ["string", "null"], "format": "date-time"}
    good = {"id": 1, "price": None, "counts": {"a": 1}, "lines": [{"sku": "x"}]}
    jsonschema.validate(good, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"price": 1.0}, schema)  # no id


@pytest.mark.parametrize(
    ("kind", "struct", "message"),
    [
        ("protobuf", pa.struct([("a", pa.list_(pa.list_(pa.int32())))]),
         r"topLevelRecord\.a \(element\) is list<item: int32>: Protobuf has no array or map"),
        ("protobuf", pa.struct([("m", pa.map_(pa.string(), pa.list_(pa.int32())))]),
         r"topLevelRecord\.m \(map value\)"),
        ("protobuf", pa.struct([("m", pa.map_(pa.float64(), pa.int32()))]),
         r"map field topLevelRecord\.m has double keys"),
        ("protobuf", pa.struct([("d", pa.date32())]),
         r"cannot derive a Protobuf type for date32\[day\] \(field topLevelRecord\.d\)"),
        ("protobuf", pa.struct([("s", pa.struct([("x y", pa.int32())]))]),
         r"field 'topLevelRecord\.S\.x y' is not a Protobuf field name"),
        ("json", pa.struct([("b", pa.binary())]),
         r"cannot derive a JSON Schema type for binary \(field topLevelRecord\.b\)"),
        ("json", pa.struct([("m", pa.map_(pa.int32(), pa.int32()))]),
         r"JSON Schema type for map<int32, int32> \(field topLevelRecord\.m\)"),
        ("avro", pa.struct([("d", pa.decimal128(5, 2))]), r"cannot derive an Avro type"),
    ],
)  # fmt: skip
def test_types_without_a_counterpart_are_refused_naming_the_field(
    kind: str, struct: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        derived_schema(kind, struct)
