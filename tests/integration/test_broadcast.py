"""Broadcasting: every member of a group gets every message; each member's progress is
its own, on the broker, and survives a restart of the member."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import pytest

from tidemq import aio
from tidemq.client.broadcast_consumer import broadcast_group

if TYPE_CHECKING:
    from tests.integration.conftest import BrokerEnv, Loop

pytestmark = pytest.mark.timeout(120)


async def _poll_until(consumer: aio.BroadcastConsumer, count: int) -> list[bytes]:
    out: list[bytes] = []
    deadline = time.monotonic() + 20
    while len(out) < count and time.monotonic() < deadline:
        out += [m.value or b"" for m in await consumer.poll(300)]
    out += [m.value or b"" for m in await consumer.poll(100)]
    return out


def test_every_member_gets_every_message_and_keeps_its_own_progress(
    loop: Loop, broker: BrokerEnv
) -> None:
    async def main() -> None:
        async with aio.Admin(broker.address) as admin:
            await admin.create_topic("prices", 3)
        async with aio.Producer(broker.address) as producer:
            for i in range(30):
                await producer.send("prices", b"p%d" % i, queue=i % 3)
        a = aio.BroadcastConsumer(
            broker.address, "caches", ["prices"], member="a", start="earliest"
        )
        b = aio.BroadcastConsumer(
            broker.address, "caches", ["prices"], member="b", start="earliest"
        )
        got_a = await _poll_until(a, 30)
        got_b = await _poll_until(b, 20)
        expected = sorted(b"p%d" % i for i in range(30))
        assert sorted(got_a) == expected
        assert sorted(got_b) == expected  # every member gets everything
        await a.close()  # commits a's progress
        async with aio.Producer(broker.address) as producer:
            for i in range(30, 36):
                await producer.send("prices", b"p%d" % i, queue=i % 3)
        again = aio.BroadcastConsumer(
            broker.address, "caches", ["prices"], member="a", start="earliest"
        )
        assert sorted(await _poll_until(again, 6)) == sorted(b"p%d" % i for i in range(30, 36))
        await again.close()
        assert sorted(await _poll_until(b, 6)) == sorted(b"p%d" % i for i in range(30, 36))
        await b.close()
        async with aio.Admin(broker.address) as admin:
            described = await admin.describe_group(broadcast_group("caches", "b"))
        assert sum(o.committed for o in described.offsets) == 36
        with pytest.raises(ValueError, match="member must be"):
            aio.BroadcastConsumer(broker.address, "caches", ["prices"], member="no spaces")

    loop.run(main())
