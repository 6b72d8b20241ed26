"""Two brokers behind a standalone name server: queues spread over the brokers, clients
route each queue to its broker, a broker that goes silent leaves the routes. (Where groups
are coordinated, and how their offsets follow them: test_group_coordinator.py.)"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.integration.conftest import (
    CLUSTER_HEARTBEAT_MS,
    CLUSTER_TTL_MS,
    broker_config,
    wait_until,
)

from tidemq import aio
from tidemq.broker.broker import Broker
from tidemq.client.cluster import ClientConfig, ClusterClient
from tidemq.cluster.service import NameServerService
from tidemq.core.errors import BrokerNotAvailable, QueueNotFound, TopicNotFound
from tidemq.protocol.commands import (
    CreateTopicRequest,
    DescribeTopicRequest,
    FetchRequest,
    FetchResponse,
    TimerStatusRequest,
    TimerStatusResponse,
    TopicInfoMsg,
)

if TYPE_CHECKING:
    from tests.integration.conftest import ClusterEnv, Loop

pytestmark = pytest.mark.timeout(120)

TOPIC = "spread"


async def _hosted(address: str, topic: str) -> dict[int, int]:
    """Queue -> max offset, as the broker at `address` itself reports them."""
    client = ClusterClient(address)
    try:
        info = await client.call(address, DescribeTopicRequest(name=topic), TopicInfoMsg)
    finally:
        await client.close()
    assert {q.broker for q in info.queue_info} <= {address}
    return {q.queue: q.max_offset for q in info.queue_info}


def test_queues_spread_and_route_to_their_broker(loop: Loop, cluster: ClusterEnv) -> None:
    a, b = cluster.addresses

    async def main() -> None:
        async with aio.Admin(cluster.bootstrap) as admin:
            created = await admin.create_topic(TOPIC, 4)
            # Queue q on the q-th broker in name order: broker-a 0, 2; broker-b 1, 3.
            assert [(q.queue, q.broker) for q in created.queue_info] == [
                (0, a),
                (1, b),
                (2, a),
                (3, b),
            ]
            status = await admin.cluster_status()
            assert [(s.name, s.address, s.topics) for s in status] == [
                ("broker-a", a, 1),
                ("broker-b", b, 1),
            ]

        client = ClusterClient(cluster.bootstrap)
        try:
            routes = await client.refresh_routes(force=True)
            assert routes.security_writer == a  # the oldest live broker
            assert routes.queue_count(TOPIC) == 4
            assert [routes.broker_for(TOPIC, q) for q in range(4)] == [a, b, a, b]
            # The broker that does not serve a queue refuses it.
            with pytest.raises(QueueNotFound):
                await client.call(
                    a,
                    FetchRequest(topic=TOPIC, queue=1, offset=0, max_bytes=1024),
                    FetchResponse,
                )
        finally:
            await client.close()

        async with aio.Producer(cluster.bootstrap) as producer:
            receipts = [await producer.send(TOPIC, b"rr-%d" % i) for i in range(8)]
            receipts += [await producer.send(TOPIC, b"q3-%d" % i, queue=3) for i in range(3)]
            receipts += await producer.send_batch(TOPIC, [b"b0", b"b1"], queue=0)
        assert sorted(r.queue for r in receipts[:8]) == [0, 0, 1, 1, 2, 2, 3, 3]
        # Each broker stored exactly its own queues' messages.
        assert await _hosted(a, TOPIC) == {0: 4, 2: 2}
        assert await _hosted(b, TOPIC) == {1: 2, 3: 5}

        async with aio.Admin(cluster.bootstrap) as admin:
            merged = await admin.describe_topic(TOPIC)
            assert [(q.queue, q.max_offset, q.broker) for q in merged.queue_info] == [
                (0, 4, a),
                (1, 2, b),
                (2, 2, a),
                (3, 5, b),
            ]
            assert [t.name for t in await admin.list_topics()] == [TOPIC]

        consumer = aio.StreamConsumer(cluster.bootstrap, start="earliest")
        try:
            consumer.assign([(TOPIC, q) for q in range(4)])
            got: list[aio.Message] = []
            deadline = time.monotonic() + 20
            while len(got) < len(receipts):
                assert time.monotonic() < deadline, f"read {len(got)} of {len(receipts)}"
                got.extend(await consumer.poll(500))
        finally:
            await consumer.close()
        assert sorted((m.queue, m.offset) for m in got) == sorted(
            (r.queue, r.offset) for r in receipts
        )

    loop.run(main())


def test_group_consumer_and_alter_across_brokers(loop: Loop, cluster: ClusterEnv) -> None:
    a, b = cluster.addresses

    async def main() -> None:
        async with aio.Admin(cluster.bootstrap) as admin:
            await admin.create_topic(TOPIC, 2)
            grown = await admin.alter_topic(TOPIC, queues=4)
            assert [(q.queue, q.broker) for q in grown.queue_info] == [
                (0, a),
                (1, b),
                (2, a),
                (3, b),
            ]
        async with aio.Producer(cluster.bootstrap) as producer:
            receipts = [await producer.send(TOPIC, b"%d" % i, key=b"k%d" % i) for i in range(40)]
        assert {r.queue for r in receipts} == {0, 1, 2, 3}

        consumer = aio.GroupConsumer(
            cluster.bootstrap, "cluster-readers", [TOPIC], start="earliest"
        )
        try:
            got: list[aio.Message] = []
            deadline = time.monotonic() + 20
            while len(got) < 40:
                assert time.monotonic() < deadline, f"read {len(got)} of 40"
                got.extend(await consumer.poll(500))
            assert consumer.assignment() == [(TOPIC, q) for q in range(4)]
            await consumer.commit()
        finally:
            await consumer.close()
        assert sorted(int(m.value or b"") for m in got) == list(range(40))

        # The group's coordinator keeps its offsets for queues on either broker.
        again = aio.GroupConsumer(cluster.bootstrap, "cluster-readers", [TOPIC], start="earliest")
        try:
            assert await again.poll(500) == []
        finally:
            await again.close()

    loop.run(main())


def test_silent_broker_drops_out_of_routes(loop: Loop, cluster: ClusterEnv) -> None:
    a, b = cluster.addresses
    ns = cluster.nameserver.nameserver

    async def main() -> None:
        async with aio.Admin(cluster.bootstrap) as admin:
            await admin.create_topic(TOPIC, 4)
        # broker-b stops heartbeating (its registration task dies) but keeps serving.
        registration = cluster.brokers[1]._registration
        assert registration._task is not None
        registration._task.cancel()
        await loop.wait_until(
            lambda: set(ns.brokers()) == {"broker-a"}, timeout_s=20, what="broker-b to lapse"
        )
        client = ClusterClient(cluster.bootstrap)
        try:
            routes = await client.refresh_routes(force=True)
            assert routes.queues(TOPIC) == [0, 2]
            assert routes.queue_count(TOPIC) == 4  # the topic keeps its queue count
            assert routes.brokers == {"broker-a": a}
        finally:
            await client.close()
        # The name server's sweep forgets it entirely.
        await loop.wait_until(
            lambda: [s.name for s in ns.status()] == ["broker-a"], what="the sweep"
        )

        fast_fail = ClientConfig(retries=1, retry_backoff_ms=10, request_timeout_ms=5_000)
        async with aio.Producer(cluster.bootstrap, client_config=fast_fail) as producer:
            # Round robin uses the served queues only.
            sent = [await producer.send(TOPIC, b"x") for _ in range(6)]
            assert {r.queue for r in sent} == {0, 2}
            # A queue without a live broker: not served, and the client says so.
            with pytest.raises(BrokerNotAvailable):
                await producer.send(TOPIC, b"y", queue=1)

        # Heartbeats resume: broker-b serves its queues again.
        await registration.start()
        await loop.wait_until(
            lambda: set(ns.brokers()) == {"broker-a", "broker-b"}, what="broker-b to return"
        )
        async with aio.Producer(cluster.bootstrap) as producer:
            receipt = await producer.send(TOPIC, b"back", queue=1)
        assert (receipt.queue, receipt.offset) == (1, 0)
        assert await _hosted(b, TOPIC) == {1: 1, 3: 0}

    loop.run(main())


def test_group_admin_covers_queues_on_every_broker(loop: Loop, cluster: ClusterEnv) -> None:
    async def main() -> None:
        async with aio.Admin(cluster.bootstrap) as admin:
            await admin.create_topic(TOPIC, 4)
            async with aio.Producer(cluster.bootstrap) as producer:
                for q in range(4):
                    await producer.send(TOPIC, b"x", queue=q)
            reset = await admin.reset_offsets("g", TOPIC, to="latest", execute=True)
            described = await admin.describe_group("g")
        assert [(o.queue, o.offset) for o in reset] == [(q, 1) for q in range(4)]
        assert [(o.queue, o.committed, o.lag) for o in described.offsets] == [
            (q, 1, 0) for q in range(4)
        ]

    loop.run(main())


def test_stopped_broker_unregisters_at_once(loop: Loop, cluster: ClusterEnv) -> None:
    async def main() -> None:
        async with aio.Admin(cluster.bootstrap) as admin:
            await admin.create_topic(TOPIC, 2)
            await cluster.brokers[1].stop()
            # Unregistered on stop: gone from the routes without waiting for the TTL.
            assert set(cluster.nameserver.nameserver.brokers()) == {"broker-a"}
            status = await admin.cluster_status()
            assert [s.name for s in status] == ["broker-a"]
            described = await admin.describe_topic(TOPIC)
            assert [q.queue for q in described.queue_info] == [0]

    loop.run(main())


def test_group_reads_a_topic_the_coordinator_does_not_host(loop: Loop, cluster: ClusterEnv) -> None:
    async def main() -> None:
        # The topic lives on the broker that does not coordinate the group alone.
        client = ClusterClient(cluster.bootstrap)
        try:
            coordinator = await client.coordinator("far")
            [other] = [a for a in cluster.addresses if a != coordinator]
            request = CreateTopicRequest(name="elsewhere", queues=1, hosted_queues=[0])
            await client.call(other, request, TopicInfoMsg)
            deadline = time.monotonic() + 10
            while "elsewhere" not in await client.refresh_routes(force=True):
                assert time.monotonic() < deadline, "the topic never reached the routes"
                await asyncio.sleep(0.05)
            assert await client.coordinator("far") == coordinator  # the topic moved nothing
        finally:
            await client.close()
        async with aio.Producer(cluster.bootstrap) as producer:
            for i in range(5):
                await producer.send("elsewhere", b"m%d" % i)
        group = aio.GroupConsumer(cluster.bootstrap, "far", ["elsewhere"], start="earliest")
        got: list[bytes | None] = []
        deadline = time.monotonic() + 20
        while len(got) < 5:
            assert time.monotonic() < deadline, f"got {got}"
            got.extend(m.value for m in await group.poll(500))
        await group.commit()
        await group.close()
        assert got == [b"m%d" % i for i in range(5)]

    loop.run(main())


def test_pop_retries_stay_on_the_broker_of_their_queue(loop: Loop, cluster: ClusterEnv) -> None:
    """A nack on each broker creates that broker's own `%RETRY%<group>`; the group's
    consumer receives each retried message once, from the broker that holds it."""

    async def main() -> None:
        async with aio.Admin(cluster.bootstrap) as admin:
            await admin.create_topic("work", 2)  # queue 0 on broker-a, 1 on broker-b
        async with aio.Producer(cluster.bootstrap) as producer:
            for q in (0, 1):
                await producer.send("work", b"job-%d" % q, queue=q)
        consumer = aio.SimpleConsumer(cluster.bootstrap, "crew", {"work": "*"}, await_duration=0.2)
        first: list[aio.ReceivedMessage] = []
        deadline = time.monotonic() + 10
        while len(first) < 2 and time.monotonic() < deadline:
            first += await consumer.receive(2)
        assert sorted(m.value or b"" for m in first) == [b"job-0", b"job-1"]
        for m in first:
            await m.nack(delay=0.2, reason="retry me")
        again: list[aio.ReceivedMessage] = []
        deadline = time.monotonic() + 10
        while len(again) < 2 and time.monotonic() < deadline:
            again += await consumer.receive(2)
        assert sorted((m.value or b"", m.queue, m.delivery_attempt) for m in again) == [
            (b"job-0", 0, 2),
            (b"job-1", 1, 2),
        ]
        assert {m.message_id for m in again} == {m.message_id for m in first}
        for m in again:
            await m.ack()
        assert await consumer.receive(2) == []
        client = ClusterClient(cluster.bootstrap)
        for address in cluster.addresses:  # each broker retried its own message
            timers = await client.call(address, TimerStatusRequest(), TimerStatusResponse)
            assert timers.delivered_batches == 1
        await client.close()
        await consumer.close()

    loop.run(main())


def test_a_client_drops_a_broker_whose_connection_fails_until_it_answers_again(
    loop: Loop, cluster: ClusterEnv
) -> None:
    b = cluster.addresses[1]

    async def main() -> None:
        async with aio.Admin(cluster.bootstrap) as admin:
            await admin.create_topic(TOPIC, 4)
        client = ClusterClient(cluster.bootstrap)
        try:
            await client.refresh_routes(force=True)
            conn = await client.connection(b)
            conn.close()  # as when broker-b's socket closes
            # Noticed at the next lookup: broker-b's queues leave this client's routes.
            assert client.routes.queues(TOPIC) == [0, 2]
            assert set(client.routes.brokers) == {"broker-a"}
            # broker-b lives (its connection was only closed, as for idleness): a probe
            # connects, and a lookup of its queue waits for that answer instead of failing.
            assert await client.broker_for(TOPIC, 1) == b
            assert client.routes.queues(TOPIC) == [0, 1, 2, 3]

            # broker-b stops listening (its heartbeats go on): it stays out of the routes
            # while connecting fails, though the name server still lists it.
            await cluster.brokers[1]._server.stop_accepting()
            (await client.connection(b)).close()
            with pytest.raises(BrokerNotAvailable):
                await client.call(b, DescribeTopicRequest(name=TOPIC), TopicInfoMsg)
            assert client.routes.queues(TOPIC) == [0, 2]
            routes = await client.refresh_routes(force=True)
            assert routes.queues(TOPIC) == [0, 2]
            assert "broker-b" in cluster.nameserver.nameserver.brokers()
        finally:
            await client.close()

    loop.run(main())


def test_a_topic_whose_broker_lapsed_is_no_route_right_now_not_unknown(
    loop: Loop, cluster: ClusterEnv
) -> None:
    b = cluster.addresses[1]
    ns = cluster.nameserver.nameserver

    async def main() -> None:
        client = ClusterClient(cluster.bootstrap)
        try:
            await client.call(
                b,
                CreateTopicRequest(
                    name="only-b", queues=2, message_type="MIXED", config={}, hosted_queues=[]
                ),
                TopicInfoMsg,
            )
            registration = cluster.brokers[1]._registration
            assert registration._task is not None
            registration._task.cancel()  # broker-b goes silent (paused, cut off)
            await loop.wait_until(lambda: set(ns.brokers()) == {"broker-a"}, what="lapse")
            await loop.wait_until(lambda: [s.name for s in ns.status()] == ["broker-a"])
            routes = await client.refresh_routes(force=True)
            assert "only-b" in routes
            assert routes.queues("only-b") == []
            with pytest.raises(BrokerNotAvailable):
                await client.broker_for("only-b", 0)
            with pytest.raises(TopicNotFound):
                await client.broker_for("never-created", 0)
            await registration.start()
            await loop.wait_until(lambda: len(ns.brokers()) == 2, what="broker-b back")
            assert await client.broker_for("only-b", 1) == b
        finally:
            await client.close()

    loop.run(main())


def test_a_paused_name_server_extends_the_leases_instead_of_dropping_brokers(
    loop: Loop, cluster: ClusterEnv
) -> None:
    service = cluster.nameserver
    ns = service.nameserver

    async def main() -> None:
        for b in cluster.brokers:  # nobody heartbeats; the name server is "stopped"
            assert b._registration._task is not None
            b._registration._task.cancel()
        time.sleep(CLUSTER_TTL_MS / 1000 + 1.0)  # blocks this loop: the service's too
        service.check_pause()  # what the sweep or the next request does first
        assert set(ns.brokers()) == {"broker-a", "broker-b"}
        assert service.pauses == 1
        # Silent for a TTL after the pause: now they go.
        await loop.wait_until(lambda: ns.brokers() == {}, what="lapse after the pause")

    loop.run(main())


def test_a_broker_heartbeats_as_often_as_its_name_server_asks(loop: Loop, tmp_path: Path) -> None:
    ns = NameServerService(
        port=0, broker_ttl_ms=CLUSTER_TTL_MS, heartbeat_interval_ms=CLUSTER_HEARTBEAT_MS
    )
    bootstrap = loop.run(ns.start())
    # The broker's own settings are the defaults (a beat per second): slower than this
    # name server's TTL allows.
    broker = Broker(broker_config(tmp_path / "b", broker_name="b", name_servers=(bootstrap,)))
    try:
        loop.run(broker.start())

        async def main() -> None:
            await wait_until(lambda: "b" in ns.nameserver.brokers(), what="registration")
            assert broker._registration._interval_s == CLUSTER_HEARTBEAT_MS / 1000
            # Registered for three TTLs without lapsing once.
            until = time.monotonic() + 3 * CLUSTER_TTL_MS / 1000
            while time.monotonic() < until:
                assert "b" in ns.nameserver.brokers()
                await asyncio.sleep(0.05)

        loop.run(main())
    finally:
        loop.run(broker.stop())
        loop.run(ns.stop())


def test_a_restarted_name_server_gets_the_whole_topic_list_again(
    loop: Loop, tmp_path: Path
) -> None:
    """Beats carry only changes (cluster/topic_journal.py); a name server that restarts
    holds none of them, refuses the next delta, and is sent the whole list."""
    ns = NameServerService(
        port=0, broker_ttl_ms=CLUSTER_TTL_MS, heartbeat_interval_ms=CLUSTER_HEARTBEAT_MS
    )
    bootstrap = loop.run(ns.start())
    port = int(bootstrap.rsplit(":", 1)[1])
    broker = Broker(broker_config(tmp_path / "b", broker_name="b", name_servers=(bootstrap,)))
    try:
        loop.run(broker.start())

        async def create() -> None:
            async with aio.Admin(bootstrap) as admin:
                for name in ("t-a", "t-b", "t-c"):
                    await admin.create_topic(name, 2)
                await admin.delete_topic("t-b")

        loop.run(create())
        assert [r.topic for r in ns.nameserver.routes()] == ["t-a", "t-c"]
        loop.run(ns.stop())
        ns = NameServerService(
            port=port, broker_ttl_ms=CLUSTER_TTL_MS, heartbeat_interval_ms=CLUSTER_HEARTBEAT_MS
        )
        loop.run(ns.start())
        restarted = ns.nameserver

        async def relearned() -> None:
            await wait_until(
                lambda: [r.topic for r in restarted.routes()] == ["t-a", "t-c"],
                what="the whole topic list at the restarted name server",
            )
            async with aio.Admin(bootstrap) as admin:  # and deltas work again after it
                await admin.create_topic("t-d", 1)
            assert [r.topic for r in restarted.routes()] == ["t-a", "t-c", "t-d"]

        loop.run(relearned())
    finally:
        loop.run(broker.stop())
        loop.run(ns.stop())
