"""Properties of the batch codec on arbitrary input.

* encode -> decode_messages gives back exactly the messages, for every codec;
* the envelope describes the batch (count, timestamp range, tag summary);
* encode_values is encode_batch of the equivalent records, byte for byte;
* decoding any bytes, random or a mutated batch (with its CRC fixed up so the body checks
  are reached), returns or raises InvalidBatch/BatchTooLarge: nothing else, no hang;
* any change to one byte of a batch is detected.
"""

from __future__ import annotations

import struct
from datetime import timedelta

import crc32c
import numpy as np
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from tidemq.core import names
from tidemq.core.batch import (
    ENVELOPE,
    Codec,
    MessageRecord,
    decode_columns,
    decode_messages,
    encode_batch,
    encode_columns,
    encode_values,
    parse_envelope,
    tag_summary_for,
)
from tidemq.core.errors import BatchTooLarge, InvalidBatch

I64_MIN, I64_MAX = -(1 << 63), (1 << 63) - 1
MAX_SPAN = (1 << 31) - 1
REJECTED = (InvalidBatch, BatchTooLarge)

# A generous deadline: a hang still fails, a slow shared machine does not.
settings.register_profile(
    "batch-codec",
    deadline=timedelta(seconds=2),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
PROFILE = settings.get_profile("batch-codec")

texts = st.text(max_size=12)  # any code point but surrogates: ASCII and beyond
#: Tags a subscription can match (the encoder refuses others): no "|", blanks or controls.
tag_texts = st.text(
    st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zs", "Zl", "Zp")).filter(
        lambda c: names.tag_problem(c) is None
    ),
    max_size=10,
)
blobs = st.binary(max_size=48)
codecs = st.sampled_from(Codec)


@st.composite
def batches(draw: st.DrawFn, max_size: int = 24) -> list[MessageRecord]:
    """Arbitrary messages, with each column drawn from its own mix (all null, none null,
    mixed), so that the codec's all-null and all-empty shortcuts are reached too."""
    n = draw(st.integers(1, max_size))
    optional = [st.none(), blobs, st.none() | blobs]
    keys = draw(st.sampled_from(optional))
    values = draw(st.sampled_from(optional))
    tags = draw(
        st.sampled_from([st.none(), tag_texts, st.none() | st.sampled_from(["a", "\u00e9t\u00e9"])])
    )
    key_lists = draw(st.sampled_from([st.just(()), st.lists(texts, max_size=3).map(tuple)]))
    pair = st.tuples(texts, blobs)
    header_lists = draw(st.sampled_from([st.just(()), st.lists(pair, max_size=3).map(tuple)]))
    span = draw(st.sampled_from([0, 1, MAX_SPAN]) | st.integers(0, MAX_SPAN))
    base = draw(st.integers(I64_MIN, I64_MAX - span) | st.just(1_700_000_000_000))
    stamps = st.integers(base, base + span)
    return [
        MessageRecord(
            draw(values), draw(keys), draw(tags), draw(key_lists), draw(header_lists), draw(stamps)
        )
        for _ in range(n)
    ]


def decode_or_reject(payload: bytes, *, verify_crc: bool = True) -> list[MessageRecord] | None:
    """The messages, or None when the payload is refused with one of the codec's errors.
    Anything else raised fails the test."""
    try:
        messages = decode_messages(payload, verify_crc=verify_crc)
    except REJECTED:
        return None
    assert all(type(m) is MessageRecord for m in messages)
    return messages


def reseal(payload: bytes | bytearray) -> bytes:
    crc = crc32c.crc32c(payload[8:], crc32c.crc32c(payload[:4]))
    return bytes(payload[:4]) + struct.pack("<I", crc) + bytes(payload[8:])


@PROFILE
@given(batches(), codecs)
def test_round_trip_is_exact(messages: list[MessageRecord], codec: Codec) -> None:
    payload = encode_batch(messages, codec=codec)
    assert decode_messages(payload) == messages
    assert decode_messages(memoryview(payload), verify_crc=False) == messages


@PROFILE
@given(batches(max_size=1), codecs)
def test_one_message_shortcut_gives_the_column_encoding(
    messages: list[MessageRecord], codec: Codec
) -> None:
    """`encode_batch` of one message (laid out directly when it has a bytes value and no
    tag, keys or headers) is byte for byte the column encoder's batch, and fails alike."""
    try:
        expected: bytes | type[Exception] = encode_columns(messages, codec, 1 << 20, None)
    except REJECTED as exc:
        expected = type(exc)
    try:
        got: bytes | type[Exception] = encode_batch(messages, codec=codec, max_batch_bytes=1 << 20)
    except REJECTED as exc:
        got = type(exc)
    assert got == expected


@PROFILE
@given(st.binary(max_size=300), st.none() | st.binary(max_size=40), st.integers(I64_MIN, I64_MAX))
def test_one_plain_message_shortcut(value: bytes, key: bytes | None, timestamp_ms: int) -> None:
    record = MessageRecord(value, key, timestamp_ms=timestamp_ms)
    for limit in (1 << 20, 80):  # 80: some are over the limit, both ways alike
        try:
            expected: bytes | type[Exception] = encode_columns([record], Codec.NONE, limit, None)
        except REJECTED as exc:
            expected = type(exc)
        try:
            got: bytes | type[Exception] = encode_batch([record], max_batch_bytes=limit)
        except REJECTED as exc:
            got = type(exc)
        assert got == expected
        if isinstance(got, bytes):
            assert decode_messages(got) == [record]


@PROFILE
@given(batches(), codecs)
def test_envelope_describes_the_batch(messages: list[MessageRecord], codec: Codec) -> None:
    payload = encode_batch(messages, codec=codec)
    env = parse_envelope(payload)
    stamps = [m.timestamp_ms for m in messages]
    assert env.codec is codec
    assert env.count == len(messages)
    assert env.base_timestamp_ms == min(stamps)
    assert env.max_timestamp_ms == max(stamps)
    assert env.tag_summary == tag_summary_for(m.tag for m in messages)
    if codec is Codec.NONE:
        assert env.body_size == len(payload) - ENVELOPE.size
    cols = decode_columns(payload)
    assert cols.count == len(messages)
    assert cols.timestamps_ms.tolist() == stamps


@PROFILE
@given(
    st.lists(st.none() | blobs, min_size=1, max_size=24),
    st.none() | st.lists(st.none() | blobs, min_size=24, max_size=24),
    st.none() | st.lists(st.none() | st.sampled_from(["a", "\u00e9t\u00e9", ""]), min_size=24),
    st.none() | st.dictionaries(texts, blobs, max_size=3),
    st.integers(I64_MIN, I64_MAX),
    codecs,
)
def test_encode_values_is_encode_batch(  # noqa: PLR0917 - one argument per strategy
    values: list[bytes | None],
    keys: list[bytes | None] | None,
    tags: list[str | None] | None,
    headers: dict[str, bytes] | None,
    timestamp_ms: int,
    codec: Codec,
) -> None:
    keys = None if keys is None else keys[: len(values)]
    tags = None if tags is None else tags[: len(values)]
    payload = encode_values(
        values, timestamp_ms=timestamp_ms, keys=keys, tags=tags, headers=headers, codec=codec
    )
    header = tuple(headers.items()) if headers else ()
    records = [
        MessageRecord(
            v,
            None if keys is None else keys[i],
            None if tags is None else tags[i],
            (),
            header,
            timestamp_ms,
        )
        for i, v in enumerate(values)
    ]
    assert payload == encode_batch(records, codec=codec)


@PROFILE
@given(st.binary(max_size=512), st.booleans())
def test_random_bytes_are_rejected(data: bytes, verify_crc: bool) -> None:
    decode_or_reject(data, verify_crc=verify_crc)


@PROFILE
@given(
    st.sampled_from(Codec),
    st.integers(1, 40),
    st.binary(max_size=600),
    st.integers(-(2**40), 2**40),
    st.integers(0, 100),
)
def test_random_body_behind_a_valid_envelope(
    codec: Codec, count: int, body: bytes, base_ts: int, span: int
) -> None:
    # Reaches the body checks with random bodies: the envelope and CRC are right.
    head = ENVELOPE.pack(0xB7, 1, codec, 0, 0, count, len(body), 0, base_ts, base_ts + span)
    decode_or_reject(reseal(head + body))
    decode_or_reject(head + body, verify_crc=False)


mutations = st.lists(
    st.tuples(
        st.sampled_from(["set", "insert", "delete"]),
        st.integers(0, 1 << 16),
        st.binary(min_size=1, max_size=4),
    ),
    min_size=1,
    max_size=4,
)


def mutate_body(payload: bytes, edits: list[tuple[str, int, bytes]], *, fix_size: bool) -> bytes:
    """`payload` with bytes after the envelope set, inserted or deleted; body_size set to
    the new size if `fix_size` (a compressed body keeps its size: its frame changed)."""
    body = bytearray(payload[ENVELOPE.size :])
    for kind, where, data in edits:
        at = where % (len(body) + 1)
        if kind == "set":
            body[at : at + len(data)] = data[: len(body) - at]
        elif kind == "insert":
            body[at:at] = data
        else:
            del body[at : at + len(data)]
    size = struct.pack("<I", len(body)) if fix_size else payload[12:16]
    return payload[:12] + size + payload[16 : ENVELOPE.size] + body


def assert_well_formed(payload: bytes) -> None:
    """What decode_columns promises of any payload it accepts."""
    cols = decode_columns(payload)
    for col in (cols.key, cols.value, cols.tag, cols.keys.items, cols.headers.items):
        offsets = col.offsets.astype(np.int64)
        assert offsets[0] == 0
        assert (np.diff(offsets) >= 0).all()
        assert offsets[-1] == len(col.data)
    assert cols.headers.values is not None
    assert len(cols.headers.values.offsets) == len(cols.headers.items.offsets)
    for lists, items in (
        (cols.keys.list_offsets, cols.keys.items),
        (cols.headers.list_offsets, cols.headers.items),
    ):
        assert lists[0] == 0
        assert (np.diff(lists.astype(np.int64)) >= 0).all()
        assert lists[-1] == len(items.offsets) - 1
    env = parse_envelope(payload)
    assert env.base_timestamp_ms <= cols.timestamps_ms.min()
    assert cols.timestamps_ms.max() <= env.max_timestamp_ms


@PROFILE
@given(batches(max_size=8), mutations, codecs)
def test_mutated_bodies_are_rejected_or_decoded(
    messages: list[MessageRecord], edits: list[tuple[str, int, bytes]], codec: Codec
) -> None:
    payload = encode_batch(messages, codec=codec)
    bad = mutate_body(payload, edits, fix_size=codec is Codec.NONE)
    if bad != payload:
        assert decode_or_reject(bad) is None  # the CRC catches it
    # With the CRC fixed up, the structure checks alone must hold: they refuse the
    # payload, or what they accept is well formed.
    resealed = reseal(bad)
    if decode_or_reject(resealed) is not None:
        assert_well_formed(resealed)


@PROFILE
@given(
    batches(max_size=8),
    st.tuples(
        st.integers(0, 3),
        st.integers(0, 255),
        st.integers(0, 70_000),
        st.integers(0, 1 << 27),
        st.integers(I64_MIN, I64_MAX),
        st.integers(I64_MIN, I64_MAX),
    ),
    st.lists(st.booleans(), min_size=6, max_size=6),
)
def test_forged_envelopes_are_rejected_or_decoded(
    messages: list[MessageRecord],
    fields: tuple[int, int, int, int, int, int],
    forge: list[bool],
) -> None:
    payload = encode_batch(messages)
    env = parse_envelope(payload)
    real = (env.codec, 0, env.count, env.body_size, env.base_timestamp_ms, env.max_timestamp_ms)
    codec, flags, count, body_size, base_ts, max_ts = (
        f if use else r for f, r, use in zip(fields, real, forge, strict=True)
    )
    head = ENVELOPE.pack(0xB7, 1, codec, flags, 0, count, body_size, 0, base_ts, max_ts)
    forged = reseal(head + payload[ENVELOPE.size :])
    if decode_or_reject(forged) is not None:
        assert_well_formed(forged)


@PROFILE
@given(batches(max_size=8), codecs, st.data())
def test_any_changed_byte_is_detected(
    messages: list[MessageRecord], codec: Codec, data: st.DataObject
) -> None:
    payload = encode_batch(messages, codec=codec)
    i = data.draw(st.integers(0, len(payload) - 1), label="index")
    mask = data.draw(st.integers(1, 255), label="xor")
    bad = bytearray(payload)
    bad[i] ^= mask
    assert decode_or_reject(bytes(bad)) is None


@PROFILE
@given(batches(max_size=8), st.integers(0, 1 << 16))
def test_truncated_batches_are_rejected(messages: list[MessageRecord], cut: int) -> None:
    payload = encode_batch(messages)
    cut %= len(payload)
    assume(cut)
    assert decode_or_reject(payload[:cut]) is None
    assert decode_or_reject(payload[:cut], verify_crc=False) is None
