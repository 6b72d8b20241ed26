"""A broker leaving the cluster: `tidemq cluster remove-broker NAME`
(docs/design/static-topics.md, "A broker leaves").

Per static queue with links on NAME, one of two, decided from NAME's tier status:

* **prune**: NAME's links have expired there (nothing left to read, in the bucket
  either): they, and every link before NAME's last one, leave the chain;
* **retire**: NAME offloads the topic and its links still hold data: they stay in the
  chain marked `tiered`, read from NAME's files in the object store by the other brokers
  (NAME checks that everything not expired is in the bucket, and that no pop group has
  unfinished messages there); the queue's write end expires them later by retention.

The update goes first to NAME and the brokers whose links are dropped (each checks its own
data and refuses, naming what it still holds), then to the other holders.
"""

from __future__ import annotations

from dataclasses import dataclass

from tidemq.client.cluster import ClusterClient, RouteTable
from tidemq.core.errors import BrokerNotAvailable, InvalidRequest
from tidemq.core.static_chain import QueueChain, prune_through, retire
from tidemq.protocol.commands import DescribeTopicRequest, TopicInfoMsg
from tidemq.protocol.static_messages import StaticChainsResponse, StaticUpdateRequest
from tidemq.protocol.tier_messages import TierStatusRequest, TierStatusResponse

__all__ = ["PrunedQueue", "remove_broker"]


@dataclass(frozen=True, slots=True)
class PrunedQueue:
    """What `remove_broker` did to one queue's chain."""

    topic: str
    queue: int
    #: Links dropped from the chain (their data had expired).
    links: int
    #: The chain's first logical offset afterwards.
    starts_at: int
    #: The leaving broker's links kept in the chain, read from the object store.
    offloaded: int = 0


async def remove_broker(cluster: ClusterClient, name: str) -> list[PrunedQueue]:
    """Take broker `name` out of every static chain, once it holds no data that only it
    can serve: no queue of an ordinary topic with messages, no write end or switch
    target, and every link of its expired or, with tiered storage, in the object store.
    Afterwards the broker can be stopped for good."""
    routes = await cluster.refresh_routes(force=True)
    address = routes.brokers.get(name)
    if address is None:
        raise BrokerNotAvailable(
            f"broker {name} is not live: start it, so that its data can be checked first"
        )
    await _refuse_ordinary_data(cluster, routes, name, address)
    plans: list[tuple[str, QueueChain, QueueChain]] = []
    for topic in routes.topics():
        starts = await _remote_starts(cluster, address, topic) if routes.is_static(topic) else {}
        for q in range(routes.queue_count(topic)):
            chain = routes.chain(topic, q)
            own = [] if chain is None else [link for link in chain.links if link.broker == name]
            if chain is None or not own or all(link.tiered for link in own):
                continue
            start = starts.get(q)
            expired = start is None or all(link.physical_end <= start for link in own)
            plans.append(
                (topic, chain, prune_through(chain, name) if expired else retire(chain, name))
            )
    done = []
    for topic, chain, changed in plans:
        dropped = chain.links[: len(chain.links) - len(changed.links)]
        first = {name} | {d.broker for d in dropped}
        # Those whose links change first (they check their data), then the other holders.
        order = sorted({link.broker for link in chain.links}, key=lambda b: (b not in first, b))
        for broker in order:
            where = routes.brokers.get(broker)
            if where is None:
                raise BrokerNotAvailable(f"broker {broker}, holding links of {topic}, is not live")
            request = StaticUpdateRequest(topic=topic, chains=[changed])
            await cluster.request(where, request, StaticChainsResponse)
        kept = sum(1 for link in changed.links if link.broker == name)
        done.append(
            PrunedQueue(topic, chain.queue, len(dropped), changed.links[0].logical_start, kept)
        )
    await cluster.refresh_routes(force=True)
    return done


async def _remote_starts(cluster: ClusterClient, address: str, topic: str) -> dict[int, int]:
    """Per queue of `topic` that the broker offloads, its first offset still readable
    (in the bucket or on disk); empty without tiered storage there."""
    status = await cluster.call(address, TierStatusRequest(topic=topic), TierStatusResponse)
    if not status.enabled:
        return {}
    return {q.queue: q.log_start for q in status.queues if q.topic == topic}


async def _refuse_ordinary_data(
    cluster: ClusterClient, routes: RouteTable, name: str, address: str
) -> None:
    for topic in routes.topics():
        if routes.is_static(topic):
            continue
        if not any(routes.broker_for(topic, q) == address for q in routes.queues(topic)):
            continue
        info = await cluster.call(address, DescribeTopicRequest(name=topic), TopicInfoMsg)
        held = [qi.queue for qi in info.queue_info if qi.max_offset > qi.min_offset]
        if held:
            raise InvalidRequest(
                f"broker {name} holds messages of topic {topic!r} (queues {held}); it can "
                "leave once they are consumed and expired, or the topic is deleted"
            )
