"""Administration against a real broker: topics, groups, offsets reset, status."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import pytest

import tidemq
from tidemq import aio
from tidemq.core.errors import (
    ConfigError,
    InvalidRequest,
    InvalidTopicName,
    TopicAlreadyExists,
    TopicNotFound,
)

if TYPE_CHECKING:
    from tests.integration.conftest import BrokerEnv, Loop, ThreadedBroker

pytestmark = pytest.mark.timeout(120)


async def _fill(address: str, topic: str, counts: dict[int, int]) -> None:
    """Send counts[q] messages to queue q, one batch per message."""
    async with aio.Producer(address) as producer:
        for queue, n in counts.items():
            for i in range(n):
                await producer.send(topic, b"%d" % i, queue=queue)


def test_topic_lifecycle(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        address = broker.address
        async with aio.Admin(address) as admin:
            created = await admin.create_topic(
                "metrics", 3, config={"retention.ms": "3600000", "max.message.bytes": "1000"}
            )
            assert (created.name, created.queues, created.message_type) == ("metrics", 3, "MIXED")
            assert created.config["retention.ms"] == "3600000"
            assert created.config["max.message.bytes"] == "1000"
            assert [(q.queue, q.min_offset, q.max_offset) for q in created.queue_info] == [
                (0, 0, 0),
                (1, 0, 0),
                (2, 0, 0),
            ]
            assert {q.broker for q in created.queue_info} == {address}
            with pytest.raises(TopicAlreadyExists):
                await admin.create_topic("metrics", 3)
            await admin.create_topic("audit", 1, message_type="fifo")

            topics = await admin.list_topics()
            assert [(t.name, t.queues, t.message_type) for t in topics] == [
                ("audit", 1, "FIFO"),
                ("metrics", 3, "MIXED"),
            ]

            await _fill(address, "metrics", {0: 5, 2: 2})
            described = await admin.describe_topic("metrics")
            assert [(q.queue, q.min_offset, q.max_offset) for q in described.queue_info] == [
                (0, 0, 5),
                (1, 0, 0),
                (2, 0, 2),
            ]

            # Queues can be added, never removed.
            grown = await admin.alter_topic("metrics", queues=5)
            assert grown.queues == 5
            assert [(q.queue, q.max_offset) for q in grown.queue_info] == [
                (0, 5),
                (1, 0),
                (2, 2),
                (3, 0),
                (4, 0),
            ]
            with pytest.raises(ConfigError, match="queues"):
                await admin.alter_topic("metrics", queues=2)
            assert (await admin.describe_topic("metrics")).queues == 5
            async with aio.Producer(address) as producer:
                receipt = await producer.send("metrics", b"new queue", queue=4)
            assert (receipt.queue, receipt.offset) == (4, 0)

            altered = await admin.alter_topic("metrics", config={"retention.ms": "60000"})
            assert altered.config["retention.ms"] == "60000"
            assert altered.queues == 5

            await admin.delete_topic("metrics")
            assert [t.name for t in await admin.list_topics()] == ["audit"]
            with pytest.raises(TopicNotFound):
                await admin.describe_topic("metrics")
            with pytest.raises(TopicNotFound):
                await admin.delete_topic("metrics")
            async with aio.Producer(address) as producer:
                with pytest.raises(TopicNotFound):
                    await producer.send("metrics", b"gone", queue=0)

            # A topic created again under the same name starts empty.
            again = await admin.create_topic("metrics", 2)
            assert [(q.min_offset, q.max_offset) for q in again.queue_info] == [(0, 0), (0, 0)]
            assert "retention.ms" not in again.config

    loop.run(main())


def test_invalid_topic_requests(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        async with aio.Admin(broker.address) as admin:
            with pytest.raises(ConfigError, match="queues"):
                await admin.create_topic("none", 0)
            with pytest.raises(ConfigError, match="queues"):
                await admin.create_topic("too-many", 100_000)
            with pytest.raises(InvalidTopicName):
                await admin.create_topic("a/b", 1)
            with pytest.raises(ConfigError, match="message type"):
                await admin.create_topic("typed", 1, message_type="SOMETIMES")
            with pytest.raises(TopicNotFound):
                await admin.alter_topic("missing", queues=3)
            assert await admin.list_topics() == []

    loop.run(main())


def test_groups_lag_and_offset_reset(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        address = broker.address
        async with aio.Admin(address) as admin:
            await admin.create_topic("clicks", 2)
            await _fill(address, "clicks", {0: 6, 1: 4})
            await asyncio.sleep(0.02)
            cut_ms = time.time_ns() // 1_000_000
            await asyncio.sleep(0.02)
            await _fill(address, "clicks", {0: 2})
            assert await admin.list_groups() == []

            consumer = aio.GroupConsumer(
                address, "readers", ["clicks"], start="earliest", auto_commit=False
            )
            try:
                got: list[aio.Message] = []
                deadline = time.monotonic() + 20
                while len(got) < 12:
                    assert time.monotonic() < deadline
                    got.extend(await consumer.poll(300))
                await consumer.commit({("clicks", 0): 3, ("clicks", 1): 4})
                assert await admin.list_groups() == ["readers"]
                described = await admin.describe_group("readers")
                assert described.generation == 1
                assert [m.member_id for m in described.members] == [consumer.member_id]
                assert described.members[0].assignment == (("clicks", 0), ("clicks", 1))
                assert [(o.queue, o.committed, o.max_offset, o.lag) for o in described.offsets] == [
                    (0, 3, 8, 5),
                    (1, 4, 4, 0),
                ]
                # Executing a reset while the group has members is refused; a dry run is not.
                with pytest.raises(InvalidRequest, match="active members"):
                    await admin.reset_offsets("readers", "clicks", to="earliest", execute=True)
                planned = await admin.reset_offsets("readers", "clicks", to="earliest")
                assert [(o.queue, o.offset) for o in planned] == [(0, 0), (1, 0)]
            finally:
                await consumer.close()

            # Committed offsets outlive the members: the group is still listed.
            assert await admin.list_groups() == ["readers"]
            described = await admin.describe_group("readers")
            assert described.members == ()
            assert [(o.committed, o.lag) for o in described.offsets] == [(3, 5), (4, 0)]

            async def committed() -> list[tuple[int, int]]:
                return [
                    (o.queue, o.committed) for o in (await admin.describe_group("readers")).offsets
                ]

            plans = {
                ("earliest", 0): [(0, 0), (1, 0)],
                ("latest", 0): [(0, 8), (1, 4)],
                ("timestamp", cut_ms): [(0, 6), (1, 4)],
                ("offset", 5): [(0, 5), (1, 4)],  # clamped to each queue's range
                ("shift", -2): [(0, 1), (1, 2)],
                ("shift", 100): [(0, 8), (1, 4)],
            }
            for (to, value), expected in plans.items():
                dry = await admin.reset_offsets("readers", "clicks", to=to, value=value)
                assert [(o.queue, o.offset) for o in dry] == expected, (to, value)
                assert await committed() == [(0, 3), (1, 4)], "a dry run changed offsets"

            done = await admin.reset_offsets(
                "readers", "clicks", to="timestamp", value=cut_ms, execute=True
            )
            assert [(o.queue, o.offset) for o in done] == [(0, 6), (1, 4)]
            assert await committed() == [(0, 6), (1, 4)]
            described = await admin.describe_group("readers")
            assert [o.lag for o in described.offsets] == [2, 0]

            # The group resumes where the reset put it.
            resumed = aio.GroupConsumer(address, "readers", ["clicks"], start="latest")
            try:
                got = []
                deadline = time.monotonic() + 20
                while len(got) < 2:
                    assert time.monotonic() < deadline
                    got.extend(await resumed.poll(300))
                assert [(m.queue, m.offset) for m in got] == [(0, 6), (0, 7)]
            finally:
                await resumed.close()

            with pytest.raises(InvalidRequest, match="reset target"):
                await admin.reset_offsets("readers", "clicks", to="yesterday")
            with pytest.raises(TopicNotFound):
                await admin.reset_offsets("readers", "missing", to="earliest")

    loop.run(main())


def test_status(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        async with aio.Admin(broker.address) as admin:
            await admin.create_topic("one", 1)
            brokers = await admin.cluster_status()
            assert [(b.name, b.address, b.topics) for b in brokers] == [
                ("broker-0", broker.address, 1)
            ]
            assert brokers[0].last_heartbeat_ms_ago >= 0
            status = await admin.broker_status(broker.address)
            assert status.broker_name == "broker-0"
            assert status.version == tidemq.__version__
            assert status.flush_mode == "sync"
            assert status.topics == 1
            assert status.connections >= 1
            assert status.log_flushed_position <= status.log_end_position

    loop.run(main())


def test_sync_admin(sync_broker: ThreadedBroker) -> None:
    address = sync_broker.address
    with tidemq.Admin(address) as admin:
        created = admin.create_topic("sync-topic", 2, config={"cleanup.policy": "delete"})
        assert created.queues == 2
        assert admin.alter_topic("sync-topic", queues=3).queues == 3
        with pytest.raises(ConfigError):
            admin.alter_topic("sync-topic", queues=1)
        assert [t.name for t in admin.list_topics()] == ["sync-topic"]
        with tidemq.Producer(address) as producer:
            producer.send("sync-topic", b"x", queue=2)
        described = admin.describe_topic("sync-topic")
        assert [(q.queue, q.max_offset) for q in described.queue_info] == [(0, 0), (1, 0), (2, 1)]
        assert admin.list_groups() == []
        planned = admin.reset_offsets("g", "sync-topic", to="latest")
        assert [(o.queue, o.offset) for o in planned] == [(0, 0), (1, 0), (2, 1)]
        assert admin.list_groups() == []  # a dry run creates nothing
        admin.reset_offsets("g", "sync-topic", to="latest", execute=True)
        assert admin.list_groups() == ["g"]
        assert [o.lag for o in admin.describe_group("g").offsets] == [0, 0, 0]
        assert [b.name for b in admin.cluster_status()] == ["broker-0"]
        assert admin.broker_status(address).topics == 1
        admin.delete_topic("sync-topic")
        assert admin.list_topics() == []
