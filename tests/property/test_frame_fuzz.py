"""Fuzzing the protocol's input points: whatever bytes a peer sends, `FrameDecoder.feed`
raises nothing but RemoteProtocolError, and `decode_request` nothing but
RemoteProtocolError; whatever frames are sent, however the bytes are split, they come
back equal. (`benchmarks/fuzz_frames.py` runs the same idea for a million inputs.)"""

from __future__ import annotations

import dataclasses
import itertools
from datetime import timedelta
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.protocol.codec import decode_request, encode_request
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.commands import (
    CommitOffsetsRequest,
    CreateTopicRequest,
    FetchRequest,
    JoinGroupRequest,
    ProduceRequest,
    QueueOffset,
    RegisterBrokerRequest,
)
from tidemq.protocol.frame import (
    MAX_HEADER_BYTES,
    PREFIX,
    Frame,
    FrameDecoder,
    FrameFlags,
    FrameKind,
    RemoteProtocolError,
    encode_frame,
)

FUZZ = settings(
    max_examples=300,
    # A generous deadline: a hang still fails, a slow shared machine does not.
    deadline=timedelta(seconds=2),
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
LIMIT = 64 << 10
#: Round trips carry long headers (over 64 KiB) too.
ROUND_TRIP_LIMIT = 1 << 20
MAGIC, VERSION = 0x54, 1

u16 = st.integers(0, 0xFFFF)
u32 = st.integers(0, 0xFFFFFFFF)
kinds = st.sampled_from(list(FrameKind))
codes = st.one_of(st.sampled_from([int(c) for c in RequestCode]), u16)


@st.composite
def frames(draw: st.DrawFn) -> Frame:
    """A frame as the decoder gives it back: LONG_HEADER set exactly when the header does
    not fit the u16 size (the encoder decides that flag)."""
    header = draw(
        st.one_of(
            st.binary(max_size=300),
            st.integers(MAX_HEADER_BYTES - 2, MAX_HEADER_BYTES + 3).map(lambda n: b"h" * n),
        )
    )
    flags = draw(st.integers(0, 255)) & ~FrameFlags.LONG_HEADER
    if len(header) > MAX_HEADER_BYTES:
        flags |= FrameFlags.LONG_HEADER
    return Frame(draw(kinds), flags, draw(u16), draw(u32), header, draw(st.binary(max_size=2000)))


def _wire(frame: Frame) -> bytes:
    buffers = encode_frame(
        frame.kind, frame.code, frame.correlation_id, frame.header, frame.body, flags=frame.flags
    )
    return b"".join(bytes(b) for b in buffers)


def _chunks(data: bytes, cuts: list[int]) -> list[bytes]:
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]


def _feed_all(decoder: FrameDecoder, parts: list[bytes]) -> list[Frame]:
    """Feed every part; the only exception allowed out is RemoteProtocolError, and after
    it the connection is over (the rest is not fed)."""
    out: list[Frame] = []
    for part in parts:
        try:
            out += decoder.feed(part)
        except RemoteProtocolError:
            break
    return out


def _decode_quietly(frame: Frame) -> None:
    try:
        code, header = decode_request(frame)
    except RemoteProtocolError:
        return
    assert isinstance(code, RequestCode)
    assert isinstance(header, msgspec.Struct)


# ------------------------------------------------------------------ round trips


@FUZZ
@given(st.lists(frames(), min_size=1, max_size=6), st.lists(st.integers(0, 1 << 20), max_size=8))
def test_frames_round_trip_through_any_split(sent: list[Frame], cuts: list[int]) -> None:
    stream = b"".join(_wire(f) for f in sent)
    decoder = FrameDecoder(ROUND_TRIP_LIMIT)
    got = [f for part in _chunks(stream, cuts) for f in decoder.feed(part)]
    assert got == sent
    assert decoder.buffered_bytes == 0


@FUZZ
@given(st.lists(frames(), min_size=1, max_size=3), st.integers(0, 1 << 20))
def test_truncated_stream_yields_the_whole_frames_only(sent: list[Frame], cut: int) -> None:
    stream = b"".join(_wire(f) for f in sent)
    cut %= len(stream) + 1
    decoder = FrameDecoder(ROUND_TRIP_LIMIT)
    got = decoder.feed(stream[:cut])
    assert got == sent[: len(got)]
    assert sum(len(_wire(f)) for f in got) + decoder.buffered_bytes == cut


def _read_buffered(decoder: FrameDecoder, stream: bytes, reads: list[int]) -> list[Frame]:
    """Deliver `stream` as a BufferedProtocol would, each read at most `reads[i]` bytes
    (cycling) and at most what get_buffer() offers; stop at a RemoteProtocolError."""
    out: list[Frame] = []
    pos = i = 0
    while pos < len(stream):
        buf = decoder.get_buffer()
        n = min(len(buf), reads[i % len(reads)], len(stream) - pos)
        buf[:n] = stream[pos : pos + n]
        pos += n
        i += 1
        try:
            out += decoder.buffer_updated(n)
        except RemoteProtocolError:
            break
    return out


large_bodies = st.integers(60_000, 300_000).map(lambda n: bytes([n % 251]) * n)


# Fewer examples: each moves up to a megabyte through the decoder (300 took 12 s).
@settings(FUZZ, max_examples=100)
@given(
    st.lists(st.tuples(frames(), st.one_of(st.none(), large_bodies)), min_size=1, max_size=4),
    st.lists(st.integers(1, 1 << 18), min_size=1, max_size=8),
)
def test_frames_round_trip_through_buffered_reads(
    sent: list[tuple[Frame, bytes | None]], reads: list[int]
) -> None:
    frames_ = [f if body is None else dataclasses.replace(f, body=body) for f, body in sent]
    decoder = FrameDecoder(ROUND_TRIP_LIMIT)
    got = _read_buffered(decoder, b"".join(_wire(f) for f in frames_), reads)
    assert [dataclasses.replace(f, body=bytes(f.body)) for f in got] == frames_
    assert decoder.buffered_bytes == 0


# ------------------------------------------------------------------ malformed bytes
# ------------------------------------------------------------------ malformed bytes


@FUZZ
@given(st.binary(max_size=4096), st.lists(st.integers(0, 1 << 16), max_size=8))
def test_random_bytes_raise_only_protocol_errors(data: bytes, cuts: list[int]) -> None:
    for frame in _feed_all(FrameDecoder(LIMIT), _chunks(data, cuts)):
        _decode_quietly(frame)


@st.composite
def prefixed(draw: st.DrawFn) -> bytes:
    """A prefix with plausible-but-hostile fields (boundary sizes, any kind, any header
    size), then some bytes."""
    size = draw(
        st.one_of(
            u32,
            st.sampled_from([0, 11, 12, 13, LIMIT - 5, LIMIT - 4, LIMIT - 3, 1 << 31, 0xFFFFFFFF]),
            st.integers(0, 600),
        )
    )
    magic = draw(st.sampled_from([MAGIC, MAGIC, MAGIC, 0, 0xFF]))
    version = draw(st.sampled_from([VERSION, VERSION, VERSION, 0, 2]))
    kind = draw(st.integers(0, 255))
    hsize = draw(st.one_of(st.integers(0, 600), st.just(MAX_HEADER_BYTES)))
    head = PREFIX.pack(size, magic, version, kind, draw(st.integers(0, 255)), draw(codes), hsize, 1)
    return head + draw(st.binary(max_size=700))


@FUZZ
@given(st.lists(prefixed(), min_size=1, max_size=4), st.lists(st.integers(0, 1 << 16), max_size=6))
def test_hostile_prefixes_raise_only_protocol_errors(parts: list[bytes], cuts: list[int]) -> None:
    for frame in _feed_all(FrameDecoder(LIMIT), _chunks(b"".join(parts), cuts)):
        assert PREFIX.size + len(frame.header) + len(frame.body) <= LIMIT
        _decode_quietly(frame)


@FUZZ
@given(st.lists(prefixed(), min_size=1, max_size=4), st.lists(st.integers(1, 1 << 16), min_size=1))
def test_hostile_prefixes_through_buffered_reads_raise_only_protocol_errors(
    parts: list[bytes], reads: list[int]
) -> None:
    for frame in _read_buffered(FrameDecoder(LIMIT), b"".join(parts), reads):
        assert PREFIX.size + len(frame.header) + len(frame.body) <= LIMIT
        _decode_quietly(frame)


SAMPLE_REQUESTS: list[msgspec.Struct] = [
    ProduceRequest(topic="orders", queue=3, producer_id=9, epoch=1, base_sequence=100),
    FetchRequest(topic="orders", queue=0, offset=12, max_bytes=1024, max_wait_ms=500),
    CreateTopicRequest(name="t", queues=8, config={"retention.ms": "1"}, hosted_queues=[0, 2]),
    CommitOffsetsRequest(
        group="g", offsets=[QueueOffset(topic="t", queue=1, offset=5)], member_id="m", generation=3
    ),
    JoinGroupRequest(group="g", topics=["a", "b"], member_id="m-1", session_timeout_ms=6000),
    RegisterBrokerRequest(broker_name="b", address="h:1", topics=[("t", 4, "NORMAL", [1, 3])]),
]


@st.composite
def mutated(draw: st.DrawFn) -> bytes:
    """A valid request frame with some bytes flipped, dropped, inserted or overwritten."""
    request = draw(st.sampled_from(SAMPLE_REQUESTS))
    wire = bytearray(
        b"".join(bytes(b) for b in encode_request(request, 7, draw(st.binary(max_size=64))))
    )
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "set", "drop", "insert"]))
        pos = draw(st.integers(0, max(0, len(wire) - 1)))
        if op == "flip" and wire:
            wire[pos] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and wire:
            wire[pos] = draw(
                st.sampled_from([0, 0x7F, 0x80, 0xC1, 0xFF, draw(st.integers(0, 255))])
            )
        elif op == "drop" and wire:
            del wire[pos]
        else:
            wire[pos:pos] = draw(st.binary(min_size=1, max_size=8))
    return bytes(wire)


@FUZZ
@given(st.lists(mutated(), min_size=1, max_size=4), st.lists(st.integers(0, 1 << 16), max_size=6))
def test_mutated_requests_raise_only_protocol_errors(parts: list[bytes], cuts: list[int]) -> None:
    for frame in _feed_all(FrameDecoder(LIMIT), _chunks(b"".join(parts), cuts)):
        _decode_quietly(frame)


# ------------------------------------------------------------------ headers


msgpack_values = st.recursive(
    st.one_of(
        st.none(),
        st.booleans(),
        st.integers(-(2**63), 2**64 - 1),
        st.floats(allow_nan=True),
        st.text(max_size=20),
        st.binary(max_size=20),
    ),
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(
            st.one_of(st.text(max_size=12), st.integers(-(2**63), 2**64 - 1)), inner, max_size=5
        ),
    ),
    max_leaves=30,
)
field_names = st.sampled_from(
    [
        "topic",
        "queue",
        "offset",
        "max_bytes",
        "max_wait_ms",
        "group",
        "topics",
        "member_id",
        "generation",
        "offsets",
        "name",
        "queues",
        "config",
        "hosted_queues",
        "broker_name",
        "address",
        "producer_id",
        "timestamp_ms",
    ]
)


@FUZZ
@given(
    codes,
    st.one_of(msgpack_values, st.dictionaries(field_names, msgpack_values, max_size=8)),
)
def test_decode_request_raises_only_protocol_errors(code: int, value: Any) -> None:
    """Well-formed msgpack of the wrong shape: missing fields, wrong types, out-of-range
    integers, nested junk."""
    header = msgspec.msgpack.encode(value)
    _decode_quietly(Frame(FrameKind.REQUEST, 0, code, 1, header, b""))


@FUZZ
@given(codes, st.binary(max_size=600))
def test_decode_request_on_random_headers(code: int, header: bytes) -> None:
    _decode_quietly(Frame(FrameKind.REQUEST, 0, code, 1, header, b""))


@FUZZ
@given(st.sampled_from(SAMPLE_REQUESTS), st.integers(0, 400), st.integers(0, 255))
def test_decode_request_on_corrupted_valid_headers(
    request: msgspec.Struct, pos: int, byte: int
) -> None:
    (frame,) = FrameDecoder(LIMIT).feed(b"".join(bytes(b) for b in encode_request(request, 1)))
    header = bytearray(frame.header)
    header[pos % len(header)] = byte
    _decode_quietly(Frame(frame.kind, frame.flags, frame.code, 1, bytes(header), b""))
    _decode_quietly(
        Frame(frame.kind, frame.flags, frame.code, 1, bytes(header[: pos % len(header)]), b"")
    )
