"""Pop consumption of a static FIFO topic across a remap (three brokers behind a name
server, in this process): a message group's messages on the new link are delivered only
once every message before the link is finished, so each key is consumed in send order."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tidemq import aio

if TYPE_CHECKING:
    from tests.integration.conftest import ClusterEnv, Loop

pytestmark = pytest.mark.timeout(120)

TOPIC = "fifo-orders"
KEYS = 4
PER_KEY = 3


async def _send_round(producer: aio.Producer, round_no: int) -> dict[bytes, int]:
    """value -> queue of each message sent."""
    sent = {}
    for n in range(PER_KEY):
        for k in range(KEYS):
            value = f"r{round_no}:k{k}:{n}".encode()
            receipt = await producer.send(TOPIC, value, key=f"k{k}".encode())
            sent[value] = receipt.queue
    return sent


def test_message_groups_keep_their_order_across_a_remap(loop: Loop, cluster3: ClusterEnv) -> None:
    async def main() -> None:
        async with (
            aio.Admin(cluster3.bootstrap) as admin,
            aio.Producer(cluster3.bootstrap) as producer,
        ):
            await admin.create_topic(
                TOPIC, 2, static=True, brokers=["broker-a"], message_type="FIFO"
            )
            sent = await _send_round(producer, 0)
            consumer = aio.SimpleConsumer(
                cluster3.bootstrap, "g-fifo", {TOPIC: "*"}, await_duration=0.1
            )
            try:
                # Leased before the remap, acknowledged only after it.
                held = await consumer.receive(16)
                assert held
                assert len({m.key for m in held}) == len(held)  # one per message group
                await admin.remap_topic(TOPIC, brokers=["broker-b"])
                sent |= await _send_round(producer, 1)
                await admin.remap_topic(TOPIC, brokers=["broker-c"])
                sent |= await _send_round(producer, 2)
                order: dict[bytes, list[bytes]] = {}
                acked: set[bytes] = set()
                pending = list(held)
                for _ in range(400):
                    for m in pending:
                        assert m.key is not None
                        assert m.value is not None
                        order.setdefault(m.key, []).append(m.value)
                        # A later link's message comes only once every message of its
                        # queue on the links before is finished.
                        earlier = {v for v, q in sent.items() if q == m.queue and v[1] < m.value[1]}
                        assert earlier <= acked, (m.value, sorted(earlier - acked)[:3])
                    await consumer.ack_many(pending)
                    acked.update(m.value for m in pending if m.value is not None)
                    if len(acked) == len(sent):
                        break
                    pending = await consumer.receive(16)
            finally:
                await consumer.close()
        assert acked == set(sent)
        for key, values in order.items():
            of_key = [v for v in sent if f":{key.decode()}:".encode() in v]
            assert values == of_key, key  # each message group in send order, once each

    loop.run(main())
