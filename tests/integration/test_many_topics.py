"""Topics in bulk (issue 22, "a hundred thousand topics"): `Admin.create_topics` and
`tidemq topic create --from-file`, each broker creating a batch in one transaction and
registering it with its name servers once; refusals per topic; topics spread over the
brokers as one by one; topics that survive kill -9 of the broker right after the batch
was acknowledged (their queue directories are made lazily, their entries synced at the
next checkpoint, so this checks that nothing acknowledged depends on them)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from tests.integration.test_cli import cli, ok
from tests.support.server_process import server_process

import tidemq
from tidemq import aio
from tidemq.client.cluster import ClusterClient
from tidemq.core import limits
from tidemq.core.errors import (
    ConfigError,
    InvalidRequest,
    InvalidTopicName,
    TopicAlreadyExists,
)
from tidemq.protocol.commands import (
    GetRoutesRequest,
    GetRoutesResponse,
    ListTopicsRequest,
    ListTopicsResponse,
)

if TYPE_CHECKING:
    from tests.integration.conftest import BrokerEnv, ClusterEnv, Loop, ThreadedBroker

pytestmark = pytest.mark.timeout(180)


def test_create_topics_in_a_batch_with_refusals_per_topic(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        async with aio.Admin(broker.address) as admin:
            await admin.create_topic("exists", 1)
            made = await admin.create_topics(
                [tidemq.NewTopic(f"bulk-{i}", 1 + i % 3) for i in range(300)]
            )
            assert [(t.name, t.queues) for t in made[:3]] == [
                ("bulk-0", 1),
                ("bulk-1", 2),
                ("bulk-2", 3),
            ]
            listed = {t.name for t in await admin.list_topics()}
            assert {f"bulk-{i}" for i in range(300)} <= listed
            # Refusals do not stop the others; they are raised together at the end.
            batch = [
                tidemq.NewTopic("fresh-1", 2),
                tidemq.NewTopic("exists", 1),
                tidemq.NewTopic("fresh-2", 1, config={"retention.ms": "-5"}),
                tidemq.NewTopic("fresh-3", 1),
            ]
            with pytest.raises(TopicAlreadyExists, match=r"2 topic\(s\) not created \(2 created\)"):
                await admin.create_topics(batch)
            listed = {t.name for t in await admin.list_topics()}
            assert {"fresh-1", "fresh-3"} <= listed
            assert "fresh-2" not in listed
            # exist_ok skips what exists; the rest is created.
            again = await admin.create_topics(
                [tidemq.NewTopic("exists"), tidemq.NewTopic("fresh-4")], exist_ok=True
            )
            assert [t.name for t in again] == ["fresh-4"]
            with pytest.raises(ConfigError, match="named more than once: twice"):
                await admin.create_topics([tidemq.NewTopic("twice"), tidemq.NewTopic("twice")])
            with pytest.raises(InvalidTopicName):
                await admin.create_topics([tidemq.NewTopic("bad name")])
        # A producer that never saw them sends to the new topics at once.
        async with aio.Producer(broker.address) as producer:
            for i in (0, 150, 299):
                receipt = await producer.send(f"bulk-{i}", b"v", queue=0)
                assert receipt.offset == 0

    loop.run(main())


def test_a_batch_spreads_queues_over_the_brokers(loop: Loop, cluster: ClusterEnv) -> None:
    a, b = cluster.addresses

    async def main() -> None:
        async with aio.Admin(cluster.bootstrap) as admin:
            await admin.create_topics([tidemq.NewTopic(f"s-{i}", 4) for i in range(20)])
            info = await admin.describe_topic("s-7")
            assert [(q.queue, q.broker) for q in info.queue_info] == [
                (0, a),
                (1, b),
                (2, a),
                (3, b),
            ]
        async with aio.Producer(cluster.bootstrap) as producer:
            for q in range(4):
                await producer.send("s-19", b"v", queue=q)

    loop.run(main())


def test_topic_create_from_file(sync_broker: ThreadedBroker, tmp_path: Path) -> None:
    b = sync_broker.address
    listing = tmp_path / "topics.txt"
    listing.write_text("# name [queues]\nf-one 3\n\nf-two\nf-three 1\n")
    out = ok("topic", "create", "--from-file", str(listing), "--queues", "2", "-n", b)
    assert out.stdout.strip() == "Created 3 topic(s)."
    with tidemq.Admin(b) as admin:
        queues = {t.name: t.queues for t in admin.list_topics()}
    assert {n: queues.get(n) for n in ("f-one", "f-two", "f-three")} == {
        "f-one": 3,
        "f-two": 2,
        "f-three": 1,
    }
    again = ok("topic", "create", "--from-file", str(listing), "--if-not-exists", "-n", b)
    assert again.stdout.strip() == "Created 0 topic(s) (3 existed already)."
    listing.write_text("f-four 2 extra\n")
    bad = cli("topic", "create", "--from-file", str(listing), "-n", b)
    assert bad.code == 2
    assert "line 1: 'f-four 2 extra' is not 'NAME [QUEUES]'" in bad.stderr


def test_topics_of_an_acknowledged_batch_survive_kill9(tmp_path: Path) -> None:
    names = [f"k9-{i}" for i in range(500)]
    with server_process(tmp_path) as server:
        with tidemq.Admin(server.address) as admin:
            admin.create_topics([tidemq.NewTopic(n, 2) for n in names])
        with tidemq.Producer(server.address) as producer:
            producer.send("k9-7", b"first", queue=1)  # one queue with a directory
        server.proc.send_signal(signal.SIGKILL)
        server.proc.wait(30)
    with server_process(tmp_path) as server:
        with tidemq.Admin(server.address) as admin:
            assert set(names) <= {t.name for t in admin.list_topics()}
        with tidemq.Producer(server.address) as producer:
            assert producer.send("k9-499", b"after", queue=0).offset == 0
        with tidemq.StreamConsumer(server.address, start="earliest") as consumer:
            consumer.assign([("k9-7", 1)])
            got = []
            for _ in range(20):
                got += consumer.poll(500)
                if got:
                    break
            assert [m.value for m in got] == [b"first"]


def test_route_refreshes_fetch_only_what_changed(loop: Loop, cluster: ClusterEnv) -> None:
    """A client's periodic refresh of every route sends the token of the routes it holds:
    while nothing changed the name server answers "unchanged" (no routes on the wire,
    the client keeps its table); a topic created elsewhere changes the token."""

    async def main() -> None:
        async with aio.Admin(cluster.bootstrap) as admin:
            await admin.create_topics([tidemq.NewTopic(f"r{i}", 1) for i in range(50)])
        watcher = ClusterClient(cluster.bootstrap)
        try:
            first = await watcher.refresh_routes(force=True)
            assert {f"r{i}" for i in range(50)} <= set(first.topics())
            asked = GetRoutesRequest(known=0)
            whole = await watcher.call(cluster.bootstrap, asked, GetRoutesResponse)
            assert not whole.unchanged
            assert whole.generation > 0
            asked = GetRoutesRequest(known=whole.generation)
            same = await watcher.call(cluster.bootstrap, asked, GetRoutesResponse)
            assert same.unchanged
            assert same.routes == []
            assert same.brokers == whole.brokers
            assert await watcher.refresh_routes(force=True) is first  # kept, not rebuilt
            async with aio.Admin(cluster.bootstrap) as admin:
                await admin.create_topic("later", 1)
            newer = await watcher.refresh_routes(force=True)
            assert newer is not first
            assert "later" in newer
            assert await watcher.refresh_routes(force=True) is newer
        finally:
            await watcher.close()

    loop.run(main())


def test_topics_are_listed_a_page_at_a_time(
    loop: Loop, cluster: ClusterEnv, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each broker answers at most MAX_LIST_TOPICS topics per request (16 here); the admin
    client pages through every broker and merges by name, with a prefix, a start after a
    name, a limit, and a filter applied before the limit counts."""
    monkeypatch.setattr(limits, "MAX_LIST_TOPICS", 16)
    names = sorted([f"pg-{i:03d}" for i in range(70)] + [f"other-{i}" for i in range(5)])

    async def main() -> None:
        async with aio.Admin(cluster.bootstrap) as admin:
            await admin.create_topics([tidemq.NewTopic(n, 1 + len(n) % 2) for n in names])
            listed = [t.name for t in await admin.list_topics()]
            assert [n for n in listed if n in names] == names  # 75 topics, 16 a page
            pg = [n for n in names if n.startswith("pg-")]
            assert [t.name for t in await admin.list_topics("pg-")] == pg
            first = [t.name for t in await admin.list_topics("pg-", limit=20)]
            assert first == pg[:20]
            rest = await admin.list_topics("pg-", after=first[-1])
            assert [t.name for t in rest] == pg[20:]
            odd = await admin.list_topics("pg-", limit=5, keep=lambda n: int(n[3:]) % 2 == 1)
            assert [t.name for t in odd] == ["pg-001", "pg-003", "pg-005", "pg-007", "pg-009"]
            assert await admin.list_topics("pg-", limit=0) == []
            with pytest.raises(ValueError, match="limit must be >= 0"):
                await admin.list_topics(limit=-1)
        conn = await ClusterClient(cluster.addresses[0]).connection(cluster.addresses[0])
        try:
            with pytest.raises(InvalidRequest, match="limit must be 0-16"):
                await conn.request(ListTopicsRequest(limit=17), ListTopicsResponse, timeout_s=10)
        finally:
            conn.close()

    loop.run(main())


def test_topic_list_command_pages(sync_broker: ThreadedBroker) -> None:
    with tidemq.Admin(sync_broker.address) as admin:
        admin.create_topics([tidemq.NewTopic(f"cli-{i}", 1) for i in range(12)])
    out = ok("topic", "list", "--prefix", "cli-1", "--bootstrap", sync_broker.address).stdout
    assert [line.split()[0] for line in out.splitlines()[2:]] == ["cli-1", "cli-10", "cli-11"]
    out = ok("topic", "list", "--limit", "2", "--bootstrap", sync_broker.address).stdout
    assert [line.split()[0] for line in out.splitlines()[2:]] == ["cli-0", "cli-1"]
