"""Messages by key on a real broker: `Admin.query_messages` against a dict model of what
was sent (single sends, accumulated batches and explicit batches; `key=` and `keys=`),
time ranges on the broker's store time (a ManualClock), limits, a topic that opts out,
retention and compaction removing messages, static topics after a remap, bad input.

The randomized test prints its seed; TIDEMQ_KEYQ_SEED replays it.
"""

from __future__ import annotations

import os
import random
from typing import TYPE_CHECKING

import pytest

import tidemq
from tidemq import aio
from tidemq.core.errors import ConfigError, InvalidRequest, TopicNotFound
from tidemq.testing.clock import ManualClock

if TYPE_CHECKING:
    from tests.integration.conftest import ClusterEnv, Loop, StartBroker, ThreadedBroker

pytestmark = pytest.mark.timeout(120)

ALL = 1_000


def _ids(messages: list[tidemq.Message]) -> list[str]:
    return [m.message_id for m in messages]


def test_every_keyed_message_is_found_by_each_of_its_keys(sync_broker: ThreadedBroker) -> None:
    seed = int(os.environ.get("TIDEMQ_KEYQ_SEED", random.randrange(1 << 30)))
    print(f"TIDEMQ_KEYQ_SEED={seed}")
    rng = random.Random(seed)
    address = sync_broker.address
    model: dict[str, list[str]] = {}  # key -> message ids, oldest first

    def note(keys: set[str], message_id: str) -> None:
        for k in keys:
            model.setdefault(k, []).append(message_id)

    with (
        tidemq.Admin(address) as admin,
        tidemq.Producer(address, linger_ms=20) as producer,
    ):
        admin.create_topic("keyed", 4)
        for round_ in range(6):
            # Single sends, grouped into batches by the accumulator (linger_ms).
            pending = []
            for i in range(rng.randint(5, 40)):
                key = f"k{rng.randint(0, 30)}" if rng.random() < 0.7 else None
                keys = [f"b{rng.randint(0, 30)}" for _ in range(rng.randint(0, 3))]
                future = producer.send_async(
                    "keyed", f"{round_}-{i}".encode(), key=key and key.encode(), keys=keys
                )
                pending.append((future, {k for k in [key, *keys] if k}))
            producer.flush()
            for future, sent_keys in pending:
                note(sent_keys, future.result().message_id)
            # An explicit batch: one record, each message found at its own offset.
            batch_keys = [f"k{rng.randint(0, 30)}".encode() for _ in range(rng.randint(1, 20))]
            receipts = producer.send_batch(
                "keyed", [b"batch"] * len(batch_keys), keys=batch_keys, queue=round_ % 4
            )
            for receipt, raw in zip(receipts, batch_keys, strict=True):
                note({raw.decode()}, receipt.message_id)
        for key, ids in sorted(model.items()):
            found = admin.query_messages("keyed", key, limit=ALL)
            assert sorted(_ids(found)) == sorted(ids), key
            assert all(key in (m.key and m.key.decode(), *m.keys) for m in found)
            # bytes or text: the same key
            assert sorted(_ids(admin.query_messages("keyed", key.encode(), limit=ALL))) == sorted(
                ids
            )
            newest = admin.query_messages("keyed", key, limit=1)
            assert len(newest) == 1
        assert admin.query_messages("keyed", "never-sent") == []


def test_time_range_limit_and_order(start_broker: StartBroker, loop: Loop) -> None:
    clock = ManualClock()
    env = start_broker(clock=clock)
    t0 = clock.now_ms()

    async def main() -> None:
        async with aio.Admin(env.address) as admin, aio.Producer(env.address) as producer:
            await admin.create_topic("timed", 2)
            receipts = []
            for i in range(10):
                receipts.append(await producer.send("timed", b"v%d" % i, key=b"order-7"))
                clock.advance(1_000)
            everything = await admin.query_messages("timed", "order-7", limit=ALL)
            # Newest first (by store time, then offset).
            assert _ids(everything) == [r.message_id for r in reversed(receipts)]
            window = await admin.query_messages(
                "timed", "order-7", start=(t0 + 3_000) / 1000, end=(t0 + 5_000) / 1000
            )
            assert _ids(window) == [r.message_id for r in reversed(receipts[3:6])]
            after = await admin.query_messages("timed", "order-7", start=(t0 + 8_000) / 1000)
            assert [m.value for m in after] == [b"v9", b"v8"]
            limited = await admin.query_messages("timed", "order-7", limit=3)
            assert _ids(limited) == [r.message_id for r in reversed(receipts[-3:])]

    loop.run(main())


def test_a_topic_can_opt_out_and_bad_arguments_are_named(sync_broker: ThreadedBroker) -> None:
    address = sync_broker.address
    with tidemq.Admin(address) as admin, tidemq.Producer(address) as producer:
        admin.create_topic("plain", 1, config={"key.index": "false"})
        admin.create_topic("indexed", 1)
        producer.send("plain", b"x", key=b"k")
        producer.send("indexed", b"x", key=b"k")
        with pytest.raises(InvalidRequest, match=r"key\.index=false"):
            admin.query_messages("plain", "k")
        with pytest.raises(ConfigError, match=r"key\.index must be true or false"):
            admin.create_topic("typo", 1, config={"key.index": "no"})
        with pytest.raises(InvalidRequest, match=r"limit must be in 1\.\.1000"):
            admin.query_messages("indexed", "k", limit=0)
        with pytest.raises(InvalidRequest, match="limit must be an int"):
            admin.query_messages("indexed", "k", limit="5")  # type: ignore[arg-type]
        with pytest.raises(InvalidRequest, match="key must not be empty"):
            admin.query_messages("indexed", "")
        with pytest.raises(InvalidRequest, match="key must be str or bytes"):
            admin.query_messages("indexed", 5)  # type: ignore[arg-type]
        with pytest.raises(InvalidRequest, match=r"start .* is after end"):
            admin.query_messages("indexed", "k", start=20.0, end=10.0)
        with pytest.raises(InvalidRequest, match="start must be seconds"):
            admin.query_messages("indexed", "k", start="today")  # type: ignore[arg-type]
        with pytest.raises(InvalidRequest, match="topic"):
            admin.query_messages("bad name!", "k")
        with pytest.raises(TopicNotFound):
            admin.query_messages("nope", "k")
        # Turning it back on indexes what comes next.
        admin.alter_topic("plain", config={"key.index": "true"})
        later = producer.send("plain", b"y", key=b"k")
        assert _ids(admin.query_messages("plain", "k")) == [later.message_id]


def test_messages_removed_by_retention_or_compaction_are_not_returned(
    start_broker: StartBroker, loop: Loop
) -> None:
    clock = ManualClock()
    env = start_broker(clock=clock, store_overrides={"segment_size_bytes": 4096})

    async def main() -> None:
        async with aio.Admin(env.address) as admin, aio.Producer(env.address) as producer:
            await admin.create_topic("short", 1, config={"retention.ms": "60000"})
            await admin.create_topic("latest", 1, config={"cleanup.policy": "compact"})
            for i in range(60):
                await producer.send("short", b"old-%d" % i + b"." * 200, key=b"gone")
                await producer.send("latest", b"v%d" % i, key=b"sku-1")
            clock.advance(120_000)
            kept = await producer.send("short", b"new", key=b"gone")
            await env.broker._gateway.call(lambda s: s.checkpoint())
            # Retention moves the queue's start past the old messages (their segments go
            # once no queue needs them): the index still names them, the read does not.
            await env.broker._gateway.call(lambda s: s.enforce_retention())
            assert _ids(await admin.query_messages("short", "gone", limit=ALL)) == [kept.message_id]
            assert len(await admin.query_messages("latest", "sku-1", limit=ALL)) == 60
            await admin.compact("latest")
            survivors = await admin.query_messages("latest", "sku-1", limit=ALL)
            assert [m.value for m in survivors] == [b"v59"]

    loop.run(main())


def test_static_topics_answer_with_logical_offsets_from_every_link(
    loop: Loop, cluster3: ClusterEnv
) -> None:
    async def main() -> None:
        async with (
            aio.Admin(cluster3.bootstrap) as admin,
            aio.Producer(cluster3.bootstrap) as producer,
        ):
            await admin.create_topic("static-k", 1, static=True, brokers=["broker-a"])
            old = [await producer.send("static-k", b"old", key=b"k") for _ in range(3)]
            await admin.remap_topic("static-k", brokers=["broker-b"])
            new = [await producer.send("static-k", b"new", key=b"k") for _ in range(2)]
            found = await admin.query_messages("static-k", "k", limit=ALL)
            assert sorted((m.offset, m.value) for m in found) == [
                (r.offset, v) for r, v in [(r, b"old") for r in old] + [(r, b"new") for r in new]
            ]
            assert {m.message_id for m in found} == {r.message_id for r in old + new}

    loop.run(main())
