"""The route table a client (or a broker forwarding a request) consults: which broker serves
which queue of which topic, and which queue a message goes to.

Built from one `GetRoutesResponse`; a whole refresh builds a new table and swaps it in. A
partial one (a few topics: after a create, before the first send to a topic) merges into
the table in place (`merge`). Pure: no I/O, no clock.

Queue selection:

* with a key, `queue_for_key(key, total queues)`: CRC32C of the key modulo the topic's
  total queue count. The hash is fixed (the same in every process, client language and
  version, unlike Python's salted `hash()`), and it ranges over all queues rather than the
  ones currently served, so a key keeps its queue, and its order, while a broker is away;
  sending to an unserved queue fails with BrokerNotAvailable (retriable) instead of
  silently moving the key;
* without a key, round-robin over the served queues with a counter the caller advances.

A route answer lists, per topic, only the queues some live broker serves. Entries for queue
ids outside [0, queues) (a route fetched while the topic was being altered) are dropped.
A topic whose brokers are all away (the name server calls it stale) is in the table with
its queue count and no served queue: "no route right now" (BrokerNotAvailable, retriable),
unlike a topic missing from the table (TopicNotFound).

Two brokers are named besides the queues' hosts: each consumer group's coordinator, by
rendezvous hashing of the group over the brokers the name server lists (`group_coordinator`,
ADR 17), and the security writer, which alone changes users and ACL entries
(`security_writer`, ADR 15 and 20). Neither moves when a client marks a broker down
(`without`): only the name server's list moves them, so every client agrees.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping
from types import MappingProxyType

import crc32c

from tidemq.cluster.group_coordinator import coordinator_for
from tidemq.core.errors import AuthorizationFailed, BrokerNotAvailable, TidemqError, TopicNotFound
from tidemq.core.static_chain import QueueChain, link_for
from tidemq.protocol.commands import GetRoutesResponse, TopicRoute

__all__ = ["RouteTable", "key_hash", "queue_for_key"]


def key_hash(key: bytes) -> int:
    """The stable 32-bit hash of a message key: CRC32C (Castagnoli), as an unsigned int."""
    return int(crc32c.crc32c(key))


def queue_for_key(key: bytes, queue_count: int) -> int:
    """The queue a keyed message goes to among `queue_count` queues (ids 0..count-1)."""
    if queue_count < 1:
        raise ValueError(f"a topic has at least one queue, got {queue_count}")
    return key_hash(key) % queue_count


class _Topic:
    __slots__ = ("chains", "message_type", "queue_count", "served", "served_ids")

    def __init__(self, route: TopicRoute) -> None:
        self.queue_count = route.queues
        self.message_type = route.message_type
        #: queue id -> broker address, sorted by queue id
        self.served: dict[int, str] = {
            queue: route.brokers[queue]
            for queue in sorted(route.brokers)
            if 0 <= queue < route.queues
        }
        self.served_ids = tuple(self.served)
        #: A static topic: queue id -> its chain (empty for an ordinary topic).
        self.chains = {c.queue: c for c in route.chains if 0 <= c.queue < route.queues}


class RouteTable:
    """Routes of some topics, plus the broker directory, from which each group's
    coordinator follows, and the security writer."""

    def __init__(
        self,
        routes: Iterable[TopicRoute] = (),
        brokers: Mapping[str, str] | None = None,
        security_writer: str = "",
    ) -> None:
        self._source = {route.topic: route for route in routes}
        self._topics = {topic: _Topic(route) for topic, route in self._source.items()}
        self._brokers = MappingProxyType(dict(brokers or {}))
        #: The brokers as the name server listed them, those marked down included: what
        #: the group coordinators are computed from.
        self._listed = self._brokers
        self._security_writer = security_writer
        #: Topics the user may not describe (learnt by asking for them by name).
        self._denied: set[str] = set()

    @classmethod
    def from_response(cls, response: GetRoutesResponse) -> RouteTable:
        # The wire field keeps its first name: it names the security writer.
        return cls(response.routes, response.brokers, response.coordinator)

    def merge(self, response: GetRoutesResponse, asked: Iterable[str]) -> None:
        """In place: the routes of the `asked` topics replaced by the answer's (a topic
        asked for and not answered no longer exists), and the answer's brokers and
        security writer. The one exception to "immutable": a client that just created its
        100,001st topic learns it in constant time, not by copying every route; readers
        holding this table see the newer routes, which is all they could want."""
        for topic in asked:
            self._source.pop(topic, None)
            self._topics.pop(topic, None)
            self._denied.discard(topic)
        self._denied.update(response.denied)
        for route in response.routes:
            self._source[route.topic] = route
            self._topics[route.topic] = _Topic(route)
        self._brokers = self._listed = MappingProxyType(dict(response.brokers))
        self._security_writer = response.coordinator

    def without(self, addresses: Collection[str]) -> RouteTable:
        """This table with the brokers at `addresses` taken out (a client saw their
        connections fail): their queues unserved, their names gone from `brokers`. The
        group coordinators and the security writer stay: only the name server moves them."""
        if not addresses:
            return self
        routes = [
            TopicRoute(
                topic=r.topic,
                queues=r.queues,
                message_type=r.message_type,
                brokers={q: a for q, a in r.brokers.items() if a not in addresses},
                chains=r.chains,
            )
            for r in self._source.values()
        ]
        brokers = {n: a for n, a in self._brokers.items() if a not in addresses}
        table = RouteTable(routes, brokers, self._security_writer)
        table._listed = self._listed
        table._denied = self._denied
        return table

    def addresses(self) -> set[str]:
        """Every address the table names: brokers, queue hosts and the security writer."""
        found = set(self._brokers.values())
        for topic in self._topics.values():
            found.update(topic.served.values())
        if self._security_writer:
            found.add(self._security_writer)
        return found

    @property
    def has_unserved_queues(self) -> bool:
        """Whether some queue of some topic has no live broker (a broker is away)."""
        return any(len(t.served) < t.queue_count for t in self._topics.values())

    @property
    def brokers(self) -> Mapping[str, str]:
        """Broker name -> address, read-only."""
        return self._brokers

    @property
    def listed_brokers(self) -> Mapping[str, str]:
        """Broker name -> address as the name server listed them, read-only: `brokers`
        with the brokers this client marked down put back."""
        return self._listed

    def group_coordinator(self, group: str) -> str:
        """Address of the broker coordinating `group` (rendezvous hashing over the
        brokers the name server lists, `tidemq.cluster.group_coordinator`); "" if none
        is live."""
        return coordinator_for(group, self._listed)

    @property
    def security_writer(self) -> str:
        """Address of the broker that changes users and ACL entries (the oldest live
        broker, ADR 15); "" if none is live. Not a group coordinator."""
        return self._security_writer

    def topics(self) -> list[str]:
        """The topics in the table, sorted."""
        return sorted(self._topics)

    def __contains__(self, topic: object) -> bool:
        return topic in self._topics

    def queue_count(self, topic: str) -> int:
        """The topic's total queue count, served or not; raises TopicNotFound."""
        return self._topic(topic).queue_count

    def message_type(self, topic: str) -> str:
        return self._topic(topic).message_type

    def queues(self, topic: str) -> list[int]:
        """The served queue ids of the topic, sorted; [] for a topic not in the table."""
        found = self._topics.get(topic)
        return list(found.served_ids) if found is not None else []

    def broker_for(self, topic: str, queue: int) -> str | None:
        """The address serving the queue, or None (unknown topic or unserved queue)."""
        found = self._topics.get(topic)
        return found.served.get(queue) if found is not None else None

    def chain(self, topic: str, queue: int) -> QueueChain | None:
        """A static topic's chain of `queue`; None for an ordinary topic's queue."""
        found = self._topics.get(topic)
        return found.chains.get(queue) if found is not None else None

    def is_static(self, topic: str) -> bool:
        found = self._topics.get(topic)
        return found is not None and bool(found.chains)

    def broker_for_offset(self, topic: str, queue: int, offset: int) -> str | None:
        """The address of the broker holding `offset` of the queue: for a static topic
        the broker of the link holding it (its write end for offsets at or past the
        chain's end; for a sealed link whose broker is away, the write end's, which reads
        it from the object store), else the queue's broker. None: unknown, or away."""
        found = self._topics.get(topic)
        if found is None:
            return None
        chain = found.chains.get(queue)
        if chain is None:
            return found.served.get(queue)
        link = link_for(chain, offset)
        if link is None:
            return found.served.get(queue)
        address = self._brokers.get(link.broker)
        if address is None and not link.is_open:
            # Its broker is down or gone: the write end's broker reads a sealed link's
            # offloaded files from the object store (tiered storage).
            return found.served.get(queue)
        return address

    def key_queue(self, topic: str, key: bytes) -> int:
        """The queue a keyed message of `topic` goes to, served now or not (its sender
        waits for a broker within the delivery time); raises TopicNotFound."""
        return queue_for_key(key, self._topic(topic).queue_count)

    def select_queue(self, topic: str, key: bytes | None, round_robin_counter: int) -> int:
        """The queue a message goes to: by key hash over all queues, else the served queue
        at `round_robin_counter` (any int; the caller increments it per message). Raises
        TopicNotFound for a topic not in the table, BrokerNotAvailable if the chosen queue
        (with a key) or every queue (without) has no live broker."""
        found = self._topic(topic)
        if key is not None:
            queue = queue_for_key(key, found.queue_count)
            if queue not in found.served:
                raise BrokerNotAvailable(
                    f"queue {queue} of topic {topic!r}, where this key goes, has no live broker"
                )
            return queue
        if not found.served:
            raise BrokerNotAvailable(f"no queue of topic {topic!r} has a live broker")
        served = found.served_ids
        return served[round_robin_counter % len(served)]

    def unknown(self, topic: str, why: str = "") -> TidemqError:
        """The error for a topic not in the table: AuthorizationFailed if the user was
        refused it, else TopicNotFound (with `why` appended)."""
        if topic in self._denied:
            return AuthorizationFailed(
                f"this user may not describe topic {topic!r} (whether or not it exists)"
            )
        return TopicNotFound(f"topic {topic!r} does not exist{why}")

    def _topic(self, topic: str) -> _Topic:
        found = self._topics.get(topic)
        if found is None:
            raise self.unknown(topic, " (no broker serves it)")
        return found
