"""The name server: brokers register the queues they host; clients ask who serves what.

Like RocketMQ's NameServer it keeps no durable state. Each broker calls `register` every
`heartbeat_interval_ms` with its full topic list (registration and heartbeat are the same
call); a broker silent for more than `broker_ttl_ms` (monotonic clock) is no longer live.
Several name servers may run side by side, each fed by every broker: every answer is a
pure function of the live registrations, so they agree.

Broker states::

    (absent) --register--> LIVE --silent > TTL--> LAPSED --expire()--> (absent)
                           LIVE --unregister--> (absent)
                           LAPSED --register--> LIVE, as a new broker (see claims)

A LAPSED broker is invisible to `routes`, `brokers` and `security_writer` at once, whether or
not `expire()` has run yet; `status` still lists it until then.

Stale topics. A topic that a lapsed or unregistered broker hosted is not deleted: the broker
may only be paused, restarting or cut off. For `stale_topic_ms` after its last broker went
away, `routes` keeps answering for it with its last queue count and no served queues ("no
route right now": clients raise the retriable BrokerNotAvailable), never by leaving it out
("unknown topic": TopicNotFound). A broker that drops a topic from its registration (the
topic was deleted) makes it unknown at once. `extend_leases` covers the name server's own
pauses: time it spent stopped is not counted as the brokers' silence.

Queue claims. A registration claims queues (topic, queue id); several live brokers may
claim the same queue (a misconfiguration, or a queue being moved). The queue is served by
the claimant whose claim is oldest: a claim keeps its age across re-registrations that
repeat it, and starts anew when a broker claims a queue it did not claim in its previous
registration, or registers after lapsing. So a broker cannot take over a queue another
live broker serves; the takeover happens when the holder drops the queue from its
registration, unregisters, or lapses. Refusing the conflicting registration instead would
stop that broker's heartbeats and so take all its other queues offline. `conflicts()`
lists the contested queues for the operator.

A broker name is its identity: re-registering under the same name with another address
(a restart on a new host or port) replaces the address and keeps the claims.

Topic-level fields: a route's queue count is the largest total any live broker reports (a
topic's queue count only grows; while brokers pick up an alter one by one the largest is
the newest), its message type is the one the live broker with the smallest name reports.

Consumer groups are not coordinated here: a client computes each group's coordinator
from the live broker names that `brokers` lists, by rendezvous hashing
(`tidemq.cluster.group_coordinator`, ADR 17). The name servers only agree on that list.

The security writer, the one broker that changes users and ACL entries (ADR 15), holds a
numbered term (writer_terms.py, ADR 20): the broker holding the current term keeps the
role while it is live; when it lapses or unregisters, the oldest live broker (the
smallest (creation time, name), where the creation time is when the broker's data
directory was first used) takes it under the next term. Adding a broker never moves it,
and a writer back from a pause does not take it back. Routes answers carry it in the
field `coordinator` (its name from when it coordinated the groups too), registration
answers in `security_writer` with its term in `writer_term`.

Not thread-safe. No I/O.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from tidemq.cluster.writer_terms import WriterTerms
from tidemq.core import limits
from tidemq.core.clock import Clock
from tidemq.core.errors import ConfigError, InvalidRequest, InvalidTopicName
from tidemq.core.static_chain import QueueChain, check_chain, newest
from tidemq.protocol.commands import BrokerStatus, StaticTopicReg, TopicRoute

__all__ = [
    "DEFAULT_BROKER_TTL_MS",
    "DEFAULT_HEARTBEAT_INTERVAL_MS",
    "DEFAULT_STALE_TOPIC_MS",
    "MAX_BROKER_NAME_CHARS",
    "MAX_HOST_CHARS",
    "MAX_QUEUES_PER_BROKER",
    "MAX_STALE_TOPICS",
    "MAX_TOPICS_PER_BROKER",
    "NameServer",
    "QueueConflict",
    "TopicRegistration",
    "parse_address",
]

#: Broker names: the same character set as topic names (they name directories and
#: appear in metrics), same length.
MAX_BROKER_NAME_CHARS: Final = 127
_BROKER_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,127}$")
#: DNS names are at most 253 characters.
MAX_HOST_CHARS: Final = 253
# Host names and IPv4 literals; underscores are allowed because container names have them.
_HOST = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_.-]*[A-Za-z0-9_])?$")
_MAX_PORT: Final = 65_535
#: Message types are short upper-case words (NORMAL, FIFO, DELAY, TRANSACTION); the
#: store owns the list, the name server only checks the shape.
_MESSAGE_TYPE = re.compile(r"^[A-Z][A-Z_]{0,31}$")
_TOPIC_NAME = re.compile(limits.REGISTERED_TOPIC_NAME_PATTERN)
#: Topics one broker registers (a full registration carries them all, within the frame
#: limit; later beats carry only changes, topic_journal.py).
MAX_TOPICS_PER_BROKER: Final = 1 << 20
#: Queues one broker may claim in total (a registration rebuilds its claims each time).
MAX_QUEUES_PER_BROKER: Final = 1 << 20

#: Failure detection: a broker heartbeats every second and is out of the routes after 4 s
#: of silence (three missed beats), so a dead broker leaves the routes within 5 s.
DEFAULT_HEARTBEAT_INTERVAL_MS: Final = 1_000
DEFAULT_BROKER_TTL_MS: Final = 4_000
#: How long a topic whose brokers all went away stays known as "no route right now":
#: longer than any pause or restart worth riding out, short enough that a topic deleted
#: while its broker was away is forgotten.
DEFAULT_STALE_TOPIC_MS: Final = 10 * 60 * 1000
#: Stale topics remembered at most (the oldest are forgotten first).
MAX_STALE_TOPICS: Final = 1 << 20

#: One registered topic: (topic, total queues, message type, hosted queue ids; [] = all).
TopicRegistration = tuple[str, int, str, list[int]]


@dataclass(frozen=True, slots=True)
class QueueConflict:
    """A queue claimed by more than one live broker: `serving` has it, `waiting` (oldest
    claim first) would take it over in that order."""

    topic: str
    queue: int
    serving: str
    waiting: list[str]


@dataclass(frozen=True, slots=True)
class _TopicReg:
    total: int
    message_type: str
    queues: tuple[int, ...]  # sorted, distinct, < total


@dataclass(slots=True)
class _Broker:
    name: str
    address: str
    last_seen_ms: float
    #: When the broker's data directory was created (epoch ms; 0: not reported).
    created_ms: int = 0
    topics: dict[str, _TopicReg] = field(default_factory=dict)
    #: Static topics (also in `topics`, with no queue claimed): the chains it holds.
    static: dict[str, list[QueueChain]] = field(default_factory=dict)
    #: (topic, queue) -> claim sequence number (smaller = older claim)
    claims: dict[tuple[str, int], int] = field(default_factory=dict)
    #: The broker's run and the version of its topic list held here (topic_journal.py);
    #: a delta applies only on top of exactly this.
    epoch: str = ""
    version: int = 0
    #: A replica group's leader: the newest epoch it registered under (0: not a group).
    leader_epoch: int = 0


def parse_address(address: str) -> tuple[str, int]:
    """Split "host:port" ("[v6 address]:port" for IPv6) and check both parts; raises
    InvalidRequest. A wildcard address (0.0.0.0, [::]) is refused: clients cannot dial it,
    so the broker must advertise a routable one."""
    host, sep, port_text = address.rpartition(":")
    if not sep or not host:
        raise InvalidRequest(f"broker address {address[:80]!r} is not host:port")
    if not port_text.isascii() or not port_text.isdigit() or not 0 < int(port_text) <= _MAX_PORT:
        raise InvalidRequest(f"broker address {address[:80]!r} has no valid port (1-65535)")
    if host.startswith("[") and host.endswith("]"):
        try:
            ip: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.IPv6Address(host[1:-1])
        except ValueError:
            raise InvalidRequest(f"broker address {address[:80]!r}: bad IPv6 literal") from None
    elif len(host) <= MAX_HOST_CHARS and _HOST.match(host):
        try:
            ip = ipaddress.IPv4Address(host)
        except ValueError:
            return host, int(port_text)  # a host name
    else:
        raise InvalidRequest(f"broker address {address[:80]!r} has an invalid host")
    if ip.is_unspecified:
        raise InvalidRequest(
            f"broker address {address!r} is a wildcard: advertise an address clients can reach"
        )
    return host, int(port_text)


class NameServer:
    """Broker registrations and the routes derived from them."""

    def __init__(
        self,
        clock: Clock,
        *,
        broker_ttl_ms: int = DEFAULT_BROKER_TTL_MS,
        heartbeat_interval_ms: int = DEFAULT_HEARTBEAT_INTERVAL_MS,
        max_brokers: int = 1024,
        stale_topic_ms: int = DEFAULT_STALE_TOPIC_MS,
    ) -> None:
        if not 0 < heartbeat_interval_ms < broker_ttl_ms:
            raise ConfigError(
                "name server needs 0 < heartbeat_interval_ms < broker_ttl_ms (a broker must "
                f"get a heartbeat in before it expires), got {heartbeat_interval_ms} and "
                f"{broker_ttl_ms}"
            )
        if max_brokers < 1:
            raise ConfigError(f"max_brokers must be >= 1, got {max_brokers}")
        if stale_topic_ms < 0:
            raise ConfigError(f"stale_topic_ms must be >= 0, got {stale_topic_ms}")
        self._clock = clock
        self._ttl = broker_ttl_ms
        self._interval = heartbeat_interval_ms
        self._max_brokers = max_brokers
        self._brokers: dict[str, _Broker] = {}
        #: (topic, queue) -> {broker name: claim sequence number}
        self._claimants: dict[tuple[str, int], dict[str, int]] = {}
        #: topic -> names of the brokers registering it
        self._topic_brokers: dict[str, set[str]] = {}
        self._next_claim = 0
        self._stale_ms = stale_topic_ms
        #: topic -> its last known registration and when it stops being remembered
        #: (monotonic ms); insertion order is expiry order (one fixed duration).
        self._stale: dict[str, tuple[_TopicReg, float]] = {}
        #: Counts every change of what routes() may answer, apart from time (liveness and
        #: stale expiry, which `generation` reads itself); with a key of this run's own,
        #: so that a restarted name server never repeats an earlier run's generation.
        self._changes = 0
        self._run_key = secrets.token_bytes(16)
        self._terms = WriterTerms(started_ms=clock.monotonic_ms(), grace_ms=broker_ttl_ms)

    # ------------------------------------------------------------------ brokers

    def register(
        self,
        broker_name: str,
        address: str,
        topics: Iterable[TopicRegistration],
        *,
        created_ms: int = 0,
        static_topics: Iterable[StaticTopicReg] = (),
        epoch: str = "",
        version: int = 0,
        leader_epoch: int = 0,
    ) -> tuple[int, int]:
        """Register or heartbeat: replace the broker's topic list, refresh its TTL and
        return (heartbeat_interval_ms, broker_ttl_ms). `created_ms`: when the broker's data
        directory was created (it orders brokers for the security writer). `epoch` and
        `version`: what later deltas build on (`update`; "" takes none). Raises
        InvalidRequest for a bad name, address or topic entry, or when `max_brokers` live
        brokers are registered; InvalidTopicName for a bad topic name. When it raises, no
        live registration has changed (lapsed brokers may have been forgotten to make
        room)."""
        if not _BROKER_NAME.match(broker_name):
            raise InvalidRequest(
                f"invalid broker name {broker_name[:140]!r}: use 1-{MAX_BROKER_NAME_CHARS} "
                "characters from A-Z a-z 0-9 _ . -"
            )
        parse_address(address)
        registered = _check_topics(list(topics))
        static = _check_static(list(static_topics), registered)
        now = self._clock.monotonic_ms()

        broker = self._brokers.get(broker_name)
        if broker is not None and not self._live(broker, now):
            # Back after lapsing: as if expire() had run, its claims start anew.
            self._remove(broker_name)
            broker = None
        if broker is not None:
            _check_leader_epoch(broker, leader_epoch)
            if broker.address != address:
                self._terms.release(broker_name)
        new = broker is None
        if broker is None:
            if len(self._brokers) >= self._max_brokers:
                for lapsed in [b.name for b in self._brokers.values() if not self._live(b, now)]:
                    self._remove(lapsed)
            if len(self._brokers) >= self._max_brokers:
                raise InvalidRequest(
                    f"{len(self._brokers)} brokers are registered, the name server's max_brokers"
                )
            broker = _Broker(broker_name, address, now)
            self._brokers[broker_name] = broker
        if (
            new
            or broker.address != address
            or broker.created_ms != max(0, created_ms)
            or broker.topics != registered
            or broker.static != static
        ):
            self._changes += 1
        broker.address = address
        broker.last_seen_ms = now
        broker.created_ms = max(0, created_ms)
        self._replace_topics(broker, registered)
        broker.static = static
        broker.epoch, broker.version = epoch, version
        broker.leader_epoch = max(broker.leader_epoch, leader_epoch)
        for topic in registered:
            self._stale.pop(topic, None)
        return self._interval, self._ttl

    def update(
        self,
        broker_name: str,
        address: str,
        *,
        epoch: str,
        base_version: int,
        version: int,
        topics: Iterable[TopicRegistration] = (),
        removed: Iterable[str] = (),
        leader_epoch: int = 0,
    ) -> bool:
        """A heartbeat with the topics changed since `base_version` of the broker's run
        `epoch` (topic_journal.py): upserted and removed topics applied, the TTL
        refreshed. False, with nothing changed, when this name server does not hold the
        broker live at exactly (epoch, base_version), or the change touches a static
        topic: the broker then registers in full. Raises InvalidRequest for a bad entry or
        when the broker would pass its topic or queue limits."""
        now = self._clock.monotonic_ms()
        broker = self._brokers.get(broker_name)
        if (
            not epoch
            or broker is None
            or not self._live(broker, now)
            or (broker.epoch, broker.version) != (epoch, base_version)
            or broker.address != address
        ):
            return False
        _check_leader_epoch(broker, leader_epoch)
        upserts = _check_topics(list(topics))
        gone = list(dict.fromkeys(removed))
        if len(gone) > MAX_TOPICS_PER_BROKER:
            raise InvalidRequest(f"{len(gone)} topics removed at once, over the limit")
        if any(t in broker.static for t in (*upserts, *gone)):
            return False
        self._check_growth(broker, upserts, gone)
        if upserts or gone:
            self._changes += 1
        for topic in gone:
            if topic in broker.topics:
                self._set_topic(broker, topic, None)
        for topic, reg in upserts.items():
            self._set_topic(broker, topic, reg)
            self._stale.pop(topic, None)
        broker.last_seen_ms = now
        broker.version = version
        return True

    def _check_growth(
        self, broker: _Broker, upserts: dict[str, _TopicReg], gone: list[str]
    ) -> None:
        """The broker's topic and queue limits after a delta (counted from the change)."""
        changed = [t for t in {*upserts, *gone} if t in broker.topics]
        topics = len(broker.topics) - len(changed) + len(upserts)
        if topics > MAX_TOPICS_PER_BROKER:
            raise InvalidRequest(f"a broker may register at most {MAX_TOPICS_PER_BROKER} topics")
        claims = (
            len(broker.claims)
            - sum(len(broker.topics[t].queues) for t in changed)
            + sum(len(reg.queues) for reg in upserts.values())
        )
        if claims > MAX_QUEUES_PER_BROKER:
            raise InvalidRequest(
                f"a broker may claim at most {MAX_QUEUES_PER_BROKER} queues in all"
            )

    def _set_topic(self, broker: _Broker, topic: str, reg: _TopicReg | None) -> None:
        """One topic of a broker replaced (None: removed), its claims with it."""
        old = broker.topics.get(topic)
        before = {(topic, q) for q in old.queues} if old is not None else set()
        after = {(topic, q) for q in reg.queues} if reg is not None else set()
        for key in before - after:
            del broker.claims[key]
            self._drop_claimant(key, broker.name)
        for key in sorted(after - before):
            broker.claims[key] = self._next_claim
            self._claimants.setdefault(key, {})[broker.name] = self._next_claim
            self._next_claim += 1
        if reg is None:
            del broker.topics[topic]
            self._drop_topic_broker(topic, broker.name)
            return
        if old is None:
            self._topic_brokers.setdefault(topic, set()).add(broker.name)
        broker.topics[topic] = reg

    def timing(self) -> tuple[int, int]:
        """(heartbeat_interval_ms, broker_ttl_ms) this name server asks of brokers."""
        return self._interval, self._ttl

    def unregister(self, broker_name: str, *, leader_epoch: int = 0) -> bool:
        """Forget the broker (a clean shutdown; its topics become stale); False if it was
        not registered, or if a replica group's leader under a newer epoch than
        `leader_epoch` registered it since (the old leader stopping after a handover)."""
        broker = self._brokers.get(broker_name)
        if broker is None or leader_epoch < broker.leader_epoch:
            return False
        self._remove(broker_name)
        return True

    def expire(self) -> list[str]:
        """Forget the brokers silent for more than the TTL (their topics become stale) and
        the stale topics past `stale_topic_ms`; returns the brokers' names, sorted."""
        now = self._clock.monotonic_ms()
        lapsed = sorted(b.name for b in self._brokers.values() if not self._live(b, now))
        for name in lapsed:
            self._remove(name)
        while self._stale:
            topic, (_, until) = next(iter(self._stale.items()))
            if until > now:
                break
            del self._stale[topic]
        return lapsed

    def report_writer(self, broker_name: str, held_term: int, counter: int) -> None:
        """A registration's writer lease (the term `broker_name` holds; 0: none) and the
        counter of its users and ACL entries (writer_terms.py)."""
        if self._terms.report(broker_name, held_term, counter):
            self._changes += 1

    def confirms_writer(self, broker_name: str, held_term: int, counter: int) -> str:
        """A writer's confirmation push (writer_terms.py `confirms`): "" to accept it,
        else why not."""
        self.report_writer(broker_name, held_term, counter)
        return self._terms.confirms(broker_name, held_term)

    def extend_leases(self, paused_ms: float) -> None:
        """The name server itself was stopped for `paused_ms` (SIGSTOP, a VM pause): brokers
        could not reach it, so that time does not count as their silence."""
        if paused_ms > 0:
            for broker in self._brokers.values():
                broker.last_seen_ms += paused_ms

    # ------------------------------------------------------------------ queries

    def generation(self) -> int:
        """A token of what `routes()` (of every topic), `brokers()` and `security_writer()`
        answer now (a writer is elected first if one is due): equal tokens, equal answers.
        A client that has the routes of one generation asks with it and is told
        "unchanged" instead of fetching 100,000 routes again every few seconds. Read from
        the change count, the live brokers, the writer and its term, and the stale topics
        still remembered; a positive 63-bit integer."""
        now = self._clock.monotonic_ms()
        stale = len(self._stale)
        for _, until in self._stale.values():  # expiry order: the expired ones first
            if until > now:
                break
            stale -= 1
        writer, term = self.security_writer_term()
        digest = hashlib.blake2b(key=self._run_key, digest_size=8)
        digest.update(f"{self._changes}|{stale}|{writer}@{term}".encode())
        for name in sorted(self._brokers):
            broker = self._brokers[name]
            if self._live(broker, now):
                digest.update(f"|{name}={broker.address}".encode())
        return (int.from_bytes(digest.digest(), "big") >> 1) | 1

    def routes(self, topics: Iterable[str] | None = None) -> list[TopicRoute]:
        """Routes of the given topics (all when None), sorted by topic. An unknown topic is
        left out; a partly served topic lists only its served queues; a stale topic (see
        the module doc) lists none."""
        now = self._clock.monotonic_ms()
        if topics is None:
            names = sorted(self._topic_brokers.keys() | self._stale.keys())
        else:
            names = sorted(set(topics))
        result = []
        for topic in names:
            route = self._route(topic, now)
            if route is not None:
                result.append(route)
        return result

    def brokers(self) -> dict[str, str]:
        """Live broker name -> address, sorted by name."""
        now = self._clock.monotonic_ms()
        return {
            name: self._brokers[name].address
            for name in sorted(self._brokers)
            if self._live(self._brokers[name], now)
        }

    def security_writer(self) -> str:
        """Address of the broker that changes users and ACL entries (see the module
        doc); "" if none is live."""
        return self.security_writer_term()[0]

    def security_writer_term(self) -> tuple[str, int]:
        """(address of the security writer, its term); term 0 while this name server
        is too new to grant the role (writer_terms.py); ("", 0) if no broker is live."""
        now = self._clock.monotonic_ms()
        live = [(b.created_ms, b.name) for b in self._brokers.values() if self._live(b, now)]
        holder, term = self._terms.writer(live, now)
        return (self._brokers[holder].address if holder else ""), term

    def status(self) -> list[BrokerStatus]:
        """Every registered broker, lapsed ones included until `expire()`, by name."""
        now = self._clock.monotonic_ms()
        return [
            BrokerStatus(
                name=b.name,
                address=b.address,
                last_heartbeat_ms_ago=max(0, int(now - b.last_seen_ms)),
                topics=len(b.topics),
            )
            for b in sorted(self._brokers.values(), key=lambda b: b.name)
        ]

    def conflicts(self) -> list[QueueConflict]:
        """Queues claimed by more than one live broker, by (topic, queue)."""
        now = self._clock.monotonic_ms()
        found = []
        for (topic, queue), claimants in sorted(self._claimants.items()):
            live = sorted(
                (seq, name)
                for name, seq in claimants.items()
                if self._live(self._brokers[name], now)
            )
            if len(live) > 1:
                found.append(QueueConflict(topic, queue, live[0][1], [n for _, n in live[1:]]))
        return found

    # ------------------------------------------------------------------ internals

    def _live(self, broker: _Broker, now: float) -> bool:
        return now - broker.last_seen_ms <= self._ttl

    def _route(self, topic: str, now: float) -> TopicRoute | None:
        registered = self._topic_brokers.get(topic, ())
        live = sorted(name for name in registered if self._live(self._brokers[name], now))
        if not live:
            return self._stale_route(topic, [self._brokers[name] for name in registered], now)
        regs = [self._brokers[name].topics[topic] for name in live]
        total = max(reg.total for reg in regs)
        static = [self._brokers[name] for name in live if topic in self._brokers[name].static]
        if static:
            return self._static_route(topic, total, regs[0].message_type, static, now)
        served: dict[int, str] = {}
        for reg in regs:
            for queue in reg.queues:
                if queue in served:
                    continue
                claimants = self._claimants[(topic, queue)]
                _, owner = min(
                    (seq, name)
                    for name, seq in claimants.items()
                    if self._live(self._brokers[name], now)
                )
                served[queue] = self._brokers[owner].address
        return TopicRoute(
            topic=topic,
            queues=total,
            message_type=regs[0].message_type,
            brokers=dict(sorted(served.items())),
        )

    def _static_route(
        self, topic: str, total: int, message_type: str, holders: list[_Broker], now: float
    ) -> TopicRoute:
        """A static topic's route: the newest chain of each queue among the live brokers
        that hold links of it; a queue is served by the broker of its open link, if live."""
        chains = newest(c for b in holders for c in b.static[topic])
        served: dict[int, str] = {}
        for queue, chain in chains.items():
            end = chain.write_end
            broker = self._brokers.get(end.broker) if end is not None else None
            if broker is not None and self._live(broker, now):
                served[queue] = broker.address
        return TopicRoute(
            topic=topic,
            queues=total,
            message_type=message_type,
            brokers=dict(sorted(served.items())),
            chains=[chains[q] for q in sorted(chains)],
        )

    def _stale_route(self, topic: str, lapsed: list[_Broker], now: float) -> TopicRoute | None:
        """The route of a topic no live broker serves: known, with no served queue, while
        a lapsed broker (not yet expired) or a recent stale entry remembers it."""
        regs = [b.topics[topic] for b in sorted(lapsed, key=lambda b: b.name)]
        stale = self._stale.get(topic)
        if stale is not None and stale[1] > now:
            regs.append(stale[0])
        if not regs:
            return None
        total = max(reg.total for reg in regs)
        return TopicRoute(topic=topic, queues=total, message_type=regs[0].message_type, brokers={})

    def _replace_topics(self, broker: _Broker, registered: dict[str, _TopicReg]) -> None:
        claims = {(topic, q) for topic, reg in registered.items() for q in reg.queues}
        for key in [key for key in broker.claims if key not in claims]:
            del broker.claims[key]
            self._drop_claimant(key, broker.name)
        for key in sorted(claims):
            if key not in broker.claims:
                broker.claims[key] = self._next_claim
                self._claimants.setdefault(key, {})[broker.name] = self._next_claim
                self._next_claim += 1
        for topic in broker.topics.keys() - registered.keys():
            self._drop_topic_broker(topic, broker.name)
        for topic in registered.keys() - broker.topics.keys():
            self._topic_brokers.setdefault(topic, set()).add(broker.name)
        broker.topics = registered

    def _remove(self, name: str) -> None:
        """Forget a broker that went away (lapsed or unregistered): its topics that no
        other broker registers become stale."""
        broker = self._brokers.pop(name)
        self._changes += 1
        for key in broker.claims:
            self._drop_claimant(key, name)
        for topic in broker.topics:
            self._drop_topic_broker(topic, name)
        if self._stale_ms == 0:
            return
        until = self._clock.monotonic_ms() + self._stale_ms
        for topic, reg in broker.topics.items():
            if topic in self._topic_brokers:
                continue
            previous = self._stale.pop(topic, None)
            kept = previous[0] if previous is not None and previous[0].total > reg.total else reg
            self._stale[topic] = (kept, until)
        while len(self._stale) > MAX_STALE_TOPICS:
            del self._stale[next(iter(self._stale))]

    def _drop_claimant(self, key: tuple[str, int], name: str) -> None:
        claimants = self._claimants[key]
        del claimants[name]
        if not claimants:
            del self._claimants[key]

    def _drop_topic_broker(self, topic: str, name: str) -> None:
        names = self._topic_brokers[topic]
        names.discard(name)
        if not names:
            del self._topic_brokers[topic]


def _check_topics(topics: list[TopicRegistration]) -> dict[str, _TopicReg]:
    if len(topics) > MAX_TOPICS_PER_BROKER:
        raise InvalidRequest(
            f"{len(topics)} topics in one registration, more than {MAX_TOPICS_PER_BROKER}"
        )
    registered: dict[str, _TopicReg] = {}
    claimed = 0
    for topic, total, message_type, hosted in topics:
        if not _TOPIC_NAME.match(topic):
            raise InvalidTopicName(
                f"invalid topic name {topic[:140]!r}: use 1-{limits.MAX_TOPIC_NAME_BYTES} "
                "characters from A-Z a-z 0-9 % _ . -"
            )
        if topic in registered:
            raise InvalidRequest(f"topic {topic!r} appears twice in one registration")
        if not 1 <= total <= limits.MAX_QUEUES_PER_TOPIC:
            raise InvalidRequest(
                f"topic {topic!r}: {total} queues, outside [1, {limits.MAX_QUEUES_PER_TOPIC}]"
            )
        if not _MESSAGE_TYPE.match(message_type):
            raise InvalidRequest(f"topic {topic!r}: invalid message type {message_type[:40]!r}")
        queues = tuple(sorted(set(hosted))) if hosted else tuple(range(total))
        if len(queues) != len(hosted) and hosted:
            raise InvalidRequest(f"topic {topic!r}: a hosted queue id appears twice")
        bad = queues[0] if queues[0] < 0 else queues[-1]
        if not 0 <= bad < total:
            raise InvalidRequest(f"topic {topic!r}: hosted queue id {bad} is outside [0, {total})")
        claimed += len(queues)
        if claimed > MAX_QUEUES_PER_BROKER:
            raise InvalidRequest(
                f"a registration may claim at most {MAX_QUEUES_PER_BROKER} queues in all"
            )
        registered[topic] = _TopicReg(total, message_type, queues)
    return registered


def _check_static(
    topics: list[StaticTopicReg], registered: dict[str, _TopicReg]
) -> dict[str, list[QueueChain]]:
    """Check a registration's static topics and add them to `registered` (no claims)."""
    static: dict[str, list[QueueChain]] = {}
    checked = _check_topics(
        [(t.topic, t.queues, t.message_type, [0]) for t in topics]  # name, count, type
    )
    for reg in topics:
        if reg.topic in registered:
            raise InvalidRequest(f"topic {reg.topic!r} is registered both static and not")
        if len({c.queue for c in reg.chains}) != len(reg.chains):
            raise InvalidRequest(f"static topic {reg.topic!r}: a queue's chain appears twice")
        for chain in reg.chains:
            check_chain(chain, reg.queues)
        registered[reg.topic] = _TopicReg(reg.queues, checked[reg.topic].message_type, ())
        static[reg.topic] = list(reg.chains)
    return static


def _check_leader_epoch(broker: _Broker, leader_epoch: int) -> None:
    """A replica group's name is held by its newest leader: a registration under an older
    epoch (a deposed leader that has not noticed yet) is refused."""
    if leader_epoch < broker.leader_epoch:
        raise InvalidRequest(
            f"broker {broker.name}: registration under replica epoch {leader_epoch} "
            f"refused; the group's leader registered under epoch {broker.leader_epoch}"
        )
