"""The frame codec and the command codec: round trips, incremental decoding at every split,
and the limits (frame size, header size) with the errors they raise."""

from __future__ import annotations

import random
import tracemalloc
from typing import Any

import msgspec
import pytest

from tidemq.core.errors import (
    BatchTooLarge,
    ConfigError,
    ErrorCode,
    StaleGeneration,
    TidemqError,
    TopicNotFound,
)
from tidemq.protocol.codec import (
    decode_request,
    decode_response,
    encode_error,
    encode_request,
    encode_response,
    error_from_frame,
)
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.commands import (
    REQUESTS,
    CommitOffsetsRequest,
    CreateTopicRequest,
    Empty,
    FetchRequest,
    FetchResponse,
    GetRoutesResponse,
    ProduceRequest,
    ProduceResponse,
    QueueOffset,
    RegisterBrokerRequest,
    StatusRequest,
    TopicRoute,
)
from tidemq.protocol.frame import (
    MAX_HEADER_BYTES,
    MAX_LONG_HEADER_BYTES,
    PREFIX,
    Frame,
    FrameDecoder,
    FrameFlags,
    FrameKind,
    LocalProtocolError,
    RemoteProtocolError,
    encode_frame,
)

MAGIC, VERSION = 0x54, 1
LIMIT = 1 << 20


def _wire(buffers: list[bytes | memoryview]) -> bytes:
    return b"".join(bytes(b) for b in buffers)


def _frame(
    kind: FrameKind = FrameKind.REQUEST,
    *,
    code: int = RequestCode.FETCH,
    corr: int = 1,
    header: bytes = b"\x80",
    body: bytes = b"",
    flags: int = 0,
) -> bytes:
    return _wire(encode_frame(kind, code, corr, header, body, flags=flags))


SAMPLES = [
    (FrameKind.REQUEST, 1, 0, b"", b"", 0),
    (FrameKind.RESPONSE, 65535, 0xFFFFFFFF, b"\x80", b"body", FrameFlags.ERROR),
    (FrameKind.ONEWAY, 2, 7, b"h" * 300, b"", 0),
    (FrameKind.SERVER_REQUEST, 3, 8, b"", bytes(range(256)) * 40, 0),
    (
        FrameKind.SERVER_RESPONSE,
        4,
        9,
        b"x" * MAX_HEADER_BYTES,
        b"y",
        0xFF & ~FrameFlags.LONG_HEADER,
    ),
]


# ------------------------------------------------------------------ frames


@pytest.mark.parametrize("sample", SAMPLES, ids=[k.name for k, *_ in SAMPLES])
def test_round_trip(sample: tuple[FrameKind, int, int, bytes, bytes, int]) -> None:
    kind, code, corr, header, body, flags = sample
    wire = _frame(kind, code=code, corr=corr, header=header, body=body, flags=flags)
    assert len(wire) == PREFIX.size + len(header) + len(body)
    size, magic, version, *_ = PREFIX.unpack_from(wire)
    assert (size, magic, version) == (len(wire) - 4, MAGIC, VERSION)
    decoder = FrameDecoder(LIMIT)
    (frame,) = decoder.feed(wire)
    assert frame == Frame(kind, flags, code, corr, header, body)
    assert frame.is_error == bool(flags & FrameFlags.ERROR)
    assert decoder.buffered_bytes == 0


def test_body_is_a_separate_buffer() -> None:
    body = memoryview(b"z" * 1000)
    buffers = encode_frame(FrameKind.REQUEST, 1, 1, b"\x80", body)
    assert len(buffers) == 2
    assert buffers[1] is body  # not copied
    assert len(encode_frame(FrameKind.REQUEST, 1, 1, b"\x80")) == 1


def test_many_frames_in_one_feed_and_split_at_every_byte() -> None:
    stream = b"".join(
        _frame(kind, code=code, corr=corr, header=header, body=body, flags=flags)
        for kind, code, corr, header, body, flags in SAMPLES[:4]
    )
    expected = FrameDecoder(LIMIT).feed(stream)
    assert len(expected) == 4
    for cut in range(len(stream) + 1):
        decoder = FrameDecoder(LIMIT)
        got = decoder.feed(stream[:cut])
        got += decoder.feed(stream[cut:])
        assert got == expected, cut
        assert decoder.buffered_bytes == 0


def test_split_into_three_at_every_pair_of_boundaries() -> None:
    stream = _frame(header=b"hdr", body=b"bd") + _frame(corr=2, header=b"", body=b"") * 2
    expected = FrameDecoder(LIMIT).feed(stream)
    for i in range(len(stream) + 1):
        for j in range(i, len(stream) + 1):
            decoder = FrameDecoder(LIMIT)
            got = [f for part in (stream[:i], stream[i:j], stream[j:]) for f in decoder.feed(part)]
            assert got == expected, (i, j)


def test_byte_by_byte_and_buffered_bytes() -> None:
    wire = _frame(header=b"abc", body=b"defg")
    decoder = FrameDecoder(LIMIT)
    for i, byte in enumerate(wire[:-1]):
        assert decoder.feed(bytes([byte])) == []
        assert decoder.buffered_bytes == i + 1
    (frame,) = decoder.feed(wire[-1:])
    assert (frame.header, frame.body) == (b"abc", b"defg")
    assert decoder.buffered_bytes == 0


def test_a_trickled_frame_costs_about_its_size_in_memory() -> None:
    # A peer sending a large frame a few bytes per read must not cost an object per read.
    body = bytes(range(256)) * 1024  # 256 KiB
    wire = _frame(body=body)
    decoder = FrameDecoder(LIMIT)
    tracemalloc.start()
    try:
        last = len(wire) - 1
        for i in range(0, last, 3):
            assert decoder.feed(wire[i : min(i + 3, last)]) == []
        held, _ = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert held < 1.2 * len(wire), f"{held} bytes held for a {len(wire)}-byte frame"
    (frame,) = decoder.feed(wire[last:])
    assert frame.body == body
    assert decoder.buffered_bytes == 0


def test_large_frames_across_reads_of_every_size() -> None:
    frames = [_frame(corr=i, header=b"h" * i, body=bytes([i]) * (70_000 + i)) for i in range(5)]
    wire = b"".join(frames)
    for read in (1000, 4096, 65_536, 70_017, 262_144):
        decoder = FrameDecoder(LIMIT)
        got = [f for i in range(0, len(wire), read) for f in decoder.feed(wire[i : i + read])]
        assert [(f.correlation_id, f.header, f.body) for f in got] == [
            (i, b"h" * i, bytes([i]) * (70_000 + i)) for i in range(5)
        ]
        assert decoder.buffered_bytes == 0


def _read_buffered(decoder: FrameDecoder, wire: bytes, reads: list[int]) -> list[Frame]:
    """Deliver `wire` as a BufferedProtocol would: each read at most `reads[i]` bytes (in
    turn, cycling) and at most what get_buffer() offers."""
    frames: list[Frame] = []
    pos = i = 0
    while pos < len(wire):
        buf = decoder.get_buffer()
        n = min(len(buf), reads[i % len(reads)], len(wire) - pos)
        buf[:n] = wire[pos : pos + n]
        frames += decoder.buffer_updated(n)
        pos += n
        i += 1
    return frames


def test_buffered_reading_gives_the_frames_feed_gives() -> None:
    rng = random.Random(5)
    parts = [
        _frame(corr=i, header=b"h" * rng.randrange(0, 300), body=rng.randbytes(size))
        for i, size in enumerate([0, 10, 70_000, 65_519, 300_000, 5, 131_072, 1, 200_000])
    ]
    parts.append(_frame(corr=99, header=b"L" * (MAX_HEADER_BYTES + 1), body=b"x" * 100_000))
    wire = b"".join(parts)
    expected = [
        (f.kind, f.flags, f.correlation_id, f.header, f.body)
        for f in FrameDecoder(LIMIT).feed(wire)
    ]
    # [1] * 64 + [70_000]: byte by byte into a large frame's prefix, then most of it.
    for reads in ([1] * 64 + [70_000], [3, 5000], [65_536], [7, 65_536, 100_000], [1 << 20]):
        decoder = FrameDecoder(LIMIT)
        got = _read_buffered(decoder, wire, reads)
        assert [(f.kind, f.flags, f.correlation_id, f.header, bytes(f.body)) for f in got] == (
            expected
        ), reads
        assert decoder.buffered_bytes == 0


def test_a_large_frame_is_read_into_its_own_buffer_and_not_copied() -> None:
    body = bytes(range(256)) * 1024  # 256 KiB
    wire = _frame(body=body)
    decoder = FrameDecoder(LIMIT)
    (frame,) = _read_buffered(decoder, wire, [65_536])
    assert isinstance(frame.body, memoryview)
    assert frame.body.readonly
    assert frame.body == body
    # Later reads must not write over the body handed out.
    (small,) = _read_buffered(decoder, _frame(body=b"z" * 1000), [65_536])
    assert small.body == b"z" * 1000
    assert frame.body == body


def test_an_announced_frame_gets_its_own_buffer_only_once_an_eighth_arrived() -> None:
    size = 1 << 20
    wire = _frame(body=b"b" * (size - 100))
    decoder = FrameDecoder(2 * LIMIT)
    assert _read_buffered(decoder, wire[: len(wire) // 8 - 1000], [65_536]) == []
    assert len(decoder.get_buffer()) <= 65_536, "a frame's buffer made before an eighth arrived"
    rest = wire[len(wire) // 8 - 1000 :]
    assert _read_buffered(decoder, rest[:2000], [2000]) == []
    assert len(decoder.get_buffer()) == len(wire) - len(wire) // 8 - 1000, "no buffer of its own"
    (frame,) = _read_buffered(decoder, rest[2000:], [1 << 20])
    assert frame.body == b"b" * (size - 100)


def test_buffered_reading_checks_the_prefix_like_feed() -> None:
    decoder = FrameDecoder(LIMIT)
    with pytest.raises(RemoteProtocolError, match="exceeds the limit"):
        _read_buffered(decoder, PREFIX.pack(LIMIT, MAGIC, VERSION, 0, 0, 1, 0, 1), [65_536])


def test_feed_accepts_bytearray_and_memoryview() -> None:
    wire = _frame(body=b"data")
    assert FrameDecoder(LIMIT).feed(bytearray(wire))[0].body == b"data"
    assert FrameDecoder(LIMIT).feed(memoryview(wire))[0].body == b"data"


def test_frame_limit_is_inclusive() -> None:
    header = b"\x80"
    body = b"b" * (LIMIT - PREFIX.size - len(header))
    wire = _frame(header=header, body=body)
    assert len(wire) == LIMIT
    assert FrameDecoder(LIMIT).feed(wire)[0].body == body
    with pytest.raises(RemoteProtocolError, match="exceeds the limit"):
        FrameDecoder(LIMIT).feed(_frame(header=header, body=body + b"!"))


@pytest.mark.parametrize("announced", [LIMIT, 1 << 31, 0xFFFFFFFF])
def test_oversized_frame_fails_on_its_prefix_alone(announced: int) -> None:
    # Only the 16-byte prefix has arrived: the decoder refuses before buffering a body.
    prefix = PREFIX.pack(announced, MAGIC, VERSION, 0, 0, 1, 0, 1)
    decoder = FrameDecoder(LIMIT)
    with pytest.raises(RemoteProtocolError, match="exceeds the limit"):
        decoder.feed(prefix)


@pytest.mark.parametrize(
    ("prefix", "match"),
    [
        (PREFIX.pack(12, 0x55, VERSION, 0, 0, 1, 0, 1), "magic"),
        (PREFIX.pack(12, MAGIC, 2, 0, 0, 1, 0, 1), "magic/version"),
        (PREFIX.pack(12, MAGIC, VERSION, 5, 0, 1, 0, 1), "kind"),
        (PREFIX.pack(12, MAGIC, VERSION, 255, 0, 1, 0, 1), "kind"),
        (PREFIX.pack(12, MAGIC, VERSION, 0, 0, 1, 1, 1), "header size"),
        (PREFIX.pack(0, MAGIC, VERSION, 0, 0, 1, 0, 1), "header size"),
        (PREFIX.pack(11, MAGIC, VERSION, 0, 0, 1, 0, 1), "header size"),
        (PREFIX.pack(20, MAGIC, VERSION, 0, 0, 1, 0xFFFF, 1), "header size"),
    ],
)
def test_malformed_prefix(prefix: bytes, match: str) -> None:
    with pytest.raises(RemoteProtocolError, match=match):
        FrameDecoder(LIMIT).feed(prefix)


def test_bad_frame_after_a_good_one_still_raises() -> None:
    decoder = FrameDecoder(LIMIT)
    with pytest.raises(RemoteProtocolError):
        decoder.feed(_frame() + PREFIX.pack(12, 0, VERSION, 0, 0, 1, 0, 1))


def test_smallest_frame() -> None:
    wire = PREFIX.pack(12, MAGIC, VERSION, 0, 0, 1, 0, 9)
    (frame,) = FrameDecoder(PREFIX.size).feed(wire)
    assert (frame.header, frame.body, frame.correlation_id) == (b"", b"", 9)


def test_encode_refuses_what_the_protocol_cannot_carry() -> None:
    with pytest.raises(LocalProtocolError, match="header"):
        encode_frame(FrameKind.REQUEST, 1, 1, b"x" * (MAX_LONG_HEADER_BYTES + 1))
    encode_frame(FrameKind.REQUEST, 1, 1, b"x" * MAX_LONG_HEADER_BYTES)


@pytest.mark.parametrize("body", [b"", b"the body"])
def test_a_long_header_travels_in_the_body(body: bytes) -> None:
    header = bytes(range(256)) * 300  # 76,800 bytes: over the u16 header size
    wire = _frame(FrameKind.RESPONSE, code=5, corr=3, header=header, body=body)
    size, *_, hsize, _ = PREFIX.unpack_from(wire)
    assert hsize == 0
    assert size == len(wire) - 4 == 12 + 4 + len(header) + len(body)
    decoder = FrameDecoder(LIMIT)
    (frame,) = decoder.feed(wire[:1000]) or decoder.feed(wire[1000:])
    assert (frame.header, frame.body) == (header, body)
    assert frame.flags == FrameFlags.LONG_HEADER
    # the caller's flag is ignored for a header that fits
    short = _frame(FrameKind.RESPONSE, header=b"h", body=body, flags=FrameFlags.LONG_HEADER)
    (plain,) = FrameDecoder(LIMIT).feed(short)
    assert (plain.header, plain.body, plain.flags) == (b"h", body, 0)


@pytest.mark.parametrize(
    ("after_prefix", "hsize", "message"),
    [
        (b"\x05\x00\x00\x00abcde", 1, "header_size 0"),
        (b"\x01\x00", 0, "too short"),
        (b"\x09\x00\x00\x00abc", 0, "exceeds the frame"),
        (b"\xff\xff\xff\x7f", 0, "exceeds"),
    ],
)
def test_bad_long_headers_are_protocol_errors(
    after_prefix: bytes, hsize: int, message: str
) -> None:
    prefix = PREFIX.pack(
        12 + len(after_prefix), MAGIC, VERSION, 1, FrameFlags.LONG_HEADER, 1, hsize, 1
    )
    with pytest.raises(RemoteProtocolError, match=message):
        FrameDecoder(LIMIT).feed(prefix + after_prefix)


# ------------------------------------------------------------------ commands


def _one_frame(buffers: list[bytes | memoryview]) -> Frame:
    (frame,) = FrameDecoder(64 << 20).feed(_wire(buffers))
    return frame


REQUEST_SAMPLES: list[msgspec.Struct] = [
    ProduceRequest(topic="t", queue=3, producer_id=9, epoch=1, base_sequence=100),
    FetchRequest(topic="t", queue=0, offset=2**40, max_bytes=1024, max_wait_ms=500, tag_mask=7),
    CreateTopicRequest(name="t", queues=8, config={"retention.ms": "1"}, hosted_queues=[0, 2]),
    CommitOffsetsRequest(
        group="g", offsets=[QueueOffset(topic="t", queue=1, offset=5)], member_id="m", generation=3
    ),
    RegisterBrokerRequest(broker_name="b", address="h:1", topics=[("t", 4, "NORMAL", [1, 3])]),
    StatusRequest(),
]


@pytest.mark.parametrize("request_", REQUEST_SAMPLES, ids=lambda r: type(r).__name__)
def test_request_round_trip(request_: msgspec.Struct) -> None:
    frame = _one_frame(encode_request(request_, 42, b"payload"))
    assert frame.kind is FrameKind.REQUEST
    assert frame.correlation_id == 42
    assert frame.body == b"payload"
    code, header = decode_request(frame)
    assert REQUESTS[code][0] is type(request_)
    assert header == request_


def test_every_request_code_has_a_decoder() -> None:
    assert set(REQUESTS) == set(RequestCode)
    for code, (req, _) in REQUESTS.items():
        if len(req.__struct_defaults__) == len(req.__struct_fields__):
            # Every field has a default: an empty map is a valid header.
            frame = Frame(FrameKind.REQUEST, 0, code, 1, b"\x80", b"")
            assert decode_request(frame) == (code, req())
        else:
            with pytest.raises(RemoteProtocolError, match=code.name):
                decode_request(Frame(FrameKind.REQUEST, 0, code, 1, b"\x80", b""))


def test_oneway_request() -> None:
    frame = _one_frame(encode_request(StatusRequest(), 0, oneway=True))
    assert frame.kind is FrameKind.ONEWAY


def test_encode_request_refuses_a_response_type() -> None:
    with pytest.raises(LocalProtocolError, match="not a request"):
        encode_request(ProduceResponse(base_offset=0, count=1), 1)


@pytest.mark.parametrize(
    ("code", "header", "match"),
    [
        (0, b"\x80", "unknown request code"),
        (9999, b"\x80", "unknown request code"),
        (RequestCode.FETCH, b"", "bad FETCH"),
        (RequestCode.FETCH, b"\xc1", "bad FETCH"),
        (RequestCode.FETCH, b"\x80", "bad FETCH"),  # required fields missing
        (RequestCode.FETCH, msgspec.msgpack.encode({"topic": 1}), "bad FETCH"),
        (RequestCode.PRODUCE, msgspec.msgpack.encode([1, 2, 3]), "bad PRODUCE"),
        (RequestCode.STATUS, b"\x80\x80", "bad STATUS"),  # trailing bytes
        # A str that is not UTF-8 (msgspec raises UnicodeDecodeError for it).
        (RequestCode.DESCRIBE_TOPIC, b"\x81\xa4name\xa2\xff\xfe", "bad DESCRIBE_TOPIC"),
        (RequestCode.FETCH, b"\x81\xa5topic\xa1\x80", "bad FETCH"),
    ],
)
def test_decode_request_errors(code: int, header: bytes, match: str) -> None:
    with pytest.raises(RemoteProtocolError, match=match):
        decode_request(Frame(FrameKind.REQUEST, 0, code, 1, header, b""))


def test_unknown_header_fields_are_ignored() -> None:
    # Forward compatibility: a newer peer's extra fields do not break an older one.
    header = msgspec.msgpack.encode({"topic": "t", "queue": 1, "added_later": [1, 2]})
    _, decoded = decode_request(Frame(FrameKind.REQUEST, 0, RequestCode.PRODUCE, 1, header, b""))
    assert decoded == ProduceRequest(topic="t", queue=1)


def test_response_round_trip() -> None:
    response = FetchResponse(
        status="found", next_offset=10, min_offset=0, max_offset=10, record_sizes=[5, 6]
    )
    frame = _one_frame(encode_response(RequestCode.FETCH, 7, response, b"x" * 11))
    assert (frame.kind, frame.correlation_id, frame.is_error) == (FrameKind.RESPONSE, 7, False)
    assert decode_response(frame, FetchResponse) == response
    routes = GetRoutesResponse(
        routes=[TopicRoute(topic="t", queues=2, message_type="NORMAL", brokers={0: "a:1"})],
        brokers={"a": "a:1"},
    )
    frame = _one_frame(encode_response(RequestCode.GET_ROUTES, 8, routes))
    assert decode_response(frame, GetRoutesResponse) == routes


def test_response_of_the_wrong_type() -> None:
    frame = _one_frame(encode_response(RequestCode.DELETE_TOPIC, 1, Empty()))
    with pytest.raises(RemoteProtocolError, match="expected"):
        decode_response(frame, FetchResponse)
    bad = Frame(FrameKind.RESPONSE, 0, 9999, 1, b"\x80", b"")
    with pytest.raises(RemoteProtocolError):
        decode_response(bad, Empty)
    garbage = Frame(FrameKind.RESPONSE, 0, RequestCode.FETCH, 1, b"\xc1", b"")
    with pytest.raises(RemoteProtocolError):
        decode_response(garbage, FetchResponse)


@pytest.mark.parametrize(
    "error", [TopicNotFound("no such topic"), StaleGeneration("old"), ConfigError("retention.ms")]
)
def test_error_round_trip(error: TidemqError) -> None:
    frame = _one_frame(encode_error(RequestCode.COMMIT_OFFSETS, 3, error))
    assert frame.is_error
    assert frame.code == RequestCode.COMMIT_OFFSETS
    with pytest.raises(type(error), match=str(error)) as raised:
        decode_response(frame, Empty)
    assert type(raised.value) is type(error)


def test_error_message_is_bounded_and_unknown_codes_map_to_the_base() -> None:
    frame = _one_frame(encode_error(1, 1, BatchTooLarge("x" * 50_000)))
    err = error_from_frame(frame)
    assert isinstance(err, BatchTooLarge)
    assert len(str(err)) == 1000
    header = msgspec.msgpack.encode({"code": 65000, "message": "from the future"})
    unknown = error_from_frame(Frame(FrameKind.RESPONSE, FrameFlags.ERROR, 1, 1, header, b""))
    assert type(unknown) is TidemqError
    assert str(unknown) == "from the future"
    broken = error_from_frame(Frame(FrameKind.RESPONSE, FrameFlags.ERROR, 1, 1, b"\xc1", b""))
    assert isinstance(broken, RemoteProtocolError)
    not_utf8 = b"\x82\xa4code\x04\xa7message\xa1\x80"
    broken = error_from_frame(Frame(FrameKind.RESPONSE, FrameFlags.ERROR, 1, 1, not_utf8, b""))
    assert isinstance(broken, RemoteProtocolError)


def test_every_error_code_round_trips() -> None:
    seen: set[type[Any]] = set()
    for code in ErrorCode:
        header = msgspec.msgpack.encode({"code": int(code), "message": code.name})
        err = error_from_frame(Frame(FrameKind.RESPONSE, FrameFlags.ERROR, 1, 1, header, b""))
        assert err.code is code
        seen.add(type(err))
    assert len(seen) == len(ErrorCode)
