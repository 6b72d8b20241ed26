"""Pop consumption throughput: receive + ack of 100-byte messages, against Redis Streams
consumer groups (XREADGROUP + XACK, redis-py) in the same run.

    python benchmarks/bench_pop.py            # 200,000 messages, 3 runs
    python benchmarks/bench_pop.py --quick    # 50,000, 1 run

Cells (each on a fresh queue prefilled with N messages, 4 queues for tidemq, one stream for
Redis; tidemq with sync flush, Redis with AOF everysec):

* tidemq SimpleConsumer, 1 and 4 consumers (asyncio tasks of one process, separate
  connections): `receive(256)` then one `ack_many` per batch; every ack is durable before
  its answer (and every lease, too);
* tidemq PushConsumer (when `tidemq.aio.PushConsumer` exists): a no-op handler;
* Redis: `XREADGROUP COUNT 256` + `XACK` of the ids, 1 and 4 consumers.

Prints the configuration, each run, the medians and the tidemq / Redis ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers
import tidemq
from tidemq import aio
from tidemq.client.simple_consumer import AsyncSimpleConsumer

VALUE = b"x" * 100
QUEUES = 4
BATCH = 256


async def prefill(address: str, topic: str, total: int) -> None:
    async with aio.Admin(address) as admin:
        await admin.create_topic(topic, QUEUES)
    async with aio.Producer(address) as producer:
        for i in range(0, total, BATCH):
            n = min(BATCH, total - i)
            await producer.send_batch(topic, [VALUE] * n, queue=(i // BATCH) % QUEUES)


async def tq_pop(address: str, topic: str, total: int, consumers: int, seconds: float) -> float:
    done = 0
    stop = time.perf_counter() + seconds

    async def one() -> None:
        nonlocal done
        c = AsyncSimpleConsumer(address, f"g-{topic}", {topic: "*"}, await_duration=0.2)
        try:
            while done < total and time.perf_counter() < stop:
                batch = await c.receive(BATCH, invisible_duration=60.0)
                if not batch:
                    if done >= total:
                        break
                    continue
                await c.ack_many(batch)
                done += len(batch)
        finally:
            await c.close()

    t0 = time.perf_counter()
    await asyncio.gather(*(one() for _ in range(consumers)))
    return done / (time.perf_counter() - t0)


async def tq_push(address: str, topic: str, total: int, seconds: float) -> float | None:
    push_cls = getattr(aio, "PushConsumer", None)
    if push_cls is None:
        return None
    done = 0
    finished = asyncio.Event()

    async def handler(msg: Any) -> None:
        nonlocal done
        done += 1
        if done >= total:
            finished.set()

    consumer = push_cls(address, f"p-{topic}", {topic: "*"}, handler, max_concurrency=256)
    t0 = time.perf_counter()
    async with consumer:
        await consumer.start()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(finished.wait(), seconds)
    return done / (time.perf_counter() - t0)


def redis_pop(server: peers.Server, total: int, consumers: int, seconds: float) -> float:
    import redis  # noqa: PLC0415 - optional peer

    host, port = server.address.rsplit(":", 1)
    r = redis.Redis(host=host, port=int(port))
    key = f"pop-{time.monotonic_ns()}"
    for i in range(0, total, BATCH):
        pipe = r.pipeline(transaction=False)
        for _ in range(min(BATCH, total - i)):
            pipe.xadd(key, {"v": VALUE})
        pipe.execute()
    r.xgroup_create(key, "g", id="0")
    r.close()

    async def run() -> int:
        import redis.asyncio as aredis  # noqa: PLC0415

        done = 0
        stop = time.perf_counter() + seconds

        async def one(name: str) -> None:
            nonlocal done
            c: Any = aredis.Redis(host=host, port=int(port))
            try:
                while done < total and time.perf_counter() < stop:
                    resp = await c.xreadgroup("g", name, {key: ">"}, count=BATCH)
                    if not resp or not resp[0][1]:
                        break
                    ids = [e[0] for e in resp[0][1]]
                    await c.xack(key, "g", *ids)
                    done += len(ids)
            finally:
                await c.aclose()

        await asyncio.gather(*(one(f"c{i}") for i in range(consumers)))
        return done

    t0 = time.perf_counter()
    n = asyncio.run(run())
    return n / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--messages", type=int)
    parser.add_argument("--runs", type=int)
    parser.add_argument("--seconds", type=float, default=60.0)
    args = parser.parse_args()
    tidemq.tune_malloc()  # as bench_broker.py: what the guide recommends for producers
    total = args.messages or (50_000 if args.quick else 200_000)
    runs = args.runs or (1 if args.quick else 3)
    print("config:", json.dumps({"messages": total, "runs": runs, "batch": BATCH,
                                 "versions": peers.versions()}))  # fmt: skip
    results: dict[str, list[float]] = {}
    for run in range(runs):
        server = peers.start_tidemq("sync")
        try:
            for consumers in (1, 4):
                topic = f"pop{consumers}-{run}"
                asyncio.run(prefill(server.address, topic, total))
                rate = asyncio.run(tq_pop(server.address, topic, total, consumers, args.seconds))
                results.setdefault(f"tidemq pop x{consumers}", []).append(rate)
            topic = f"push-{run}"
            asyncio.run(prefill(server.address, topic, total))
            push = asyncio.run(tq_push(server.address, topic, total, args.seconds))
            if push is not None:
                results.setdefault("tidemq push", []).append(push)
        finally:
            server.stop()
        try:
            redis = peers.start_redis(appendonly=True)
        except peers.PeerMissing as exc:
            print(f"redis skipped: {exc}")
        else:
            try:
                for consumers in (1, 4):
                    rate = redis_pop(redis, total, consumers, args.seconds)
                    results.setdefault(f"redis xreadgroup+xack x{consumers}", []).append(rate)
            finally:
                redis.stop()
        print(f"run {run + 1}: " + ", ".join(f"{k}={v[-1]:,.0f}" for k, v in results.items()))
    med = {k: statistics.median(v) for k, v in results.items()}
    print("\nmedian msg/s:")
    for k, v in med.items():
        print(f"  {k:34s} {v:>12,.0f}")
    for n in (1, 4):
        peer = med.get(f"redis xreadgroup+xack x{n}")
        if peer:
            print(f"  ratio tidemq/redis x{n}: {med[f'tidemq pop x{n}'] / peer:.2f}")


if __name__ == "__main__":
    main()
