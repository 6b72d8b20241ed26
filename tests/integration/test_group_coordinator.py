"""Each group's coordinator is the broker that rendezvous hashing of its name picks among
the live brokers (ADR 17): groups spread over the brokers, a broker that joins takes its
groups with their committed offsets (pulled from the other brokers on first use), a
coordinator that stops hands its groups back to the brokers that had them, and a broker
that cannot be reached during a pull is skipped, never waited for without end."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.integration.conftest import CLUSTER_HEARTBEAT_MS, CLUSTER_TTL_MS, broker_config

from tidemq import aio
from tidemq.broker.broker import Broker
from tidemq.client.cluster import ClientConfig, ClusterClient
from tidemq.cluster.group_coordinator import coordinator_name, weight
from tidemq.protocol.commands import (
    FetchOffsetsRequest,
    FetchOffsetsResponse,
    ListGroupsRequest,
    ListGroupsResponse,
)

if TYPE_CHECKING:
    from tests.integration.conftest import ClusterEnv, Loop

pytestmark = pytest.mark.timeout(120)

TOPIC = "moves"
#: Clients that see a broker join or leave within a fraction of a second.
FAST_ROUTES = ClientConfig(route_refresh_ms=200, route_refresh_degraded_ms=200)


def _group_where(prefix: str, ranking: list[str], among: list[str] | None = None) -> str:
    """A group name whose brokers by weight, highest first, are `ranking`; with `among`,
    one whose highest-weight broker among those names is `ranking[0]` as well."""
    for i in range(10_000):
        group = f"{prefix}-{i}"
        ranked = sorted(ranking, key=lambda n: weight(n, group), reverse=True)
        if ranked == ranking and (among is None or coordinator_name(group, among) == ranking[0]):
            return group
    raise AssertionError(f"no group name ranks {ranking}")


def _add_broker(loop: Loop, env: ClusterEnv, data_dir: Path, name: str) -> str:
    """Start broker `name` in `env` (stopped with the others) and wait for its
    registration; its address."""
    config = broker_config(
        data_dir,
        broker_name=name,
        name_servers=(env.bootstrap,),
        broker_heartbeat_interval_ms=CLUSTER_HEARTBEAT_MS,
        broker_ttl_ms=CLUSTER_TTL_MS,
    )
    broker = Broker(config)
    env.brokers.append(broker)
    address = loop.run(broker.start())
    live = env.nameserver.nameserver

    async def registered() -> None:
        await loop.wait_until(lambda: name in live.brokers(), what=f"{name} to register")

    loop.run(registered())
    return address


async def _local_offsets(address: str, group: str) -> dict[tuple[str, int], int]:
    """The group's committed offsets in the store of the broker at `address` alone."""
    client = ClusterClient(address)
    try:
        answer = await client.call(
            address, FetchOffsetsRequest(group=group, local_only=True), FetchOffsetsResponse
        )
    finally:
        await client.close()
    assert len(answer.committed_ms) == len(answer.offsets)
    assert all(ms > 0 for ms in answer.committed_ms)
    return {(o.topic, o.queue): o.offset for o in answer.offsets}


async def _fill(bootstrap: str, queues: int, count: int, start: int = 0) -> None:
    async with aio.Producer(bootstrap) as producer:
        for i in range(start, start + count):
            await producer.send(TOPIC, b"%d" % i, queue=i % queues)


async def _consume(
    consumer: aio.GroupConsumer[bytes], count: int, *, rejoined: bool = False
) -> list[int]:
    """Poll until `count` messages came (and with `rejoined`, until the member has
    rejoined under a new member id: its group moved), or 20 s passed; then once more for
    strays; commit them."""
    got: list[int] = []
    first_id = consumer.member_id
    loop = asyncio.get_running_loop()
    deadline = loop.time() + 20

    def done() -> bool:
        return len(got) >= count and not (rejoined and consumer.member_id == first_id)

    while not done() and loop.time() < deadline:
        got.extend(int(m.value or b"") for m in await consumer.poll(200))
    got.extend(int(m.value or b"") for m in await consumer.poll(200))
    await consumer.commit()
    return sorted(got)


async def _read_as(bootstrap: str, group: str, count: int) -> list[int]:
    """A new member of `group` (from the earliest offset where the group never
    committed) reads and commits; what it got."""
    consumer = aio.GroupConsumer(
        bootstrap, group, [TOPIC], start="earliest", client_config=FAST_ROUTES
    )
    try:
        return await _consume(consumer, count)
    finally:
        await consumer.close()


def test_groups_with_different_names_land_on_different_brokers(
    loop: Loop, cluster3: ClusterEnv
) -> None:
    names = ["broker-a", "broker-b", "broker-c"]
    by_name = dict(zip(names, cluster3.addresses, strict=True))
    groups = {name: _group_where("spread", [name], among=names) for name in names}

    async def main() -> None:
        async with aio.Admin(cluster3.bootstrap) as admin:
            await admin.create_topic(TOPIC, 3)
        await _fill(cluster3.bootstrap, 3, 30)
        for group in groups.values():
            assert await _read_as(cluster3.bootstrap, group, 30) == list(range(30))
        for name, group in groups.items():
            address = by_name[name]
            assert coordinator_name(group, names) == name
            assert await _local_offsets(address, group) == {(TOPIC, q): 10 for q in range(3)}
            client = ClusterClient(address)
            try:
                listed = await client.call(address, ListGroupsRequest(), ListGroupsResponse)
            finally:
                await client.close()
            # Each broker holds its own group and none of the others.
            assert set(listed.groups) & set(groups.values()) == {group}
        async with aio.Admin(cluster3.bootstrap) as admin:
            assert set(groups.values()) <= set(await admin.list_groups())
            described = await admin.describe_group(groups["broker-b"])
            assert [(o.queue, o.committed, o.lag) for o in described.offsets] == [
                (q, 10, 0) for q in range(3)
            ]

    loop.run(main())


def test_a_new_broker_takes_its_groups_with_their_offsets(
    loop: Loop, cluster: ClusterEnv, tmp_path: Path
) -> None:
    """broker-c joins and outranks the others for two groups: one with no member
    running, whose next member starts at the offsets broker-c pulled from broker-a, and
    one whose running member follows the group there and reads every new message once.
    A group that does not rank broker-c first stays where it was."""
    moving = _group_where("moving", ["broker-c", "broker-a", "broker-b"])
    idle = _group_where("idle", ["broker-c", "broker-a", "broker-b"])
    staying = _group_where("staying", ["broker-a", "broker-c", "broker-b"])
    a = cluster.addresses[0]

    async def before() -> aio.GroupConsumer[bytes]:
        async with aio.Admin(cluster.bootstrap) as admin:
            await admin.create_topic(TOPIC, 2)
        await _fill(cluster.bootstrap, 2, 20)
        assert await _read_as(cluster.bootstrap, staying, 20) == list(range(20))
        assert await _read_as(cluster.bootstrap, idle, 20) == list(range(20))
        member = aio.GroupConsumer(
            cluster.bootstrap, moving, [TOPIC], start="earliest", client_config=FAST_ROUTES
        )
        assert await _consume(member, 20) == list(range(20))
        assert await _local_offsets(a, moving) == {(TOPIC, 0): 10, (TOPIC, 1): 10}
        return member

    member = loop.run(before())
    c = _add_broker(loop, cluster, tmp_path / "broker-c", "broker-c")

    async def after() -> None:
        try:
            await _fill(cluster.bootstrap, 2, 10, start=20)
            # The running member: through the move (it rejoins at broker-c, keeping its
            # queues and positions), every new message once, no old one.
            assert await _consume(member, 10, rejoined=True) == list(range(20, 30))
        finally:
            await member.close()
        assert await _local_offsets(c, moving) == {(TOPIC, 0): 15, (TOPIC, 1): 15}
        # The idle group's offsets were never committed on broker-c: pulled on its join.
        assert await _read_as(cluster.bootstrap, idle, 10) == list(range(20, 30))
        assert await _local_offsets(c, idle) == {(TOPIC, 0): 15, (TOPIC, 1): 15}
        # A new member of the moved group starts at the offsets broker-c holds.
        await _fill(cluster.bootstrap, 2, 10, start=30)
        assert await _read_as(cluster.bootstrap, moving, 10) == list(range(30, 40))
        # The group that stays: its offsets never left broker-a; broker-c has none.
        assert await _read_as(cluster.bootstrap, staying, 20) == list(range(20, 40))
        assert await _local_offsets(a, staying) == {(TOPIC, 0): 20, (TOPIC, 1): 20}
        assert await _local_offsets(c, staying) == {}

    loop.run(after())


def test_a_stopped_coordinators_groups_go_back_with_the_offsets_there(
    loop: Loop, cluster: ClusterEnv, tmp_path: Path
) -> None:
    """The group's offsets start on broker-a; broker-c joins and takes the group (a
    fetch of the offsets pulls them). When broker-c stops, the group goes back to
    broker-a, which has the same offsets; when broker-c returns, the group comes back to
    it with the offsets it had, older than broker-a's by then: messages are read again,
    never skipped (the documented rule)."""
    group = _group_where("returning", ["broker-c", "broker-a", "broker-b"])
    a = cluster.addresses[0]

    async def start() -> None:
        async with aio.Admin(cluster.bootstrap) as admin:
            await admin.create_topic(TOPIC, 2)
        await _fill(cluster.bootstrap, 2, 10)
        assert await _read_as(cluster.bootstrap, group, 10) == list(range(10))

    loop.run(start())
    c = _add_broker(loop, cluster, tmp_path / "broker-c", "broker-c")

    async def described() -> list[tuple[int, int]]:
        async with aio.Admin(cluster.bootstrap) as admin:
            found = await admin.describe_group(group)
        return [(o.queue, o.committed) for o in found.offsets]

    assert loop.run(described()) == [(0, 5), (1, 5)]  # broker-c pulled them from broker-a
    assert loop.run(_local_offsets(c, group)) == {(TOPIC, 0): 5, (TOPIC, 1): 5}

    broker_c = cluster.brokers[-1]
    loop.run(broker_c.stop())  # it unregisters: the group is broker-a's again at once
    loop.run(_fill(cluster.bootstrap, 2, 10, start=10))
    assert loop.run(_read_as(cluster.bootstrap, group, 10)) == list(range(10, 20))
    assert loop.run(_local_offsets(a, group)) == {(TOPIC, 0): 10, (TOPIC, 1): 10}

    back = Broker(broker_c.config)
    cluster.brokers.append(back)
    loop.run(back.start())
    live = cluster.nameserver.nameserver

    async def returned() -> None:
        await loop.wait_until(lambda: "broker-c" in live.brokers(), what="broker-c back")

    loop.run(returned())
    # broker-c holds offsets 5 and 5 from before: it does not pull, and the group reads
    # 10..19 again before the new messages.
    loop.run(_fill(cluster.bootstrap, 2, 10, start=20))
    assert loop.run(_read_as(cluster.bootstrap, group, 20)) == list(range(10, 30))


def test_unreachable_brokers_are_skipped_in_a_pull(
    loop: Loop, cluster: ClusterEnv, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Two listed brokers do not answer: one refuses connections, one accepts and never
    replies. The pull takes the offsets from the others, logs each skipped broker, and
    is over within the pull timeout."""
    every = ["broker-a", "broker-b", "broker-c", "ghost-1", "ghost-2"]
    group = _group_where("ghosted", ["broker-c", "broker-a", "broker-b"], among=every)
    held: list[asyncio.StreamWriter] = []

    async def silent(_: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)  # accepted, never answered

    async def start() -> tuple[asyncio.Server, str]:
        async with aio.Admin(cluster.bootstrap) as admin:
            await admin.create_topic(TOPIC, 2)
        await _fill(cluster.bootstrap, 2, 10)
        assert await _read_as(cluster.bootstrap, group, 10) == list(range(10))
        refused = await asyncio.start_server(silent, "127.0.0.1", 0)
        refused_port = refused.sockets[0].getsockname()[1]
        refused.close()
        await refused.wait_closed()
        return await asyncio.start_server(silent, "127.0.0.1", 0), f"127.0.0.1:{refused_port}"

    server, refused_address = loop.run(start())
    silent_address = f"127.0.0.1:{server.sockets[0].getsockname()[1]}"
    c = _add_broker(loop, cluster, tmp_path / "broker-c", "broker-c")
    live = cluster.nameserver.nameserver

    async def pull() -> float:
        await _fill(cluster.bootstrap, 2, 10, start=10)
        # Listed (and live for the TTL) just before the group's first request.
        live.register("ghost-1", refused_address, [])
        live.register("ghost-2", silent_address, [])
        started = asyncio.get_running_loop().time()
        assert await _read_as(cluster.bootstrap, group, 10) == list(range(10, 20))
        return asyncio.get_running_loop().time() - started

    try:
        with caplog.at_level(logging.WARNING, logger="tidemq.broker.offset_pull"):
            took_s = loop.run(pull())
    finally:
        for writer in held:
            writer.close()
        server.close()
    assert loop.run(_local_offsets(c, group)) == {(TOPIC, 0): 10, (TOPIC, 1): 10}
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert any("ghost-1" in m for m in skipped), skipped
    assert any("ghost-2" in m for m in skipped), skipped
    assert took_s < 15, took_s  # the 5 s pull timeout, plus the member's join and reads
