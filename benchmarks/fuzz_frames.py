"""Fuzz the protocol's input points: a million hostile inputs through `FrameDecoder.feed`
and `decode_request`, which may raise RemoteProtocolError and nothing else.

Usage: ``python benchmarks/fuzz_frames.py [--inputs N] [--seed S]``

Inputs (seeded, so a failure replays with the same `--seed`), drawn at random from:

* ``random``: random bytes, 0-300 long;
* ``mutated``: valid request frames (one per request type, with realistic headers and
  bodies) with 1-8 edits: bit flips, bytes set to msgpack markers or boundary values,
  deletions, insertions, truncation, a duplicated slice;
* ``prefix``: a valid frame whose prefix fields (size, magic, version, kind, code, header
  size) are replaced by boundary or random values;
* ``header``: a well-formed frame whose msgpack header is random or has the wrong shape
  (valid msgpack: wrong field types, out-of-range integers, strings that are not UTF-8);
* ``stream``: two to four frames (valid or mutated) back to back.

Each input goes to a fresh decoder, in one piece or split at random points; every frame
that comes out goes to `decode_request`. Prints inputs/s and a count per outcome; exits 1
on the first unexpected exception, with the seed and input needed to replay it.
"""

from __future__ import annotations

import argparse
import itertools
import random
import struct
import sys
import time
import traceback
from collections import Counter
from collections.abc import Callable

import msgspec

from tidemq.protocol.codec import decode_request, encode_request
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.commands import (
    AlterTopicRequest,
    CommitOffsetsRequest,
    CreateTopicRequest,
    DescribeGroupRequest,
    FetchRequest,
    GetRoutesRequest,
    HeartbeatRequest,
    JoinGroupRequest,
    ListOffsetsRequest,
    ProduceRequest,
    QueueOffset,
    RegisterBrokerRequest,
    ResetOffsetsRequest,
    StatusRequest,
)
from tidemq.protocol.frame import PREFIX, FrameDecoder, RemoteProtocolError

#: The broker's frame limit is 16 MiB + 64 KiB; a smaller one makes size checks bite often.
MAX_FRAME_BYTES = 1 << 16
MAGIC, VERSION = 0x54, 1

SEEDS = [
    ProduceRequest(topic="orders", queue=3, producer_id=9, epoch=1, base_sequence=100),
    FetchRequest(
        topic="orders", queue=0, offset=12, max_bytes=1 << 20, max_wait_ms=500, tag_mask=3
    ),
    ListOffsetsRequest(topic="orders", queue=1, timestamp_ms=1_700_000_000_000),
    CreateTopicRequest(
        name="orders", queues=8, config={"retention.ms": "3600000"}, hosted_queues=[0, 2, 4]
    ),
    AlterTopicRequest(name="orders", queues=16, config={"cleanup.policy": "compact"}),
    JoinGroupRequest(group="g", topics=["orders", "audit"], member_id="m-1", client_id="c"),
    HeartbeatRequest(group="g", member_id="m-1", generation=4),
    CommitOffsetsRequest(
        group="g",
        offsets=[QueueOffset(topic="orders", queue=q, offset=q * 10) for q in range(3)],
        member_id="m-1",
        generation=4,
    ),
    DescribeGroupRequest(group="g"),
    ResetOffsetsRequest(group="g", topic="orders", to="timestamp", value=5, execute=True),
    RegisterBrokerRequest(
        broker_name="broker-a", address="10.0.0.1:10911", topics=[("orders", 8, "NORMAL", [0, 2])]
    ),
    GetRoutesRequest(topics=["orders"]),
    StatusRequest(),
]
MARKERS = [0x00, 0x7F, 0x80, 0x8F, 0x90, 0xA0, 0xC0, 0xC1, 0xC2, 0xC4, 0xCC, 0xCF, 0xD3]
MARKERS += [0xD9, 0xDA, 0xDB, 0xDC, 0xDD, 0xDE, 0xDF, 0xE0, 0xFF]
FIELDS = ["topic", "queue", "offset", "max_bytes", "group", "topics", "member_id", "offsets"]
FIELDS += ["generation", "name", "queues", "config", "hosted_queues", "address", "to"]


class Fuzzer:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.valid = [
            b"".join(bytes(b) for b in encode_request(req, i, self._body(req)))
            for i, req in enumerate(SEEDS)
        ]
        self.kinds: list[tuple[str, Callable[[], bytes]]] = [
            ("random", self.random_bytes),
            ("mutated", self.mutated),
            ("mutated", self.mutated),
            ("prefix", self.bad_prefix),
            ("header", self.bad_header),
            ("stream", self.stream),
        ]

    def _body(self, req: msgspec.Struct) -> bytes:
        return b"\x00batch payload" * 4 if isinstance(req, ProduceRequest) else b""

    def random_bytes(self) -> bytes:
        return self.rng.randbytes(self.rng.randrange(301))

    def mutated(self) -> bytes:
        rng = self.rng
        data = bytearray(rng.choice(self.valid))
        for _ in range(rng.randint(1, 8)):
            op = rng.randrange(6)
            pos = rng.randrange(len(data)) if data else 0
            if op == 0 and data:
                data[pos] ^= 1 << rng.randrange(8)
            elif op == 1 and data:
                data[pos] = rng.choice(MARKERS) if rng.random() < 0.7 else rng.randrange(256)
            elif op == 2 and data:
                del data[pos : pos + rng.randint(1, 4)]
            elif op == 3:
                data[pos:pos] = rng.randbytes(rng.randint(1, 8))
            elif op == 4:
                del data[rng.randrange(len(data) + 1) :]
            else:
                start = rng.randrange(len(data) + 1)
                data[pos:pos] = data[start : start + rng.randint(1, 16)]
        return bytes(data)

    def bad_prefix(self) -> bytes:
        rng = self.rng
        frame = rng.choice(self.valid)
        fields = list(PREFIX.unpack_from(frame))
        boundary = {
            0: [0, 11, 12, 13, MAX_FRAME_BYTES - 4, MAX_FRAME_BYTES - 3, 1 << 31, 0xFFFFFFFF],
            1: [0, MAGIC, 0xFF],
            2: [0, VERSION, 2, 0xFF],
            3: [0, 4, 5, 0xFF],
            4: [0, 1, 0xFF],
            5: [0, 1, 5, 44, 45, 0xFFFF],
            6: [0, 1, 0xFFFF],
            7: [0, 0xFFFFFFFF],
        }
        limits = [0xFFFFFFFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFFFF, 0xFFFF, 0xFFFFFFFF]
        for _ in range(rng.randint(1, 3)):
            i = rng.randrange(8)
            fields[i] = rng.choice(boundary[i]) if rng.random() < 0.6 else rng.randint(0, limits[i])
        return PREFIX.pack(*fields) + frame[PREFIX.size :]

    def _shape(self, depth: int = 0) -> object:
        """A msgpack-able value: scalars of every type, containers up to depth 3."""
        rng = self.rng
        scalars: list[Callable[[], object]] = [
            lambda: None,
            lambda: rng.choice([True, False]),
            lambda: rng.choice([0, -1, 1, 2**31, -(2**63), 2**64 - 1, rng.randint(-999, 999)]),
            lambda: rng.choice([0.5, float("nan"), float("inf"), -0.0]),
            lambda: "".join(rng.choice("abc%/\x00é") for _ in range(rng.randrange(8))),
            lambda: rng.randbytes(rng.randrange(8)),
            lambda: msgspec.msgpack.Ext(rng.randrange(-128, 128), rng.randbytes(rng.randrange(4))),
        ]
        containers: list[Callable[[], object]] = [
            lambda: [self._shape(depth + 1) for _ in range(rng.randrange(4))],
            lambda: {rng.choice(FIELDS): self._shape(depth + 1) for _ in range(rng.randrange(6))},
            lambda: {rng.choice(FIELDS): self._shape(depth + 1) for _ in range(rng.randrange(6))},
        ]
        return rng.choice(scalars + containers if depth < 3 else scalars)()

    def bad_header(self) -> bytes:
        rng = self.rng
        code = (
            rng.choice([int(c) for c in RequestCode])
            if rng.random() < 0.9
            else rng.randrange(1 << 16)
        )
        roll = rng.random()
        if roll < 0.6:
            header = msgspec.msgpack.encode(self._shape())
        elif roll < 0.8:
            # A valid header for another request type, or for this one with a str field
            # turned into bytes that are not UTF-8.
            frame = rng.choice(self.valid)
            header = frame[PREFIX.size : PREFIX.size + struct.unpack_from("<H", frame, 10)[0]]
            if rng.random() < 0.5:
                header = header.replace(b"\xa6orders", b"\xa6ord\xff\xfes")
        else:
            header = rng.randbytes(rng.randrange(64))
        size = 12 + len(header)
        return PREFIX.pack(size, MAGIC, VERSION, 0, 0, code, len(header), 1) + header

    def stream(self) -> bytes:
        rng = self.rng
        parts = [
            rng.choice(self.valid) if rng.random() < 0.5 else self.mutated()
            for _ in range(rng.randint(2, 4))
        ]
        return b"".join(parts)

    def draw(self) -> tuple[str, bytes]:
        name, make = self.rng.choice(self.kinds)
        return name, make()

    def splits(self, data: bytes) -> list[bytes]:
        rng = self.rng
        if len(data) < 2 or rng.random() < 0.5:
            return [data]
        cuts = sorted(rng.sample(range(1, len(data)), min(len(data) - 1, rng.randint(1, 4))))
        bounds = [0, *cuts, len(data)]
        return [data[a:b] for a, b in itertools.pairwise(bounds)]


def run_one(fuzzer: Fuzzer, data: bytes, outcomes: Counter[str]) -> None:
    decoder = FrameDecoder(MAX_FRAME_BYTES)
    for part in fuzzer.splits(data):
        try:
            frames = decoder.feed(part)
        except RemoteProtocolError:
            outcomes["frame refused"] += 1
            return
        for frame in frames:
            try:
                decode_request(frame)
            except RemoteProtocolError:
                outcomes["request refused"] += 1
            else:
                outcomes["request decoded"] += 1
    outcomes["incomplete" if decoder.buffered_bytes else "consumed"] += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--inputs", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=20_241_122)
    args = parser.parse_args()

    fuzzer = Fuzzer(args.seed)
    outcomes: Counter[str] = Counter()
    kinds: Counter[str] = Counter()
    started = time.perf_counter()
    for i in range(args.inputs):
        kind, data = fuzzer.draw()
        kinds[kind] += 1
        try:
            run_one(fuzzer, data, outcomes)
        except Exception:
            print(f"UNEXPECTED EXCEPTION at input {i} ({kind}), seed {args.seed}:")
            print(f"input: {data!r}")
            traceback.print_exc()
            return 1
    elapsed = time.perf_counter() - started
    rate = args.inputs / elapsed
    print(f"fuzz_frames: {args.inputs:,} inputs in {elapsed:.1f} s: {rate:,.0f} inputs/s")
    print(f"seed {args.seed}; no unexpected exception")
    print("inputs:   " + ", ".join(f"{k} {v:,}" for k, v in sorted(kinds.items())))
    print("outcomes: " + ", ".join(f"{k} {v:,}" for k, v in sorted(outcomes.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
