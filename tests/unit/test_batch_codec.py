"""The batch codec on chosen examples: envelope fields, the frozen byte layout, limits and
their error messages, and malformed payloads (each must fail as InvalidBatch/BatchTooLarge).
The property tests (tests/property/test_batch_codec.py) cover arbitrary batches."""

from __future__ import annotations

import struct

import crc32c
import lz4.frame
import numpy as np
import pytest
import zstandard

from tidemq.core import limits
from tidemq.core.batch import (
    ENVELOPE,
    BatchColumns,
    Codec,
    MessageRecord,
    decode_columns,
    decode_messages,
    encode_batch,
    encode_values,
    parse_envelope,
    tag_bit,
    tag_summary_for,
)
from tidemq.core.errors import BatchTooLarge, InvalidBatch

TS = 1_700_000_000_000

MESSAGES = [
    MessageRecord(b"v0", b"k0", "paid", ("o-1",), (("src", b"web"),), TS + 5),
    MessageRecord(None, None, None, (), (), TS),
    MessageRecord(b"", b"k2", "caf\u00e9", ("a", "\u00fc"), (("x", b""), ("y", b"\0\xff")), TS + 9),
]
# MESSAGES as the codec wrote them before its rewrite for speed: the layout is frozen (the
# store and other clients read it), so the bytes must not change.
GOLDEN = bytes.fromhex(
    "b70100001747d31803000000e500000000000200000000010068e5cf8b0100000968e5cf8b010000"
    "07000000000000000500000000000000090000000000000005000000000000000000000002000000"
    "02000000040000006b306b3200000000050000000000000000000000020000000200000002000000"
    "763000000000000005000000000000000000000004000000040000000900000070616964636166c3"
    "a9000000000000000000000001000000010000000300000000000000030000000400000006000000"
    "6f2d3161c3bc00000000000001000000010000000300000000000000030000000400000005000000"
    "73726378790000000000000003000000030000000500000077656200ff"
)
GOLDEN_VALUES = bytes.fromhex(  # encode_values([b"a", b"bc"], timestamp_ms=42)
    "b701000053325297020000009000000000000000000000002a000000000000002a00000000000000"
    "05000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "00000000010000000300000000000000616263000000000000000000000000000000000000000000"
    "00000000000000000000000000000000000000000000000000000000000000000000000000000000"
    "000000000000000000000000000000000000000000000000"
)


def seal(
    body: bytes,
    *,
    count: int,
    codec: Codec = Codec.NONE,
    stored: bytes | None = None,
    body_size: int | None = None,
    base_ts: int = TS,
    max_ts: int = TS,
    magic: int = 0xB7,
    version: int = 1,
) -> bytes:
    """A payload around `body` (or around `stored`, its compressed form) with a right CRC."""
    stored = body if stored is None else stored
    size = len(body) if body_size is None else body_size
    head = ENVELOPE.pack(magic, version, codec, 0, 0, count, size, 0, base_ts, max_ts)
    crc = crc32c.crc32c(stored, crc32c.crc32c(head[8:], crc32c.crc32c(head[:4])))
    return head[:4] + struct.pack("<I", crc) + head[8:] + stored


def reseal(payload: bytes | bytearray) -> bytes:
    """`payload` with its CRC recomputed, so that a mutation reaches the body checks."""
    crc = crc32c.crc32c(payload[8:], crc32c.crc32c(payload[:4]))
    return bytes(payload[:4]) + struct.pack("<I", crc) + bytes(payload[8:])


def address(buffer: object) -> int:
    """Where a buffer's first byte is in memory (to find a column inside a payload)."""
    return int(np.frombuffer(buffer, dtype=np.uint8).ctypes.data)  # type: ignore[call-overload]


def body_of(payload: bytes) -> bytes:
    return payload[ENVELOPE.size :]


# --------------------------------------------------------------------------- round trip


def test_layout_is_unchanged() -> None:
    assert encode_batch(MESSAGES) == GOLDEN
    assert decode_messages(GOLDEN) == MESSAGES
    assert encode_values([b"a", b"bc"], timestamp_ms=42) == GOLDEN_VALUES


@pytest.mark.parametrize("codec", list(Codec))
def test_round_trip(codec: Codec) -> None:
    payload = encode_batch(MESSAGES, codec=codec)
    got = decode_messages(payload)
    assert got == MESSAGES
    assert all(type(m) is MessageRecord for m in got)
    assert decode_messages(payload, verify_crc=False) == MESSAGES


def test_message_record_defaults_and_fields() -> None:
    m = MessageRecord(b"v")
    assert (m.value, m.key, m.tag, m.keys, m.headers, m.timestamp_ms) == (
        b"v",
        None,
        None,
        (),
        (),
        0,
    )
    assert MessageRecord(value=b"v", tag="t")._replace(tag=None) == m
    assert decode_messages(encode_batch([m])) == [m]


def test_envelope_fields() -> None:
    payload = encode_batch(MESSAGES)
    env = parse_envelope(payload)
    assert env.codec is Codec.NONE
    assert env.count == 3
    assert env.body_size == len(payload) - ENVELOPE.size
    assert env.base_timestamp_ms == TS
    assert env.max_timestamp_ms == TS + 9
    assert env.tag_summary == tag_bit("paid") | tag_bit("caf\u00e9")
    assert env.tag_summary == tag_summary_for([m.tag for m in MESSAGES])
    assert env.crc == struct.unpack_from("<I", payload, 4)[0]
    assert parse_envelope(memoryview(payload)) == env


@pytest.mark.parametrize("codec", [Codec.ZSTD, Codec.LZ4])
def test_envelope_of_compressed_batch(codec: Codec) -> None:
    values = [b"x" * 1000] * 20
    env = parse_envelope(encode_values(values, timestamp_ms=TS, codec=codec))
    plain = parse_envelope(encode_values(values, timestamp_ms=TS))
    assert env.codec is codec
    assert env.body_size == plain.body_size
    assert (env.count, env.tag_summary, env.base_timestamp_ms) == (20, 0, TS)


def test_tag_summary_is_one_bit_per_distinct_tag() -> None:
    assert tag_summary_for([None, None]) == 0
    bit = tag_bit("a")
    assert bit.bit_count() == 1
    assert bit == 1 << (crc32c.crc32c(b"a") % 64)
    assert tag_summary_for(["a", "a", None]) == bit
    assert tag_summary_for([""]) == tag_bit("")  # an empty tag is a tag


def test_columns_view() -> None:
    cols = decode_columns(encode_batch(MESSAGES))
    assert isinstance(cols, BatchColumns)
    assert cols.count == 3
    assert cols.timestamps_ms.tolist() == [TS + 5, TS, TS + 9]
    assert cols.key.validity is not None
    assert cols.key.validity.tolist() == [True, False, True]
    assert cols.value.validity is not None
    assert cols.value.validity.tolist() == [True, False, True]
    assert cols.value.offsets.tolist() == [0, 2, 2, 2]
    assert bytes(cols.value.data) == b"v0"
    assert cols.keys.list_offsets.tolist() == [0, 1, 1, 3]
    assert bytes(cols.keys.items.data) == "o-1a\u00fc".encode()
    assert cols.keys.items.validity is None
    assert cols.headers.list_offsets.tolist() == [0, 1, 1, 3]
    assert cols.headers.values is not None
    assert bytes(cols.headers.values.data) == b"web\0\xff"


def test_columns_without_nulls_have_no_bitmap() -> None:
    cols = decode_columns(encode_values([b"a", b"b"], timestamp_ms=TS, keys=[b"1", b"2"]))
    assert cols.key.validity is None
    assert cols.key.validity_bitmap is None
    assert cols.value.validity is None
    assert cols.tag.validity is not None
    assert not cols.tag.validity.any()  # no tags: an all-null column


def test_encode_values_equals_encode_batch() -> None:
    values = [b"a", b"bb", b""]
    keys = [b"k", None, b"kk"]
    headers = {"h": b"1", "\u00e9": b""}
    got = encode_values(values, timestamp_ms=TS, keys=keys, headers=headers, codec=Codec.ZSTD)
    header = tuple(headers.items())
    records = [MessageRecord(v, k, None, (), header, TS) for v, k in zip(values, keys, strict=True)]
    assert got == encode_batch(records, codec=Codec.ZSTD)


def test_encode_values_accepts_tombstones() -> None:
    payload = encode_values([b"a", None], timestamp_ms=TS)
    assert [m.value for m in decode_messages(payload)] == [b"a", None]


def test_encode_values_checks_keys_length() -> None:
    with pytest.raises(InvalidBatch, match="1 keys given for 2 values"):
        encode_values([b"a", b"b"], timestamp_ms=TS, keys=[b"k"])


def test_decodes_a_memoryview_at_any_alignment() -> None:
    payload = encode_batch(MESSAGES)
    for shift in range(8):
        buffer = bytearray(shift) + payload + b"tail"
        view = memoryview(buffer)[shift : shift + len(payload)]
        assert decode_messages(view) == MESSAGES


def test_decoded_timestamps_span_the_extremes() -> None:
    low = -(1 << 63)
    high = (1 << 63) - 1
    for base in (low, high - (1 << 31) + 1):
        msgs = [
            MessageRecord(b"", timestamp_ms=base),
            MessageRecord(b"", timestamp_ms=base + 2**31 - 1),
        ]
        assert decode_messages(encode_batch(msgs)) == msgs


# --------------------------------------------------------------------------- limits


def test_empty_batch() -> None:
    with pytest.raises(InvalidBatch, match="a batch holds 1 to 65536 messages, got 0"):
        encode_batch([])
    with pytest.raises(InvalidBatch, match="got 0"):
        encode_values([], timestamp_ms=TS)


def test_too_many_messages() -> None:
    msgs = [MessageRecord(b"")] * (limits.MAX_BATCH_MESSAGES + 1)
    with pytest.raises(InvalidBatch, match="got 65537"):
        encode_batch(msgs)
    assert parse_envelope(encode_batch(msgs[1:])).count == limits.MAX_BATCH_MESSAGES


def test_tag_too_long() -> None:
    ok = "t" * limits.MAX_TAG_BYTES
    assert decode_messages(encode_batch([MessageRecord(b"", tag=ok)]))[0].tag == ok
    with pytest.raises(InvalidBatch, match=r"tag 'tttt.* is 256 bytes, over 255"):
        encode_batch([MessageRecord(b"", tag=ok + "t")])
    with pytest.raises(InvalidBatch, match="is 256 bytes, over 255"):  # 128 characters
        encode_batch([MessageRecord(b"", tag="\u00e9" * 128)])


def test_too_many_keys() -> None:
    keys = tuple(str(i) for i in range(limits.MAX_KEYS_PER_MESSAGE + 1))
    with pytest.raises(InvalidBatch, match="message 1 has 65 keys, more than 64"):
        encode_batch([MessageRecord(b""), MessageRecord(b"", keys=keys)])


def test_too_many_headers() -> None:
    headers = tuple((str(i), b"") for i in range(limits.MAX_HEADERS_PER_MESSAGE + 1))
    with pytest.raises(InvalidBatch, match="message 0 has 257 headers, more than 256"):
        encode_batch([MessageRecord(b"", headers=headers)])
    with pytest.raises(InvalidBatch, match="257 headers"):
        encode_values([b""], timestamp_ms=TS, headers=dict(headers))


def test_header_key_too_long() -> None:
    name = "k" * (limits.MAX_HEADER_KEY_BYTES + 1)
    with pytest.raises(InvalidBatch, match=r"header key 'kkk.* is 257 bytes, over 256"):
        encode_batch([MessageRecord(b"", headers=(("ok", b""), (name, b"")))])
    with pytest.raises(InvalidBatch, match="is 258 bytes, over 256"):
        encode_values([b""], timestamp_ms=TS, headers={"\u00e9" * 129: b""})


def test_header_value_too_long() -> None:
    value = b"v" * (limits.MAX_HEADER_VALUE_BYTES + 1)
    with pytest.raises(InvalidBatch, match="header 'big' value is 16385 bytes, over 16384"):
        encode_batch([MessageRecord(b"", headers=(("big", value),))])
    with pytest.raises(InvalidBatch, match="header 'big' value is 16385 bytes"):
        encode_values([b""], timestamp_ms=TS, headers={"big": value})


def test_strings_must_be_utf8() -> None:
    for msg in (
        MessageRecord(b"", tag="\ud800"),
        MessageRecord(b"", keys=("\udfff",)),
        MessageRecord(b"", headers=(("\ud800", b""),)),
    ):
        with pytest.raises(InvalidBatch, match="not encodable as UTF-8"):
            encode_batch([msg])


def test_timestamp_span_and_range() -> None:
    wide = [MessageRecord(b"", timestamp_ms=0), MessageRecord(b"", timestamp_ms=2**31)]
    with pytest.raises(InvalidBatch, match="span 2147483648 ms, more than 2147483647"):
        encode_batch(wide)
    with pytest.raises(InvalidBatch, match="do not fit in 64 bits"):
        encode_batch([MessageRecord(b"", timestamp_ms=2**63)])
    with pytest.raises(InvalidBatch, match="do not fit in 64 bits"):
        encode_values([b""], timestamp_ms=-(2**63) - 1)


def test_max_batch_bytes() -> None:
    values = [b"x" * 100] * 10
    size = len(encode_values(values, timestamp_ms=TS))
    assert len(encode_batch([MessageRecord(v) for v in values], max_batch_bytes=size)) == size
    with pytest.raises(
        BatchTooLarge, match=f"batch of {size} bytes exceeds the limit of {size - 1}"
    ):
        encode_batch([MessageRecord(v) for v in values], max_batch_bytes=size - 1)


def test_body_over_the_format_limit_even_when_compressed(monkeypatch: pytest.MonkeyPatch) -> None:
    # A body the decoder would refuse must not be written, however well it compresses.
    monkeypatch.setattr(limits, "MAX_BATCH_BYTES", 4096)
    half = b"\0" * 1200  # each column fits, the body does not
    with pytest.raises(BatchTooLarge, match=r"body of \d+ bytes exceeds the format limit of 4096"):
        encode_batch([MessageRecord(half, half)] * 2, codec=Codec.ZSTD, max_batch_bytes=1 << 20)
    with pytest.raises(BatchTooLarge, match="exceeds the format limit of 4096"):
        encode_values([half] * 2, keys=[half] * 2, timestamp_ms=TS, codec=Codec.ZSTD)
    with pytest.raises(BatchTooLarge, match="value data of 6000 bytes exceeds"):
        encode_values([b"\0" * 3000] * 2, timestamp_ms=TS, codec=Codec.ZSTD)


# --------------------------------------------------------------------------- malformed


def rejected(payload: bytes, *, verify_crc: bool = True) -> str:
    with pytest.raises((InvalidBatch, BatchTooLarge)) as info:
        decode_messages(payload, verify_crc=verify_crc)
    return str(info.value)


def test_envelope_checks() -> None:
    good = encode_batch(MESSAGES)
    assert "shorter than its envelope" in rejected(good[:39])
    assert "magic/version" in rejected(seal(body_of(good), count=3, magic=0xB8))
    assert "magic/version" in rejected(seal(body_of(good), count=3, version=3))
    # Version 2 (compacted) needs its offset-delta section.
    env = parse_envelope(good)
    v2 = seal(
        body_of(good),
        count=3,
        version=2,
        base_ts=env.base_timestamp_ms,
        max_ts=env.max_timestamp_ms,
    )
    assert "truncated in offset deltas" in rejected(v2)
    assert "unknown batch codec 3" in rejected(seal(body_of(good), count=3, codec=3))  # type: ignore[arg-type]
    assert "count 0 outside" in rejected(seal(body_of(good), count=0))
    assert "count 65537 outside" in rejected(seal(body_of(good), count=65537))
    assert "inverted or too wide" in rejected(seal(body_of(good), count=3, max_ts=TS - 1))
    assert "inverted or too wide" in rejected(seal(body_of(good), count=3, max_ts=TS + 2**31))
    with pytest.raises(BatchTooLarge, match="exceeds the format limit"):
        decode_messages(seal(b"", count=1, body_size=limits.MAX_BATCH_BYTES + 1))
    assert "CRC mismatch" in rejected(good[:-1] + bytes([good[-1] ^ 1]))


def test_every_single_bit_flip_is_detected() -> None:
    good = encode_batch(MESSAGES)
    for i in range(len(good)):
        for bit in range(8):
            bad = bytearray(good)
            bad[i] ^= 1 << bit
            with pytest.raises((InvalidBatch, BatchTooLarge)):
                parse_envelope(bytes(bad))


def test_truncated_or_extended_body() -> None:
    good = encode_batch(MESSAGES)
    assert "envelope says" in rejected(reseal(good[:-1]))
    body = body_of(good)
    assert "truncated" in rejected(seal(body[:-8], count=3, max_ts=TS + 9))
    assert "unexpected bytes after" in rejected(seal(body + bytes(8), count=3, max_ts=TS + 9))
    rejected(seal(body, count=4, max_ts=TS + 9))  # every section shifted


def test_offsets_must_be_monotone_from_zero() -> None:
    cols = decode_columns(GOLDEN)
    start = address(cols.value.offsets) - address(GOLDEN)
    for offsets in ([1, 2, 2, 2], [0, 2, 1, 2], [0, 3, 2, 2]):
        bad = bytearray(GOLDEN)
        bad[start : start + 16] = struct.pack("<4I", *offsets)
        assert "not monotone from zero" in rejected(reseal(bad))
        assert "not monotone from zero" in rejected(bytes(bad), verify_crc=False)


def test_zero_ending_offsets_must_be_all_zero() -> None:
    good = encode_values([b""] * 3, timestamp_ms=TS)
    start = address(decode_columns(good).value.offsets) - address(good)
    bad = bytearray(good)
    bad[start + 4] = 1  # offsets 0, 1, 0, 0: they end at zero but are not monotone
    assert "not monotone from zero" in rejected(reseal(bad))


def test_padding_and_spare_bitmap_bits_are_ignored() -> None:
    # Decoding recognises an all-null column by its zero bytes; other encoders may leave
    # junk in padding or in the bitmap bits past the last message, which mean nothing.
    good = encode_values([b"a", b"b", b"c"], timestamp_ms=TS)  # key column: 3 nulls
    key_bitmap = ENVELOPE.size + 24  # after the flags (8) and 3 deltas (12), aligned
    bitmap = decode_columns(good).key.validity_bitmap
    assert bitmap is not None
    assert bitmap.tobytes() == b"\0"
    for at, junk in ((key_bitmap, 0b1111_1000), (key_bitmap + 1, 0xFF), (key_bitmap + 7, 1)):
        bad = bytearray(good)
        bad[at] = junk
        assert decode_messages(reseal(bad)) == decode_messages(good)


def test_timestamp_deltas_must_lie_in_the_envelope_range() -> None:
    body = bytearray(body_of(encode_batch(MESSAGES)))
    assert decode_messages(seal(bytes(body), count=3, max_ts=TS + 9)) == MESSAGES
    body[8:12] = struct.pack("<i", -1)  # message 0 before base_ts
    assert "outside the envelope's range" in rejected(seal(bytes(body), count=3, max_ts=TS + 9))
    body[8:12] = struct.pack("<i", 10)  # message 0 after max_ts
    assert "outside the envelope's range" in rejected(seal(bytes(body), count=3, max_ts=TS + 9))
    one = body_of(encode_values([b"", b""], timestamp_ms=TS))
    assert "outside the envelope's range" in rejected(seal(one[:8] + b"\1" + one[9:], count=2))


def test_invalid_utf8_in_a_string_column() -> None:
    payload = encode_batch([MessageRecord(b"", tag="\u00e9")])
    bad = payload.replace("\u00e9".encode(), b"\xc3\x28")
    assert decode_columns(reseal(bad)).count == 1  # structure is fine: bytes are not checked
    assert "invalid UTF-8" in rejected(reseal(bad))


def test_null_entries_may_hold_bytes() -> None:
    # Arrow lets a null slot keep bytes; they are ignored, even when they are not UTF-8.
    good = encode_batch([MessageRecord(b"", tag=None), MessageRecord(b"", tag="ab")])
    cols = decode_columns(good)
    offsets_at = address(cols.tag.offsets) - address(good)
    data_at = address(cols.tag.data) - address(good)
    bad = bytearray(good)
    bad[offsets_at : offsets_at + 12] = struct.pack("<3I", 0, 1, 2)
    bad[data_at : data_at + 2] = b"\xffb"  # null slot: b"\xff"; message 1: "b"
    assert [m.tag for m in decode_messages(reseal(bad))] == [None, "b"]


# --------------------------------------------------------------------------- compression


def test_zstd_frame_claiming_more_than_body_size() -> None:
    body = body_of(encode_values([b"x" * 100] * 4, timestamp_ms=TS))
    frame = bytearray(zstandard.ZstdCompressor().compress(body * 100))
    # The forged claim is rejected before any allocation; so is a true but larger size.
    assert "zstd frame claims" in rejected(
        seal(body, count=4, codec=Codec.ZSTD, stored=bytes(frame))
    )


def test_bytes_after_the_zstd_frame() -> None:
    body = body_of(encode_values([b"x" * 100] * 4, timestamp_ms=TS))
    frame = zstandard.ZstdCompressor().compress(body)
    assert len(decode_messages(seal(body, count=4, codec=Codec.ZSTD, stored=frame))) == 4
    assert "cannot decompress ZSTD body" in rejected(
        seal(body, count=4, codec=Codec.ZSTD, stored=frame + b"junk")
    )


def test_zstd_frame_without_content_size_is_bounded() -> None:
    body = body_of(encode_values([b"x" * 100] * 4, timestamp_ms=TS))
    frame = zstandard.ZstdCompressor(write_content_size=False).compress(body + bytes(1 << 20))
    message = rejected(seal(body, count=4, codec=Codec.ZSTD, stored=frame))
    assert "cannot decompress ZSTD body" in message
    exact = zstandard.ZstdCompressor(write_content_size=False).compress(body)
    assert len(decode_messages(seal(body, count=4, codec=Codec.ZSTD, stored=exact))) == 4


def test_lz4_frame_is_bounded() -> None:
    body = body_of(encode_values([b"x" * 100] * 4, timestamp_ms=TS))
    bomb = lz4.frame.compress(body + bytes(1 << 20))
    assert "LZ4 body is truncated or inflates past" in rejected(
        seal(body, count=4, codec=Codec.LZ4, stored=bomb)
    )
    good = lz4.frame.compress(body)
    assert "unexpected bytes after the LZ4 frame" in rejected(
        seal(body, count=4, codec=Codec.LZ4, stored=good + b"junk")
    )
    assert "cannot decompress LZ4 body" in rejected(
        seal(body, count=4, codec=Codec.LZ4, stored=b"junk" * 8)
    )


def test_compressed_body_size_must_match() -> None:
    body = body_of(encode_values([b"x" * 100] * 4, timestamp_ms=TS))
    for codec, frame in (
        (Codec.ZSTD, zstandard.ZstdCompressor().compress(body)),
        (Codec.LZ4, lz4.frame.compress(body)),
    ):
        payload = seal(body, count=4, codec=codec, stored=frame, body_size=len(body) + 8)
        assert "inflates to" in rejected(payload)


def test_version_2_batches_carry_offsets_that_may_skip() -> None:
    from tidemq.core.batch import first_index_at, message_offsets  # noqa: PLC0415

    payload = encode_batch(MESSAGES, offset_deltas=[0, 5, 9])
    assert parse_envelope(payload).sparse
    assert not parse_envelope(encode_batch(MESSAGES)).sparse
    assert decode_messages(payload) == list(MESSAGES)
    cols = decode_columns(payload)
    assert message_offsets(cols, 100).tolist() == [100, 105, 109]
    assert [first_index_at(cols, 100, o) for o in (0, 100, 101, 105, 106, 109, 110)] == [
        0,
        0,
        1,
        1,
        2,
        2,
        3,
    ]
    dense = decode_columns(encode_batch(MESSAGES))
    assert message_offsets(dense, 7).tolist() == [7, 8, 9]
    assert [first_index_at(dense, 7, o) for o in (0, 8, 10, 99)] == [0, 1, 3, 3]
    for bad in ([0, 5, 5], [1, 2, 3], [0, 2]):
        with pytest.raises(InvalidBatch, match="offset deltas"):
            encode_batch(MESSAGES, offset_deltas=bad)


def test_version_2_offset_deltas_are_checked_on_decode() -> None:
    good = encode_batch(MESSAGES, offset_deltas=[0, 1, 2])
    body = bytearray(body_of(good))
    body[-12:] = (0).to_bytes(4, "little") + (3).to_bytes(4, "little") + (3).to_bytes(4, "little")
    env = parse_envelope(good)
    sealed = seal(
        bytes(body),
        count=3,
        version=2,
        base_ts=env.base_timestamp_ms,
        max_ts=env.max_timestamp_ms,
    )
    assert "strictly increase" in rejected(sealed)
