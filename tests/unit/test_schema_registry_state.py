"""The schema registry's pure parts: Confluent's wire format, schema parsing, the
compatibility modes (Confluent's documented rules for Avro, ours for JSON Schema), and the
registry state rebuilt from its log, races between writers included."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq.schema.compatibility import compatibility_problems
from tidemq.schema.formats import ParsedSchema, parse_schema
from tidemq.schema.model import (
    Compatibility,
    ErrorCode,
    Mode,
    Reference,
    RegistryError,
    SchemaType,
)
from tidemq.schema.registry_state import Record, RegistryState
from tidemq.schema.wire import (
    WireFormatError,
    decode_message_indexes,
    encode_message_indexes,
    frame,
    unframe,
)

AVRO = SchemaType.AVRO


def record(*fields: dict[str, object], name: str = "Order") -> str:
    return json.dumps({"type": "record", "name": name, "fields": list(fields)})


V1 = record({"name": "id", "type": "long"})
V2_DEFAULT = record(
    {"name": "id", "type": "long"}, {"name": "note", "type": "string", "default": ""}
)
V2_NO_DEFAULT = record({"name": "id", "type": "long"}, {"name": "note", "type": "string"})


# --------------------------------------------------------------------------- wire format


def test_framing_round_trips_and_refuses_what_is_not_framed() -> None:
    framed = frame(42, b"payload")
    assert framed[:5] == b"\x00\x00\x00\x00\x2a"
    got = unframe(framed)
    assert (got.schema_id, bytes(got.payload)) == (42, b"payload")
    with pytest.raises(WireFormatError, match="magic byte 0"):
        unframe(b"\x07abc")
    with pytest.raises(WireFormatError, match="needs 5 bytes"):
        unframe(b"\x00\x01")


@given(st.lists(st.integers(0, 1000), min_size=1, max_size=5))
def test_protobuf_message_indexes_round_trip(indexes: list[int]) -> None:
    raw = encode_message_indexes(indexes) + b"rest"
    got, rest = decode_message_indexes(memoryview(raw))
    assert (got, bytes(rest)) == (indexes, b"rest")
    assert encode_message_indexes([0]) == b"\x00"  # Confluent's shorthand


# --------------------------------------------------------------------------- parsing


def test_invalid_schemas_are_refused_with_what_is_wrong() -> None:
    with pytest.raises(RegistryError, match="not valid JSON") as info:
        parse_schema(AVRO, "{nope")
    assert info.value.code is ErrorCode.INVALID_SCHEMA
    with pytest.raises(RegistryError, match="invalid Avro schema"):
        parse_schema(AVRO, json.dumps({"type": "record", "name": "R", "fields": [{"name": "a"}]}))
    with pytest.raises(RegistryError, match="invalid JSON schema at /type"):
        parse_schema(SchemaType.JSON, json.dumps({"type": 5}))
    with pytest.raises(RegistryError, match=r"the \.proto text does not parse"):
        parse_schema(SchemaType.PROTOBUF, 'syntax = "proto3"; message M { int32 a = ; }')
    with pytest.raises(RegistryError, match="not a serialized FileDescriptorProto"):
        parse_schema(SchemaType.PROTOBUF, "AAAA/w==")


def test_the_same_schema_written_differently_has_one_identity() -> None:
    a = parse_schema(AVRO, '{"type": "record", "name": "R", "fields": []}')
    b = parse_schema(AVRO, '{"fields":[],"name":"R","type":"record"}')
    assert a.identity == b.identity
    assert a.text == '{"type":"record","name":"R","fields":[]}'


# --------------------------------------------------------------------------- compatibility


# Confluent's documented Avro rules: (change, BACKWARD ok, FORWARD ok).
AVRO_CASES = [
    ("add a field with a default", V1, V2_DEFAULT, True, True),
    ("add a field without a default", V1, V2_NO_DEFAULT, False, True),
    ("delete a field with a default", V2_DEFAULT, V1, True, True),
    ("delete a field without a default", V2_NO_DEFAULT, V1, True, False),
    (
        "widen int to long",
        record({"name": "n", "type": "int"}),
        record({"name": "n", "type": "long"}),
        True,
        False,
    ),
    (
        "change a field's type",
        record({"name": "n", "type": "int"}),
        record({"name": "n", "type": "string"}),
        False,
        False,
    ),
]


@pytest.mark.parametrize(("change", "old", "new", "backward", "forward"), AVRO_CASES)
def test_avro_compatibility_follows_confluents_rules(
    change: str, old: str, new: str, backward: bool, forward: bool
) -> None:
    earlier, parsed = [parse_schema(AVRO, old)], parse_schema(AVRO, new)
    expected = {
        Compatibility.BACKWARD: backward,
        Compatibility.FORWARD: forward,
        Compatibility.FULL: backward and forward,
        Compatibility.NONE: True,
    }
    for level, ok in expected.items():
        assert (not compatibility_problems(level, parsed, earlier)) == ok, (change, level)


def test_an_incompatible_avro_change_names_the_field() -> None:
    problems = compatibility_problems(
        Compatibility.BACKWARD, parse_schema(AVRO, V2_NO_DEFAULT), [parse_schema(AVRO, V1)]
    )
    assert problems == [
        "reader field missing default value at field 'note' (/fields/1) "
        "(new schema reading data of the latest version)"
    ]


def test_transitive_modes_check_every_earlier_version() -> None:
    v1 = parse_schema(AVRO, record({"name": "a", "type": "int"}))
    v2 = parse_schema(AVRO, record({"name": "a", "type": "int", "default": 0}))
    v3 = parse_schema(AVRO, record({"name": "b", "type": "int", "default": 0}))
    # v3 reads v2's data (a dropped, b defaulted), and v1's too: BACKWARD either way.
    assert not compatibility_problems(Compatibility.BACKWARD_TRANSITIVE, v3, [v1, v2])
    # FORWARD: v2 reads v3's data (a defaulted) but v1 cannot (a has no default).
    assert not compatibility_problems(Compatibility.FORWARD, v3, [v1, v2])
    assert compatibility_problems(Compatibility.FORWARD_TRANSITIVE, v3, [v1, v2])


def _json(schema: dict[str, object]) -> ParsedSchema:
    return parse_schema(SchemaType.JSON, json.dumps(schema))


def test_json_schema_compatibility_names_the_path() -> None:
    old = _json({"type": "object", "properties": {"a": {"type": "integer"}}})
    required = _json(
        {"type": "object", "properties": {"a": {"type": "integer"}, "b": {}}, "required": ["b"]}
    )
    assert compatibility_problems(Compatibility.BACKWARD, required, [old]) == [
        "#/properties/b: required property added (new schema reading data of the latest version)"
    ]
    widened = _json({"type": "object", "properties": {"a": {"type": "number"}}})
    assert not compatibility_problems(Compatibility.BACKWARD, widened, [old])
    assert compatibility_problems(Compatibility.FORWARD, widened, [old])
    closed = _json({"type": "object", "properties": {}, "additionalProperties": False})
    assert compatibility_problems(Compatibility.BACKWARD, closed, [old]) == [
        "#/properties/a: property removed from a closed object "
        "(new schema reading data of the latest version)"
    ]
    enum_old = _json({"enum": ["a", "b"]})
    enum_new = _json({"enum": ["a"]})
    assert compatibility_problems(Compatibility.BACKWARD, enum_new, [enum_old])


# --------------------------------------------------------------------------- registry state


def _register(
    state: RegistryState, subject: str, text: str, log: list[tuple[bytes, bytes | None]]
) -> int:
    info, rec = state.plan_register(subject, state.parse(AVRO, text, ()))
    if rec is not None:
        log.append(rec)
        assert state.apply(*rec)
    return info.schema_id


def test_registration_ids_versions_and_lookups() -> None:
    state, log = RegistryState(), list[Record]()
    first = _register(state, "orders-value", V1, log)
    assert _register(state, "orders-value", V1, log) == first  # already there: no record
    assert len(log) == 1
    assert _register(state, "audit-value", V1, log) == first  # one id per schema
    second = _register(state, "orders-value", V2_DEFAULT, log)
    assert second == first + 1
    assert state.versions("orders-value") == [1, 2]
    assert state.version("orders-value", "latest").schema_id == second
    assert state.uses(first) == [("audit-value", 1), ("orders-value", 1)]
    assert state.find("orders-value", state.parse(AVRO, V1, ())).version == 1
    with pytest.raises(RegistryError) as info:
        _register(state, "orders-value", record({"name": "id", "type": "string"}), log)
    assert info.value.code is ErrorCode.INCOMPATIBLE_SCHEMA
    assert "type" in info.value.message.lower()
    # A replay of the log gives the same state.
    again = RegistryState()
    for key, value in log:
        assert again.apply(key, value)
    assert again.versions("orders-value") == [1, 2]
    assert again.version("audit-value", 1).schema_id == first


def test_soft_then_permanent_deletes() -> None:
    state, log = RegistryState(), list[Record]()
    _register(state, "s", V1, log)
    _register(state, "s", V2_DEFAULT, log)
    with pytest.raises(RegistryError) as info:
        state.plan_delete_subject("s", permanent=True)
    assert info.value.code is ErrorCode.SUBJECT_NOT_SOFT_DELETED
    versions, records = state.plan_delete_subject("s", permanent=False)
    assert versions == [1, 2]
    for rec in records:
        state.apply(*rec)
    assert state.subjects() == []
    assert state.subjects(deleted=True) == ["s"]
    with pytest.raises(RegistryError) as info:
        state.versions("s")
    assert info.value.code is ErrorCode.SUBJECT_NOT_FOUND
    _, records = state.plan_delete_subject("s", permanent=True)
    for rec in records:
        state.apply(*rec)
    assert state.subjects(deleted=True) == []
    with pytest.raises(RegistryError) as info:
        state.schema(1)
    assert info.value.code is ErrorCode.SCHEMA_NOT_FOUND


def test_config_and_mode() -> None:
    state, log = RegistryState(), list[Record]()
    assert state.compatibility(None) is Compatibility.BACKWARD
    state.apply(*state.config_record("s", Compatibility.NONE))
    assert state.compatibility("s") is Compatibility.NONE
    _register(state, "s", V1, log)
    _register(state, "s", record({"name": "x", "type": "string"}), log)  # NONE: anything
    state.apply(*state.mode_record(None, Mode.READONLY))
    with pytest.raises(RegistryError) as info:
        _register(state, "s", V2_DEFAULT, log)
    assert info.value.code is ErrorCode.OPERATION_NOT_PERMITTED


def test_references_resolve_and_block_deletes() -> None:
    state, log = RegistryState(), list[Record]()
    _register(state, "customer", record({"name": "name", "type": "string"}, name="Customer"), log)
    order = record({"name": "customer", "type": "Customer"})
    ref = Reference("Customer", "customer", 1)
    info, rec = state.plan_register("order", state.parse(AVRO, order, [ref]))
    assert rec is not None
    state.apply(*rec)
    assert state.referenced_by("customer", 1) == [info.schema_id]
    with pytest.raises(RegistryError) as raised:
        state.plan_delete_version("customer", 1, permanent=False)
    assert raised.value.code is ErrorCode.REFERENCE_EXISTS
    with pytest.raises(RegistryError, match="reference cannot be resolved"):
        state.parse(AVRO, order, [Reference("Customer", "customer", 9)])


def test_racing_writers_are_decided_by_log_order_and_compaction_keeps_the_decision() -> None:
    """Two nodes plan from the same state: both take id 1 / version 1 for different
    schemas. The first record in the log wins on every node; the loser is ignored, and
    its writer's tombstone removes it; compaction (latest per key) changes nothing."""
    a, b = RegistryState(), RegistryState()
    _, rec_a = a.plan_register("s", a.parse(AVRO, V1, ()))
    _, rec_b = b.plan_register("s", b.parse(AVRO, record({"name": "z", "type": "int"}), ()))
    assert rec_a is not None
    assert rec_b is not None
    assert rec_a[0] != rec_b[0]  # the ids are in the keys: neither replaces the other
    log = [rec_a, rec_b]
    for node in (RegistryState(), RegistryState()):
        assert [node.apply(*r) for r in log] == [True, False]
        assert node.version("s", 1).schema.identity == parse_schema(AVRO, V1).identity
    log.append((rec_b[0], None))  # the loser cleans up
    compacted = dict(log)  # latest value per key, in first-offset order
    node = RegistryState()
    for key, value in compacted.items():
        node.apply(key, value)
    assert node.versions("s") == [1]
    assert node.version("s", 1).schema.identity == parse_schema(AVRO, V1).identity


def _replay(log: list[Record]) -> RegistryState:
    state = RegistryState()
    for key, value in log:
        state.apply(key, value)
    return state


def test_a_replayed_log_in_any_interleaving_of_two_writers_is_consistent() -> None:
    rng = random.Random(3)
    schemas = [record({"name": f"f{i}", "type": "int", "default": 0}) for i in range(6)]
    for _ in range(30):
        nodes = [RegistryState(), RegistryState()]
        log: list[Record] = []
        for text in schemas:
            node = rng.choice(nodes)
            _, rec = node.plan_register(rng.choice(["x", "y"]), node.parse(AVRO, text, ()))
            if rec is not None:
                log.append(rec)
            # The writer reads its record back; the other node catches up only sometimes.
            for i, n in enumerate(nodes):
                if n is node or rng.random() < 0.5:
                    nodes[i] = _replay(log)
        replayed = [_replay(log), _replay(log)]
        assert replayed[0].subjects() == replayed[1].subjects()
        for subject in replayed[0].subjects():
            ids = [replayed[0].version(subject, v).schema_id for v in replayed[0].versions(subject)]
            assert ids == [
                replayed[1].version(subject, v).schema_id for v in replayed[1].versions(subject)
            ]
        # No id names two schemas.
        seen: dict[int, str] = {}
        for subject in replayed[0].subjects():
            for v in replayed[0].versions(subject):
                info = replayed[0].version(subject, v)
                assert seen.setdefault(info.schema_id, info.schema.identity) == info.schema.identity


def test_one_schema_never_gets_two_ids() -> None:
    """Two nodes register the same schema under different subjects, each with a new id:
    the later record loses (its writer then registers it again and gets the first id)."""
    a, b = RegistryState(), RegistryState()
    info_a, rec_a = a.plan_register("x", a.parse(AVRO, V1, ()))
    b.apply(*b.config_record(None, Compatibility.NONE))
    b.max_id = 5  # b had seen other schemas
    info_b, rec_b = b.plan_register("y", b.parse(AVRO, V1, ()))
    assert rec_a is not None
    assert rec_b is not None
    assert info_a.schema_id != info_b.schema_id
    node = _replay([rec_a, rec_b])
    assert node.subjects() == ["x"]
    info, again = node.plan_register("y", node.parse(AVRO, V1, ()))
    assert info.schema_id == info_a.schema_id
    assert again is not None
    assert node.apply(*again)


def _pb(build: Any) -> str:
    """A serialized FileDescriptorProto (base64), after `build(file proto)`."""
    import base64  # noqa: PLC0415

    from google.protobuf import descriptor_pb2  # noqa: PLC0415

    proto = descriptor_pb2.FileDescriptorProto(name="t.proto", package="p")
    build(proto)
    return base64.b64encode(proto.SerializeToString()).decode()


def _message(proto: Any, name: str, *fields: tuple[str, int, int, int]) -> Any:
    m = proto.message_type.add(name=name)
    for fname, number, ftype, label in fields:
        m.field.add(name=fname, number=number, type=ftype, label=label)
    return m


def test_protobuf_compatibility_follows_confluents_rules() -> None:
    from google.protobuf.descriptor_pb2 import FieldDescriptorProto as F  # noqa: PLC0415

    opt, rep, req = F.LABEL_OPTIONAL, F.LABEL_REPEATED, F.LABEL_REQUIRED
    base = [("id", 1, F.TYPE_INT64, opt), ("name", 2, F.TYPE_STRING, opt)]

    def schema(*fields: tuple[str, int, int, int], package: str = "p") -> Any:
        def build(proto: Any) -> None:
            proto.package = package
            _message(proto, "M", *fields)

        return parse_schema(SchemaType.PROTOBUF, _pb(build))

    old = schema(*base)
    backward = Compatibility.BACKWARD
    ok = [
        schema(*base, ("extra", 3, F.TYPE_BOOL, opt)),  # a field added
        schema(base[0]),  # a field removed
        schema(("renamed", 1, F.TYPE_INT64, opt), base[1]),  # renamed, same number
        schema(("id", 1, F.TYPE_UINT32, opt), base[1]),  # same wire group
        schema(("id", 1, F.TYPE_INT64, opt), ("name", 2, F.TYPE_BYTES, opt)),
    ]
    for new in ok:
        assert compatibility_problems(backward, new, [old]) == []
    bad = {
        "changed type from int64 to string": schema(("id", 1, F.TYPE_STRING, opt), base[1]),
        "between repeated and singular": schema(("id", 1, F.TYPE_INT64, rep), base[1]),
        "required field 3": schema(*base, ("must", 3, F.TYPE_INT32, req)),
        "package changed": schema(*base, package="q"),
    }
    for expected, new in bad.items():
        problems = compatibility_problems(backward, new, [old])
        assert any(expected in p for p in problems), (expected, problems)

    # The same messages registered under another file name are the same schema.
    def other_file(proto: Any) -> None:
        proto.name = "x.proto"
        _message(proto, "M", *base)

    renamed = parse_schema(SchemaType.PROTOBUF, _pb(other_file))
    assert renamed.identity == old.identity


def test_the_proto_text_and_serialized_forms_are_one_schema() -> None:
    """A `.proto` text and the descriptor protoc would make of it (json names filled in,
    another file name) have one identity; nested types, enums, maps, oneofs and proto3
    optionals are laid out as protoc lays them."""
    from google.protobuf.descriptor_pb2 import FieldDescriptorProto as F  # noqa: PLC0415

    text = """syntax = "proto3";
    package shop;
    message Order {
      optional double price = 6;
      int64 id = 1;
      oneof pay { string card = 4; }
      map<string, int32> counts = 3;
      message Line { Kind kind = 1; enum Kind { A = 0; } }
      repeated Line lines = 7;
    }"""
    parsed = parse_schema(SchemaType.PROTOBUF, text)

    def build(proto: Any) -> None:
        proto.name, proto.package, proto.syntax = "shop/order.proto", "shop", "proto3"
        order = proto.message_type.add(name="Order")
        fields = [("price", 6, F.TYPE_DOUBLE, F.LABEL_OPTIONAL, ""),
                  ("id", 1, F.TYPE_INT64, F.LABEL_OPTIONAL, ""),
                  ("card", 4, F.TYPE_STRING, F.LABEL_OPTIONAL, ""),
                  ("counts", 3, F.TYPE_MESSAGE, F.LABEL_REPEATED, ".shop.Order.CountsEntry"),
                  ("lines", 7, F.TYPE_MESSAGE, F.LABEL_REPEATED, ".shop.Order.Line")]  # fmt: skip
        for name, number, ftype, label, type_name in fields:
            f = order.field.add(name=name, number=number, type=ftype, label=label)
            f.json_name = name  # protoc fills it in
            if type_name:
                f.type_name = type_name
        order.field[0].proto3_optional, order.field[0].oneof_index = True, 1
        order.field[2].oneof_index = 0
        entry = order.nested_type.add(name="CountsEntry")
        entry.options.map_entry = True
        entry.field.add(name="key", number=1, type=F.TYPE_STRING, label=F.LABEL_OPTIONAL)
        entry.field.add(name="value", number=2, type=F.TYPE_INT32, label=F.LABEL_OPTIONAL)
        line = order.nested_type.add(name="Line")
        kind = line.field.add(name="kind", number=1, type=F.TYPE_ENUM, label=F.LABEL_OPTIONAL)
        kind.type_name = ".shop.Order.Line.Kind"
        line.enum_type.add(name="Kind").value.add(name="A", number=0)
        order.oneof_decl.add(name="pay")
        order.oneof_decl.add(name="_price")

    assert parse_schema(SchemaType.PROTOBUF, _pb(build)).identity == parsed.identity
    assert parsed.text == text.strip()  # stored as registered
