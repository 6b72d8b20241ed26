"""Consumer groups against a real broker: where a new group starts, commits and restarts,
generation fencing of commits, rejoining after expiry, and members joining and leaving
while a producer is sending."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import pytest

import tidemq
from tidemq import aio
from tidemq.client.cluster import ClusterClient
from tidemq.core.errors import InvalidRequest, StaleGeneration
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.commands import (
    CommitOffsetsRequest,
    CommitOffsetsResponse,
    Empty,
    FetchOffsetsRequest,
    FetchOffsetsResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    LeaveGroupRequest,
    QueueOffset,
)

if TYPE_CHECKING:
    from tests.integration.conftest import BrokerEnv, Loop, ThreadedBroker

pytestmark = pytest.mark.timeout(120)

TOPIC = "events"


async def _setup(address: str, queues: int) -> None:
    async with aio.Admin(address) as admin:
        await admin.create_topic(TOPIC, queues)


async def _send(address: str, values: list[bytes]) -> list[aio.Receipt]:
    async with aio.Producer(address) as producer:
        futures = [await producer.send_nowait(TOPIC, v) for v in values]
        await producer.flush()
        return [f.result() for f in futures]


async def _drain(
    consumer: aio.GroupConsumer, count: int, *, timeout_s: float = 20.0
) -> list[aio.Message]:
    """Poll until `count` messages arrived, then once more briefly to catch extra ones."""
    out: list[aio.Message] = []
    deadline = time.monotonic() + timeout_s
    while len(out) < count:
        assert time.monotonic() < deadline, f"got {len(out)} of {count} messages"
        out.extend(await consumer.poll(300))
    out.extend(await consumer.poll(300))
    return out


# ------------------------------------------------------------------ where a group starts


def test_new_group_start_is_honoured_every_time(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _setup(broker.address, 3)
        await _send(broker.address, [b"old-%d" % i for i in range(9)])
        await asyncio.sleep(0.02)  # store times of the old batches lie before the cut
        cut_ms = time.time_ns() // 1_000_000
        await asyncio.sleep(0.02)
        await _send(broker.address, [b"mid-%d" % i for i in range(6)])

        before = [b"old-%d" % i for i in range(9)]
        after = [b"mid-%d" % i for i in range(6)]
        for attempt in range(2):  # the same rule, for every new group
            earliest = aio.GroupConsumer(broker.address, f"e{attempt}", [TOPIC], start="earliest")
            try:
                got = await _drain(earliest, len(before) + len(after))
                assert sorted(m.value or b"" for m in got) == sorted(before + after)
            finally:
                await earliest.close()

            by_time = aio.GroupConsumer(broker.address, f"t{attempt}", [TOPIC], start=cut_ms / 1000)
            try:
                got = await _drain(by_time, len(after))
                assert sorted(m.value or b"" for m in got) == sorted(after)
            finally:
                await by_time.close()

            latest = aio.GroupConsumer(broker.address, f"l{attempt}", [TOPIC], start="latest")
            try:
                assert await latest.poll(300) == []  # joined and positioned at the end
                assert len(latest.assignment()) == 3
                new = [b"new-%d-%d" % (attempt, i) for i in range(3)]
                receipts = await _send(broker.address, new)
                after += new
                got = await _drain(latest, 3)
                assert sorted(m.value or b"" for m in got) == new
                assert {(m.queue, m.offset) for m in got} == {(r.queue, r.offset) for r in receipts}
            finally:
                await latest.close()

    loop.run(main())


def test_group_without_commits_restarts_where_start_says(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _setup(broker.address, 2)
        first = aio.GroupConsumer(broker.address, "lazy", [TOPIC], start="latest")
        try:
            assert await first.poll(300) == []
        finally:
            await first.close()
        await _send(broker.address, [b"while-away-%d" % i for i in range(4)])
        # Still a new group (nothing committed): "latest" again, so the messages sent while
        # no member was running are skipped, exactly as for the first member.
        again = aio.GroupConsumer(broker.address, "lazy", [TOPIC], start="latest")
        try:
            assert await again.poll(500) == []
            await _send(broker.address, [b"fresh"])
            got = await _drain(again, 1)
            assert [m.value for m in got] == [b"fresh"]
        finally:
            await again.close()

    loop.run(main())


# ------------------------------------------------------------------ commits


def test_commit_and_restart_continue_after_committed_offsets(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _setup(broker.address, 1)
        await _send(broker.address, [b"%d" % i for i in range(20)])

        manual = aio.GroupConsumer(
            broker.address, "g", [TOPIC], start="earliest", auto_commit=False
        )
        try:
            got = await _drain(manual, 20)
            assert [m.offset for m in got] == list(range(20))
            await manual.commit({(TOPIC, 0): 8})  # processed 0..7 only
        finally:
            await manual.close()  # auto_commit=False: close commits nothing more

        auto = aio.GroupConsumer(broker.address, "g", [TOPIC], start="latest")
        try:
            got = await _drain(auto, 12)
            # Resumes at the committed offset (not at "latest", the group is not new).
            assert [m.offset for m in got] == list(range(8, 20))
        finally:
            await auto.close()  # auto commit: commits 20 on close

        async with aio.Admin(broker.address) as admin:
            described = await admin.describe_group("g")
        assert [(o.queue, o.committed, o.lag) for o in described.offsets] == [(0, 20, 0)]

        await _send(broker.address, [b"%d" % i for i in range(20, 25)])
        resumed = aio.GroupConsumer(broker.address, "g", [TOPIC], start="earliest")
        try:
            got = await _drain(resumed, 5)
            assert [m.offset for m in got] == list(range(20, 25))
            await resumed.commit()  # explicit commit of everything polled
        finally:
            await resumed.close()
        async with aio.Admin(broker.address) as admin:
            described = await admin.describe_group("g")
        assert [(o.committed, o.lag) for o in described.offsets] == [(25, 0)]

    loop.run(main())


def test_commits_are_fenced_by_generation(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _setup(broker.address, 4)
        address = broker.address
        # A slow heartbeat: `a` does not learn of the rebalance `b` causes.
        a = aio.GroupConsumer(address, "fenced", [TOPIC], heartbeat_interval_ms=60_000)
        b = aio.GroupConsumer(address, "fenced", [TOPIC], heartbeat_interval_ms=60_000)
        client = ClusterClient(address)
        try:
            await a.poll(100)
            assert (a.generation, len(a.assignment())) == (1, 4)
            await b.poll(100)
            assert b.generation == 2
            assert a.generation == 1  # stale view: still thinks it owns all four queues

            # Through the client: the commit carries generation 1 and is refused.
            with pytest.raises(StaleGeneration):
                await a.commit({(TOPIC, q): 1 for q in range(4)})

            mine = set(b.assignment())
            theirs = sorted({(TOPIC, q) for q in range(4)} - mine)

            async def commit(member: str, generation: int, queue: int, offset: int = 1) -> None:
                request = CommitOffsetsRequest(
                    group="fenced",
                    offsets=[QueueOffset(topic=TOPIC, queue=queue, offset=offset)],
                    member_id=member,
                    generation=generation,
                )
                await client.call(address, request, CommitOffsetsResponse)

            # Raw requests: only the current generation, only the queues it assigns.
            with pytest.raises(StaleGeneration):
                await commit(a.member_id, 1, theirs[0][1])
            with pytest.raises(StaleGeneration):
                await commit("nobody", 2, theirs[0][1])
            with pytest.raises(StaleGeneration):
                await commit("", -1, theirs[0][1])  # outside any generation: group active
            with pytest.raises(InvalidRequest):
                await commit("", 2, theirs[0][1])
            with pytest.raises(InvalidRequest, match="not assigned"):
                await commit(b.member_id, 2, theirs[0][1])  # current, but not b's queue
            with pytest.raises(InvalidRequest, match="not assigned"):
                await commit(a.member_id, 2, sorted(mine)[0][1])
            await commit(a.member_id, 2, theirs[0][1], offset=0)
            await commit(b.member_id, 2, sorted(mine)[0][1], offset=0)

            # A rejoin with an unchanged subscription is not a rebalance: it answers the
            # current generation and the member's share of it.
            rejoined = await client.call(
                address,
                JoinGroupRequest(group="fenced", topics=[TOPIC], member_id=a.member_id),
                JoinGroupResponse,
            )
            assert rejoined.generation == 2
            assert sorted((t, q) for t, q in rejoined.assignment) == theirs
        finally:
            await a.close()
            await b.close()
            await client.close()

        # With no member left, a commit from outside any generation is accepted.
        client = ClusterClient(address)
        try:
            request = CommitOffsetsRequest(
                group="fenced", offsets=[QueueOffset(topic=TOPIC, queue=3, offset=0)]
            )
            await client.call(address, request, CommitOffsetsResponse)
            committed = await client.call(
                address, FetchOffsetsRequest(group="fenced"), FetchOffsetsResponse
            )
            assert {(o.queue, o.offset) for o in committed.offsets} >= {(3, 0)}
        finally:
            await client.close()

    loop.run(main())


def test_member_expired_by_the_coordinator_rejoins(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _setup(broker.address, 2)
        consumer = aio.GroupConsumer(
            broker.address, "expiring", [TOPIC], start="earliest", heartbeat_interval_ms=100
        )
        try:
            await consumer.poll(100)
            old_member, old_generation = consumer.member_id, consumer.generation
            # What the coordinator's sweep does when a session lapses (a long pause in the
            # consumer's process): the member is gone, its id is never valid again.
            broker.broker._coordinator.leave("expiring", old_member)
            deadline = time.monotonic() + 20
            while consumer.member_id == old_member:
                assert time.monotonic() < deadline, "the consumer never rejoined"
                await consumer.poll(100)
            assert consumer.generation > old_generation
            assert len(consumer.assignment()) == 2
            await _send(broker.address, [b"after-rejoin"])
            got = await _drain(consumer, 1)
            assert [m.value for m in got] == [b"after-rejoin"]
        finally:
            await consumer.close()

    loop.run(main())


# ------------------------------------------------------------------ rebalancing under load


@dataclass
class _CommitSeen:
    member_id: str
    generation: int
    current_generation: int
    #: (queue, offset, owner of the queue when the commit was checked)
    offsets: tuple[tuple[int, int, str | None], ...]
    accepted: bool


def _record_commits(env: BrokerEnv, group: str, log: list[_CommitSeen]) -> None:
    """Wrap the broker's commit handler to log every commit with the coordinator's view at
    the moment it is checked (the handler checks before its first await)."""
    broker = env.broker
    original = broker._handlers[RequestCode.COMMIT_OFFSETS]

    async def recording(header: Any, body: bytes | memoryview) -> Any:
        assert isinstance(header, CommitOffsetsRequest)
        coordinator = broker._coordinator
        current = coordinator.describe(header.group).generation
        offsets = tuple(
            (o.queue, o.offset, coordinator.assignment_owner(header.group, o.topic, o.queue))
            for o in header.offsets
        )
        # Logged in arrival order, marked accepted once answered: a commit waits for its
        # record to be durable, so a later refused one can be answered first.
        seen = _CommitSeen(header.member_id, header.generation, current, offsets, False)
        if header.group == group:
            log.append(seen)
        result = await original(header, body)
        seen.accepted = True
        return result

    broker._handlers[RequestCode.COMMIT_OFFSETS] = recording


def test_members_join_and_leave_under_load(loop: Loop, broker: BrokerEnv) -> None:
    total, queues, group = 3_000, 6, "busy"
    commits: list[_CommitSeen] = []
    #: member id -> (queue, offset) of every message handed to that member
    handed: dict[str, set[tuple[int, int]]] = defaultdict(set)
    generations: dict[str, list[int]] = defaultdict(list)
    receipts: list[aio.Receipt] = []

    async def member(name: str, stop: asyncio.Event) -> None:
        consumer = aio.GroupConsumer(
            broker.address,
            group,
            [TOPIC],
            start="earliest",
            heartbeat_interval_ms=100,
            client_id=name,
        )
        try:
            while not stop.is_set():
                messages = await consumer.poll(200)
                generations[name].append(consumer.generation)
                for m in messages:
                    handed[consumer.member_id].add((m.queue, m.offset))
        finally:
            await consumer.close()

    async def produce() -> None:
        async with aio.Producer(broker.address) as producer:
            for start in range(0, total, 25):
                futures = [
                    await producer.send_nowait(TOPIC, b"%d" % i)
                    for i in range(start, min(start + 25, total))
                ]
                receipts.extend(await asyncio.gather(*futures))
                await asyncio.sleep(0.005)

    def processed() -> set[tuple[int, int]]:
        return {qo for got in handed.values() for qo in got}

    async def main() -> None:
        await _setup(broker.address, queues)
        _record_commits(broker, group, commits)
        stops = {name: asyncio.Event() for name in "abc"}
        producer = asyncio.create_task(produce())
        members = {"a": asyncio.create_task(member("a", stops["a"]))}
        for sent, action in ((500, "+b"), (1_000, "+c"), (1_500, "-a"), (2_000, "-b")):
            await loop.wait_until(lambda n=sent: len(receipts) >= n, what=f"{sent} sent")  # type: ignore[misc]
            name = action[1]
            if action[0] == "+":
                members[name] = asyncio.create_task(member(name, stops[name]))
            else:
                stops[name].set()
                await members.pop(name)
        await producer
        assert len(receipts) == total

        expected = {(r.queue, r.offset) for r in receipts}
        await loop.wait_until(
            lambda: expected <= processed(), timeout_s=40, what="every message processed"
        )

        async with aio.Admin(broker.address) as admin:

            async def lag() -> int:
                described = await admin.describe_group(group)
                return sum(o.lag for o in described.offsets)

            deadline = time.monotonic() + 30
            while await lag():  # c commits everything it polled on its next poll
                assert time.monotonic() < deadline, "the group never caught up"
                await asyncio.sleep(0.1)
            generation_before_last_leave = (await admin.describe_group(group)).generation
        stops["c"].set()
        await members.pop("c")

        # Every message was processed (at least once).
        assert expected <= processed()
        assert len(expected) == total
        # Join a, b, c and leave a, b: five membership changes, five generations at least.
        assert generation_before_last_leave >= 5
        for seen in generations.values():
            assert seen == sorted(seen), "a member's generation went down"

        accepted = [c for c in commits if c.accepted]
        assert accepted, "no commit was accepted"
        current = [c.current_generation for c in commits]
        assert current == sorted(current), "the group's generation went down"
        for c in accepted:
            # Accepted only from the current generation, for queues that generation gave
            # the member, at offsets right after messages handed to that member.
            assert c.generation == c.current_generation, c
            for queue, offset, owner in c.offsets:
                assert owner == c.member_id, c
                assert (queue, offset - 1) in handed[c.member_id], c
        for c in commits:
            if c.generation != c.current_generation:
                assert not c.accepted, c

    loop.run(main(), timeout_s=100)


# ------------------------------------------------------------------ sync API


def test_sync_group_consumer(sync_broker: ThreadedBroker) -> None:
    address = sync_broker.address
    with tidemq.Admin(address) as admin:
        admin.create_topic(TOPIC, 2)
    with tidemq.Producer(address) as producer:
        for i in range(10):
            producer.send(TOPIC, b"%d" % i, queue=i % 2)

    assigned: list[list[tuple[str, int]]] = []
    revoked: list[list[tuple[str, int]]] = []
    with tidemq.GroupConsumer(
        address,
        "sync-group",
        [TOPIC],
        start="earliest",
        auto_commit=False,
        on_assign=assigned.append,
        on_revoke=revoked.append,
    ) as consumer:
        got: list[tidemq.Message] = []
        deadline = time.monotonic() + 20
        while len(got) < 10 and time.monotonic() < deadline:
            got.extend(consumer.poll(300))
        assert sorted(int(m.value or b"") for m in got) == list(range(10))
        assert consumer.member_id
        assert consumer.generation == 1
        assert consumer.assignment() == [(TOPIC, 0), (TOPIC, 1)]
        assert assigned == [[(TOPIC, 0), (TOPIC, 1)]]
        consumer.commit({(TOPIC, 0): 3})
        consumer.commit({(TOPIC, 1): 5})
    assert revoked == []

    with tidemq.Admin(address) as admin:
        assert "sync-group" in admin.list_groups()
        described = admin.describe_group("sync-group")
    assert [(o.queue, o.committed, o.lag) for o in described.offsets] == [(0, 3, 2), (1, 5, 0)]

    with tidemq.GroupConsumer(address, "sync-group", [TOPIC], start="latest") as again:
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 2 and time.monotonic() < deadline:
            got.extend(again.poll(300))
        assert sorted((m.queue, m.offset) for m in got) == [(0, 3), (0, 4)]


def test_leave_request_for_unknown_member_is_harmless(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _setup(broker.address, 1)
        client = ClusterClient(broker.address)
        try:
            await client.call(
                broker.address, LeaveGroupRequest(group="nobody-here", member_id="ghost"), Empty
            )
        finally:
            await client.close()

    loop.run(main())
