"""Batch payloads as Arrow: the RecordBatch holds exactly what decode_messages gives, and
what Arrow accepts from a corrupt payload either is refused or validates fully."""

from __future__ import annotations

import struct
from datetime import timedelta
from typing import Any

import crc32c
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.core import names
from tidemq.core.arrow import SCHEMA, batch_to_arrow, batches_to_arrow
from tidemq.core.batch import (
    ENVELOPE,
    Codec,
    MessageRecord,
    decode_messages,
    encode_batch,
    encode_values,
)
from tidemq.core.errors import BatchTooLarge, InvalidBatch

TS = 1_700_000_000_000
PROFILE = settings(
    deadline=timedelta(seconds=2),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

texts = st.text(max_size=10)
#: Tags a subscription can match (the encoder refuses others): no "|", blanks or controls.
tag_texts = st.text(
    st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp")).filter(
        lambda c: names.tag_problem(c) is None
    ),
    max_size=10,
)
blobs = st.binary(max_size=40)


@st.composite
def batches(draw: st.DrawFn, max_size: int = 20) -> list[MessageRecord]:
    """Messages with nulls, empty and non-ASCII strings, keys and headers; timestamps in
    the range Arrow's microseconds can hold."""
    n = draw(st.integers(1, max_size))
    optional = [st.none(), blobs, st.none() | blobs]
    keys, values = draw(st.sampled_from(optional)), draw(st.sampled_from(optional))
    tags = draw(st.sampled_from([st.none(), tag_texts, st.none() | tag_texts]))
    key_lists = draw(st.sampled_from([st.just(()), st.lists(texts, max_size=3).map(tuple)]))
    pair = st.tuples(texts, blobs)
    header_lists = draw(st.sampled_from([st.just(()), st.lists(pair, max_size=3).map(tuple)]))
    base = draw(st.integers(-(2**40), 2**40))
    stamps = st.integers(base, base + draw(st.integers(0, 2**31 - 1)))
    return [
        MessageRecord(
            draw(values), draw(keys), draw(tags), draw(key_lists), draw(header_lists), draw(stamps)
        )
        for _ in range(n)
    ]


def rows(batch: Any) -> list[MessageRecord]:
    """A RecordBatch of SCHEMA back as MessageRecords (timestamps in ms)."""
    micros = batch.column("timestamp").cast(pa.int64()).to_pylist()
    out = []
    for row, us in zip(batch.to_pylist(), micros, strict=True):
        assert us % 1000 == 0
        out.append(
            MessageRecord(
                row["value"],
                row["key"],
                row["tag"],
                tuple(row["keys"]),
                tuple((h["key"], h["value"]) for h in row["headers"]),
                us // 1000,
            )
        )
    return out


@PROFILE
@given(batches(), st.sampled_from(Codec))
def test_arrow_equals_decode_messages(messages: list[MessageRecord], codec: Codec) -> None:
    payload = encode_batch(messages, codec=codec)
    batch = batch_to_arrow(payload)
    batch.validate(full=True)
    assert batch.schema == SCHEMA
    assert batch.num_rows == len(messages)
    assert rows(batch) == decode_messages(payload) == messages
    assert batch.column("key").null_count == sum(m.key is None for m in messages)
    assert batch.column("value").null_count == sum(m.value is None for m in messages)
    assert batch.column("tag").null_count == sum(m.tag is None for m in messages)


@PROFILE
@given(st.lists(batches(max_size=6), max_size=4))
def test_batches_concatenate_in_order(groups: list[list[MessageRecord]]) -> None:
    batch = batches_to_arrow(encode_batch(g) for g in groups)
    batch.validate(full=True)
    assert batch.schema == SCHEMA
    assert rows(batch) == [m for g in groups for m in g]


def test_schema_is_sparks() -> None:
    assert SCHEMA.names == ["key", "value", "tag", "keys", "headers", "timestamp"]
    assert SCHEMA.field("timestamp").type == pa.timestamp("us", tz="UTC")
    assert SCHEMA.field("keys").type == pa.list_(pa.string())
    headers = SCHEMA.field("headers").type
    assert headers.value_type == pa.struct([("key", pa.string()), ("value", pa.binary())])


def test_no_payloads_give_an_empty_batch() -> None:
    batch = batches_to_arrow([])
    assert batch.num_rows == 0
    assert batch.schema == SCHEMA


def test_values_share_the_payload() -> None:
    payload = encode_values([b"abc", b"de"], timestamp_ms=TS)
    batch = batch_to_arrow(payload)
    data = batch.column("value").buffers()[2]
    assert bytes(data) == b"abcde"
    assert payload.find(b"abcde") == data.address - pa.py_buffer(payload).address


@pytest.mark.parametrize("shift", range(8))
def test_payload_at_any_alignment(shift: int) -> None:
    messages = [
        MessageRecord(b"v", b"k", "t", ("a",), (("h", b"x"),), TS),
        MessageRecord(None, None, None, (), (), TS + 1),
    ]
    payload = encode_batch(messages)
    buffer = bytearray(shift) + payload
    batch = batch_to_arrow(memoryview(buffer)[shift:])
    batch.validate(full=True)
    assert rows(batch) == messages


def test_timestamp_beyond_microseconds() -> None:
    payload = encode_batch([MessageRecord(b"", timestamp_ms=2**62)])
    assert decode_messages(payload)[0].timestamp_ms == 2**62
    with pytest.raises(InvalidBatch, match="out of range for microseconds"):
        batch_to_arrow(payload)


def reseal(payload: bytes | bytearray) -> bytes:
    crc = crc32c.crc32c(payload[8:], crc32c.crc32c(payload[:4]))
    return bytes(payload[:4]) + struct.pack("<I", crc) + bytes(payload[8:])


def test_invalid_utf8_is_refused() -> None:
    for message in (
        MessageRecord(b"", tag="\u00e9"),
        MessageRecord(b"", keys=("\u00e9",)),
        MessageRecord(b"", headers=(("\u00e9", b""),)),
    ):
        bad = reseal(encode_batch([message]).replace(b"\xc3\xa9", b"\xc3\x28"))
        with pytest.raises(InvalidBatch, match="invalid UTF-8"):
            batch_to_arrow(bad)


@PROFILE
@given(
    batches(max_size=6),
    st.lists(st.tuples(st.integers(0, 1 << 16), st.binary(min_size=1, max_size=4)), max_size=4),
)
def test_corrupt_bodies_never_reach_arrow_invalid(
    messages: list[MessageRecord], edits: list[tuple[int, bytes]]
) -> None:
    # Body bytes overwritten, CRC fixed up: whatever batch_to_arrow accepts is valid Arrow
    # (no offset can send a reader out of its buffer).
    body = bytearray(encode_batch(messages)[ENVELOPE.size :])
    for where, data in edits:
        at = where % len(body)
        body[at : at + len(data)] = data[: len(body) - at]
    payload = reseal(encode_batch(messages)[: ENVELOPE.size] + bytes(body))
    try:
        batch = batch_to_arrow(payload)
    except (InvalidBatch, BatchTooLarge):
        return
    batch.validate(full=True)
    assert batch.num_rows == len(messages)
