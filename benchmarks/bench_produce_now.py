"""The broker's Python per one-message produce, without the network (issue 15).

Usage: ``python benchmarks/bench_produce_now.py [--messages N]``

Starts a broker in this process (async flush, a temporary data directory) and calls the
path a one-message PRODUCE takes from the protocol callback, `Broker._answer_now`, on a
fresh decoded frame each time, then the frame decoder's `feed` and `encode_response`
alone. CPU microseconds per call (`time.process_time`): what the broker's Python costs per
message before any syscall, loop or wake-up (docs/design/performance.md, issue 15).
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from pathlib import Path

from tidemq import aio
from tidemq.broker.broker import Broker
from tidemq.broker.config import BrokerConfig
from tidemq.core.batch import MessageRecord, encode_batch
from tidemq.protocol.codec import encode_request, encode_response
from tidemq.protocol.commands import ProduceRequest, ProduceResponse
from tidemq.protocol.frame import FrameDecoder
from tidemq.store.config import FlushMode, StoreConfig


def _us(seconds: float, n: int) -> str:
    return f"{seconds / n * 1e6:.1f} us"


async def main(messages: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = StoreConfig(data_dir=Path(tmp), flush_mode=FlushMode.ASYNC)
        broker = Broker(BrokerConfig(store=store, port=0), embedded_nameserver=True)
        address = await broker.start()
        try:
            async with aio.Admin(address) as admin:
                await admin.create_topic("now", 1)
            payload = encode_batch([MessageRecord(value=b"x" * 100)])
            raw = b"".join(encode_request(ProduceRequest(topic="now", queue=0), 5, payload))
            decoder = FrameDecoder(1 << 24)
            frames = [decoder.feed(raw)[0] for _ in range(messages)]
            started = time.process_time()
            for frame in frames:
                broker._answer_now(frame, None)  # type: ignore[arg-type]  # (no connection used)
            print(f"Broker._answer_now: {_us(time.process_time() - started, messages)}")
            started = time.process_time()
            for _ in range(messages):
                decoder.feed(raw)
            print(f"FrameDecoder.feed: {_us(time.process_time() - started, messages)}")
            response = ProduceResponse(base_offset=5, count=1)
            started = time.process_time()
            for _ in range(messages):
                encode_response(1, 5, response, b"")
            print(f"encode_response: {_us(time.process_time() - started, messages)}")
        finally:
            await broker.stop()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=20_000)
    asyncio.run(main(ap.parse_args().messages))
