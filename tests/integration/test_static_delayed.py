"""Delayed messages on static topics (three brokers behind a name server, in this process):
a remap hands the sealed side's pending delayed batches over to the new write end, where
they are delivered once, into the same logical queue, with the ids their sends returned;
cancels by id follow them; every step of a hand-over cut short is repeated harmlessly."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from tidemq import aio
from tidemq.broker.broker import Broker
from tidemq.client.cluster import ClusterClient
from tidemq.cluster.route import queue_for_key
from tidemq.core.errors import AlreadyDelivered
from tidemq.core.message import Receipt
from tidemq.protocol.commands import TimerStatusRequest, TimerStatusResponse
from tidemq.protocol.static_messages import (
    StaticChainsResponse,
    StaticSealRequest,
    StaticTimersAdoptRequest,
    StaticTimersAdoptResponse,
    StaticTimersHandedRequest,
    StaticTimersHandedResponse,
    StaticTimersPage,
    StaticTimersTakeRequest,
)

if TYPE_CHECKING:
    from tests.integration.conftest import ClusterEnv, Loop

pytestmark = pytest.mark.timeout(120)

TOPIC = "reminders"
QUEUES = 2
KEYS = 6
#: Far enough ahead that nothing in a test is delivered by it.
LATER_S = 3600.0


async def _pending_on(cluster: ClusterEnv) -> dict[str, int]:
    """Pending delayed batches of TOPIC on each broker, by broker name."""
    client = ClusterClient(cluster.bootstrap)
    try:
        out = {}
        for broker, address in zip(cluster.brokers, cluster.addresses, strict=True):
            status = await client.call(
                address, TimerStatusRequest(topic=TOPIC), TimerStatusResponse
            )
            out[broker.config.broker_name] = sum(t.pending_batches for t in status.topics)
        return out
    finally:
        await client.close()


async def _send_delayed(
    producer: aio.Producer, tag: str, delay: float
) -> list[tuple[bytes, bytes, Receipt]]:
    sent = []
    for k in range(KEYS):
        key, value = f"k{k}".encode(), f"{tag}:{k}".encode()
        sent.append((key, value, await producer.send(TOPIC, value, key=key, delay=delay)))
    return sent


async def _read(bootstrap: str, expected: int) -> list[aio.Message]:
    consumer = aio.StreamConsumer(bootstrap, start="earliest", fetch_wait_ms=50)
    got: list[aio.Message] = []
    try:
        consumer.assign([(TOPIC, q) for q in range(QUEUES)])
        for _ in range(600):
            got += await consumer.poll(100)
            if len(got) >= expected:
                break
        got += await consumer.poll(100)  # anything extra would be a duplicate
    finally:
        await consumer.close()
    return got


async def _restart(cluster: ClusterEnv, n: int) -> str:
    """Stop broker `n` cleanly and start it again on its data; its new address."""
    old = cluster.brokers[n]
    await old.stop()
    cluster.brokers[n] = Broker(old.config)
    cluster.addresses[n] = await cluster.brokers[n].start()
    return cluster.addresses[n]


def test_delayed_messages_follow_their_queue_across_remaps(
    loop: Loop, cluster3: ClusterEnv
) -> None:
    async def main() -> None:
        async with (
            aio.Admin(cluster3.bootstrap) as admin,
            aio.Producer(cluster3.bootstrap) as producer,
        ):
            await admin.create_topic(TOPIC, QUEUES, static=True, brokers=["broker-a"])
            later = await _send_delayed(producer, "later", LATER_S)
            sent_at = time.time()
            soon = await _send_delayed(producer, "soon", 1.0)
            report = await admin.remap_topic(TOPIC, brokers=["broker-b"])
            assert sum(s.delayed for s in report.switches) >= KEYS  # the later ones at least
            await admin.remap_topic(TOPIC, brokers=["broker-c"])
            pending = await _pending_on(cluster3)
            assert (pending["broker-a"], pending["broker-b"]) == (0, 0)

            got = await _read(cluster3.bootstrap, len(soon))
            arrived = time.time()
            assert await _pending_on(cluster3) == {"broker-a": 0, "broker-b": 0, "broker-c": KEYS}
            assert sorted(m.value or b"" for m in got) == sorted(v for _, v, _ in soon)  # once each
            by_value = {m.value: m for m in got}
            for key, value, receipt in soon:
                m = by_value[value]
                assert m.message_id == receipt.message_id  # the id its send returned
                assert m.queue == queue_for_key(key, QUEUES) == receipt.queue
            assert arrived >= sent_at + 1.0  # never early
            offsets = sorted((m.queue, m.offset) for m in got)
            assert len(set(offsets)) == len(offsets)

            # A cancel by id reaches the batch where it is now (broker-c).
            doomed = later[0][2]
            answer = await producer.cancel(doomed.message_id)
            assert (answer.topic, answer.count) == (TOPIC, 1)
            with pytest.raises(AlreadyDelivered):
                await producer.cancel(doomed.message_id)

            # Back onto the first broker: the rest follow again.
            await admin.remap_topic(TOPIC, brokers=["broker-a"])
            assert await _pending_on(cluster3) == {
                "broker-a": KEYS - 1,
                "broker-b": 0,
                "broker-c": 0,
            }
            # Handed back to the broker they were sent to, they are still cancelled by id.
            answer = await producer.cancel(later[1][2].message_id)
            assert answer.count == 1
            # And delayed sends after the remaps go to the write end as usual.
            more = await _send_delayed(producer, "again", LATER_S)
            assert {r.queue for _, _, r in more} <= set(range(QUEUES))
            assert (await _pending_on(cluster3))["broker-a"] == 2 * KEYS - 2

    loop.run(main())


def test_a_hand_over_cut_short_is_finished_once(loop: Loop, cluster3: ClusterEnv) -> None:
    """The admin dies after the seal, then after reserving a page: repair finishes it;
    repeating the adopt and the handed steps afterwards (even across a restart of the
    adopter) moves nothing twice."""

    async def main() -> None:
        a, b = cluster3.addresses[0], cluster3.addresses[1]
        client = ClusterClient(cluster3.bootstrap)
        async with (
            aio.Admin(cluster3.bootstrap) as admin,
            aio.Producer(cluster3.bootstrap) as producer,
        ):
            try:
                await admin.create_topic(TOPIC, 1, static=True, brokers=["broker-a"])
                for i in range(5):
                    await producer.send(TOPIC, f"v{i}".encode(), queue=0, delay=LATER_S)
                seal = StaticSealRequest(topic=TOPIC, queue=0, epoch=2, target="broker-b")
                await client.call(a, seal, StaticChainsResponse)
                take = StaticTimersTakeRequest(topic=TOPIC, queue=0, dest="broker-b")
                page = await client.call(a, take, StaticTimersPage)
                assert (len(page.timers), page.dest, page.more) == (5, "broker-b", False)
                assert await client.call(a, take, StaticTimersPage) == page  # the same page
                # The holder restarts: its reservation comes back from its timer topic.
                a = await _restart(cluster3, 0)
                assert await client.call(a, take, StaticTimersPage) == page

                report = await admin.remap_topic(TOPIC, repair=True)
                assert [(s.target, s.delayed) for s in report.switches] == [("broker-b", 5)]
                pending = await _pending_on(cluster3)
                assert (pending["broker-a"], pending["broker-b"]) == (0, 5)

                # The adopt and handed steps of that page again: nothing moves twice.
                adopt = StaticTimersAdoptRequest(
                    topic=TOPIC, queue=0, source="broker-a", timers=page.timers
                )
                again = await client.call(b, adopt, StaticTimersAdoptResponse)
                assert (again.adopted, again.skipped) == (0, 5)
                handed = StaticTimersHandedRequest(topic=TOPIC, queue=0, through=page.through)
                dropped = await client.call(a, handed, StaticTimersHandedResponse)
                assert dropped.dropped == 0
            finally:
                await client.close()

        # The adopter restarts: its dedup marks come back.
        b = await _restart(cluster3, 1)
        client = ClusterClient(cluster3.bootstrap)
        try:
            again = await client.call(b, adopt, StaticTimersAdoptResponse)
            assert (again.adopted, again.skipped) == (0, 5)
        finally:
            await client.close()
        pending = await _pending_on(cluster3)
        assert (pending["broker-a"], pending["broker-b"]) == (0, 5)

    loop.run(main())


def test_ids_of_delayed_messages_on_two_brokers_never_collide(
    loop: Loop, cluster3: ClusterEnv
) -> None:
    """Each broker's timer topic counts from 0: the ids name the broker too, so a cancel
    reaches only the batch its id was returned for (it used to cancel whichever broker's
    batch sat at that offset first)."""

    async def main() -> None:
        async with (
            aio.Admin(cluster3.bootstrap) as admin,
            aio.Producer(cluster3.bootstrap) as producer,
        ):
            await admin.create_topic("plain", 3)
            first = [
                await producer.send("plain", f"q{q}".encode(), queue=q, delay=LATER_S)
                for q in range(3)
            ]
            origins = {r.origin for r in first}
            assert len({o[0] for o in origins if o is not None}) == 3  # one per broker
            assert len({r.message_id for r in first}) == 3
            await producer.cancel(first[1].message_id)
            status = await admin.timer_status("plain")
            assert status.topics[0].pending_batches == 2
            for receipt in (first[0], first[2]):
                answer = await producer.cancel(receipt.message_id)
                assert answer.count == 1
            with pytest.raises(AlreadyDelivered):
                await producer.cancel(first[1].message_id)

    loop.run(main())
