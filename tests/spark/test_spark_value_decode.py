"""`valueFormat=protobuf`'s batch path (a column a field) gives the column the
value-by-value path (a dict a message) gives, on generated `gen.Kinds` values (every
scalar type, enums known and unknown, proto3 `optional`, a oneof, nested and repeated
messages, maps, timestamps, an imported message: a reference; the message third in its
file), written with two schema versions into one batch and read with either as the
reader's; values it cannot take fail naming the same offset and problem as before.
Against the registry of a real broker (no Spark session: the decoders run as the
executors run them)."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa
import pytest
from pyspark.sql.pandas.types import to_arrow_type
from pyspark.sql.types import StructType
from tests.support.protobuf_kinds import kinds_class

import tidemq
from tidemq.spark.protobuf_decode import (
    decode_protobuf_column,
    protobuf_batch_column,
    protobuf_rows,
)
from tidemq.spark.value_format import ValueFormat, resolve_value_format

pytestmark = pytest.mark.spark

WHERE = ("kinds", 0)
_INT_LIMITS = {
    "i32": (-(2**31), 2**31 - 1),
    "i64": (-(2**63), 2**63 - 1),
    "u32": (0, 2**32 - 1),
    "u64": (0, 2**63 - 1),  # past 2^63 the task fails (tested below)
    "s32": (-(2**31), 2**31 - 1),
    "s64": (-(2**63), 2**63 - 1),
    "f32": (0, 2**32 - 1),
    "f64": (0, 2**63 - 1),
    "sf32": (-(2**31), 2**31 - 1),
    "sf64": (-(2**63), 2**63 - 1),
}


def _scalars(rng: random.Random, k: Any) -> None:
    for name, (low, high) in _INT_LIMITS.items():
        setattr(k, name, rng.choice([0, low, high, rng.randint(low, high)]))
    k.fl = rng.choice([0.0, 1.5, -3.25e10, float("inf")])
    k.db = rng.choice([0.0, 0.1, -1e300, float("-inf")])
    k.ok = rng.random() < 0.5
    k.s = rng.choice(["", "plain", "é\u2603\U0001f600", "a\x00b"])
    k.raw = rng.randbytes(rng.randrange(5))
    k.level = rng.choice([0, 1, 2, 7])  # 7: a number the enum does not name
    k.color = rng.choice([0, 1])


def _kinds(rng: random.Random, cls: Any, i: int) -> Any:
    k = cls()
    _scalars(rng, k)
    if rng.random() < 0.5:
        k.maybe = rng.choice([0, i])
    if rng.random() < 0.3:
        k.total.SetInParent()  # present, every field default
    elif rng.random() < 0.5:
        k.total.cents, k.total.currency = i, "EUR"
    k.tags.extend(f"t{j}" for j in range(i % 4))
    for j in range(rng.randrange(3)):
        k.lines.add(cents=j, currency="" if j else "USD")
    k.levels.extend(rng.choice([0, 1, 2, 9]) for _ in range(rng.randrange(3)))
    k.counts.update({f"c{j}": j - 1 for j in range(rng.randrange(3))})
    for j in range(rng.randrange(3)):
        k.prices[j * 1000].cents = j
    if rng.random() < 0.7:
        k.inner.c = rng.choice([0, 1, 5])
        for j in range(rng.randrange(3)):
            k.inner.deep.add(d=f"d{j}", xs=list(range(j)))
        if rng.random() < 0.5:
            k.inner.one.d = "one"
    _more(rng, k, i)
    return k


def _more(rng: random.Random, k: Any, i: int) -> None:
    choice = rng.randrange(3)
    if choice == 1:
        k.name = f"n{i}"
    elif choice == 2:
        k.number = 0
    if rng.random() < 0.5:
        k.at.seconds, k.at.nanos = 1_700_000_000 + i, rng.choice([0, 999, 123_456_789])
    k.ds.extend(rng.random() for _ in range(rng.randrange(3)))
    for j in range(rng.randrange(2)):
        k.stamps.add(seconds=j, nanos=1000 * j)
    if "note" in k.DESCRIPTOR.fields_by_name and rng.random() < 0.5:
        k.note = f"note {i}"


def _reader(registry_url: str, subject: str, version: str) -> tuple[ValueFormat, Any]:
    fmt = resolve_value_format(
        {
            "valueFormat": "protobuf",
            "schemaRegistry": registry_url,
            "subject": subject,
            "schemaVersion": version,
            "protobufMessage": "gen.Kinds",
        }
    )
    assert fmt is not None
    return fmt, to_arrow_type(StructType.fromJson(fmt.spark_json()), timezone="UTC")


def _written(registry_url: str, topic: str, seed: int) -> list[bytes | None]:
    """Values of version 1, then of version 2 (both registered), and tombstones."""
    rng = random.Random(seed)
    values: list[bytes | None] = []
    for version in (1, 2):
        cls = kinds_class(version)
        serialize = tidemq.ProtobufSerializer(tidemq.SchemaRegistry(registry_url), cls)
        for i in range(150):
            values.append(None if rng.random() < 0.05 else serialize(topic, _kinds(rng, cls, i)))
    return values


def _both(column: Any, fmt: ValueFormat, arrow_type: Any) -> tuple[Any, Any]:
    offsets = list(range(len(column)))
    found: list[Any] = []
    for batch in (False, True):
        try:
            if batch:
                found.append(decode_protobuf_column(column, offsets, fmt, arrow_type, WHERE))
            else:
                found.append(protobuf_rows(column.to_pylist(), offsets, fmt, arrow_type, WHERE))
        except Exception as exc:
            found.append(f"{type(exc).__name__}: {exc}")
    return found[0], found[1]


@pytest.mark.parametrize("seed", range(3))
def test_the_batch_path_gives_the_value_by_value_column(registry_url: str, seed: int) -> None:
    topic = f"kinds-{seed}"
    column = pa.array(_written(registry_url, topic, seed), pa.binary())
    rows: list[Any] = []
    for version in ("1", "latest"):
        fmt, arrow_type = _reader(registry_url, f"{topic}-value", version)
        expected = protobuf_rows(column.to_pylist(), [0] * len(column), fmt, arrow_type, WHERE)
        found = protobuf_batch_column(column, fmt, arrow_type)
        assert found is not None  # the batch path took every value
        assert found.type == expected.type == arrow_type
        assert found.to_pylist() == expected.to_pylist()
        assert found.slice(10, 50).to_pylist() == expected.slice(10, 50).to_pylist()
        sliced = column.slice(7, 40)
        again = protobuf_batch_column(sliced, fmt, arrow_type)
        assert again is not None
        assert again.to_pylist() == expected.slice(7, 40).to_pylist()
        rows = found.to_pylist()
    assert {r["level"] for r in rows if r} >= {"LOW", "7"}
    assert any(r and r["maybe"] == 0 for r in rows)
    assert any(r and r["total"] == {"cents": 0, "currency": ""} for r in rows)
    assert any(r and r["total"] is None for r in rows)


def test_a_bad_value_fails_naming_its_offset_as_before(registry_url: str) -> None:
    topic = "kinds-bad"
    good = _written(registry_url, topic, 7)[:5]
    fmt, arrow_type = _reader(registry_url, f"{topic}-value", "latest")
    framing = bytes(good[0] or b"")[:7]  # gen.Kinds: message indexes [2]
    k = kinds_class(2)()
    k.u64 = 2**64 - 1
    for bad, problem in (
        (framing + b"\xff\xff\xff", "offset 5: the value is not Protobuf"),
        (framing[:5], "offset 5: the value is not Protobuf"),
        (b"\x00\x00\x01\x86\xa0\x00", "offset 5: the value is not Protobuf"),  # no id 100000
        (b"\x01" + bytes(16) + b"\x00", "offset 5: the value is not Protobuf"),
        (framing + k.SerializeToString(), "OverflowError"),
    ):
        column = pa.array([*good, bad], pa.binary())
        assert protobuf_batch_column(column, fmt, arrow_type) is None
        expected, found = _both(column, fmt, arrow_type)
        assert isinstance(found, str)
        assert found == expected
        assert problem in found
