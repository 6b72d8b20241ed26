"""Consumer-group membership on the coordinating broker, with generation fencing.

A group is a set of members, each subscribed to some topics. The coordinator itself
assigns every queue of every subscribed topic to exactly one member subscribed to that
topic (no client-side assignors, unlike Kafka), so a membership change is one atomic
transition: the generation goes up by one and every member's assignment is recomputed.
There are no rebalance phases (Kafka's PreparingRebalance / CompletingRebalance) because
nobody has to be waited for. Members learn of a new generation from their next heartbeat.

Group states, per group name::

    (absent) --join--> ACTIVE --last member leaves/expires--> EMPTY --join--> ACTIVE
                                                              EMPTY --evicted--> (absent)

An EMPTY group keeps its generation, so generations of a group never go down while the
coordinator remembers it. Empty groups count against `max_groups`; when a new group needs
room, the group that has been empty longest is forgotten. That is safe: member ids are
random and never reissued, so no old member can match a restarted generation.

What bumps the generation (by exactly one per call):

* a join by a new member, or a rejoin that changes the member's topics;
* a leave, and every `expire()` that removes at least one member of the group;
* a join or heartbeat whose `queue_counts` give a different queue count for a topic the
  group subscribes to (a topic that gained queues, or a deleted topic passed as 0).

A rejoin with an unchanged subscription does not bump: a join retried after a lost
response must not start a rebalance storm.

Assignment (deterministic, a pure function of members and queue counts): topics in name
order, queues in id order, each queue to the member subscribed to its topic that holds the
fewest queues so far, ties to the smallest member id. When all members subscribe to the
same topics this is round-robin over the members sorted by id, continuing across topics.

Fencing: `check_commit` accepts an offset commit only from a member of the current
generation (or, with member id "" and generation -1, from outside any generation while the
group has no members). Reassignment is immediate on the coordinator, so a queue can be read
by its old and its new owner until the old owner's next heartbeat; the old owner's commits
are refused (StaleGeneration), so only the current owner's progress is committed and
delivery stays at-least-once.

`queue_counts` contract: the caller (the broker) passes topic -> queue count from its
metadata. Every topic the joining member subscribes to must be present (else TopicNotFound
and nothing changes). Any other topic may be absent: an absent topic keeps the count the
current assignment uses, so a caller may pass just the joiner's topics on a join and just
the group's topics on a heartbeat. To drop a deleted topic's queues from the assignment,
pass it with 0 queues (omitting it leaves its old queues assigned, which is harmless: the
owners' fetches fail with TopicNotFound).

Liveness uses the monotonic clock. A member is expired by the first `expire()` after its
last join or heartbeat is more than its session timeout ago (the broker calls `expire()`
every second or so); until then it is still a member and keeps its queues, which is safe
because nobody else owns them.

Not thread-safe; the broker calls it from its one event loop. No I/O.
"""

from __future__ import annotations

import heapq
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

from tidemq.core import limits, names
from tidemq.core.clock import Clock
from tidemq.core.errors import (
    ConfigError,
    InvalidRequest,
    StaleGeneration,
    TopicNotFound,
    UnknownMember,
)

__all__ = [
    "MAX_CLIENT_ID_CHARS",
    "MAX_GROUP_NAME_CHARS",
    "MAX_MEMBER_ID_CHARS",
    "MAX_SUBSCRIBED_TOPIC_CHARS",
    "MAX_TOPICS_PER_MEMBER",
    "NO_GENERATION",
    "Assignment",
    "GroupCoordinator",
    "GroupState",
    "MemberState",
    "assign_queues",
    "check_group_name",
]

#: Group names on the wire: RocketMQ allows 255 characters. A user's group name follows
#: `tidemq.core.names` (at most 120); internal ones (g%BROADCAST%member) are longer.
MAX_GROUP_NAME_CHARS: Final = 255
#: Topic names in a subscription. The store's own limit is lower; an over-long name is
#: refused here before it is looked up, an unknown one by TopicNotFound.
MAX_SUBSCRIBED_TOPIC_CHARS: Final = 255
#: Client ids are free text chosen by the client (host name, process name, ...).
MAX_CLIENT_ID_CHARS: Final = 255
#: Member ids are issued here; a rejoin echoes one back, so anything longer is not ours.
MAX_MEMBER_ID_CHARS: Final = 255
#: Topics one member subscribes to: bounds the work of one assignment per member.
MAX_TOPICS_PER_MEMBER: Final = 1_000
#: The generation of a commit made from outside any generation (standalone consumer,
#: admin tool), always with member id "".
NO_GENERATION: Final = -1
#: Characters of the client id kept as a readable prefix of a generated member id.
_MEMBER_ID_PREFIX_CHARS: Final = 64
#: Attempts to draw a member id not already in the group before giving up. Random ids
#: collide with probability ~members/2**48; a factory that keeps colliding is broken.
_MEMBER_ID_ATTEMPTS: Final = 8
#: The deadline heap is rebuilt once it holds this many more entries than twice the live
#: members (every heartbeat pushes one; superseded entries are dropped lazily).
_HEAP_SLACK: Final = 1_024


def _random_member_id(client_id: str) -> str:
    return f"{client_id[:_MEMBER_ID_PREFIX_CHARS] or 'member'}-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True, slots=True)
class Assignment:
    """What a member owns in one generation. `queues` is sorted (topic, queue id)."""

    member_id: str
    generation: int
    queues: list[tuple[str, int]]


@dataclass(frozen=True, slots=True)
class MemberState:
    member_id: str
    client_id: str
    assignment: list[tuple[str, int]]
    topics: list[str]


@dataclass(frozen=True, slots=True)
class GroupState:
    """A snapshot. A group the coordinator does not know has generation 0 and no members."""

    group: str
    generation: int
    members: list[MemberState]


@dataclass(slots=True)
class _Member:
    member_id: str
    client_id: str
    topics: tuple[str, ...]  # sorted, distinct
    session_timeout_ms: int
    deadline_ms: float  # expired once the monotonic clock is past this
    queues: tuple[tuple[str, int], ...] = ()


@dataclass(slots=True)
class _Group:
    name: str
    generation: int = 0
    members: dict[str, _Member] = field(default_factory=dict)
    #: Queue count per subscribed topic, as used by the current assignment.
    counts: dict[str, int] = field(default_factory=dict)
    #: Subscribed topic -> number of members subscribing to it.
    topic_refs: dict[str, int] = field(default_factory=dict)
    owners: dict[tuple[str, int], str] = field(default_factory=dict)


def assign_queues(
    subscriptions: Mapping[str, Iterable[str]], queue_counts: Mapping[str, int]
) -> dict[str, list[tuple[str, int]]]:
    """member id -> sorted queues: every queue of every subscribed topic to exactly one
    member subscribed to it (topics in name order, queues in id order, each to the
    subscriber holding the fewest queues so far, ties to the smallest member id). Topics
    missing from `queue_counts` have no queues."""
    load = dict.fromkeys(subscriptions, 0)
    subscribers: dict[str, list[str]] = {}
    for member_id in sorted(subscriptions):
        for topic in set(subscriptions[member_id]):
            subscribers.setdefault(topic, []).append(member_id)
    result: dict[str, list[tuple[str, int]]] = {member_id: [] for member_id in subscriptions}
    for topic in sorted(subscribers):
        # A heap of (load, member id): the least loaded subscriber, ties by id.
        heap = [(load[member_id], member_id) for member_id in subscribers[topic]]
        heapq.heapify(heap)
        for queue in range(queue_counts.get(topic, 0)):
            held, member_id = heap[0]
            result[member_id].append((topic, queue))
            load[member_id] = held + 1
            heapq.heapreplace(heap, (held + 1, member_id))
    for queues in result.values():
        queues.sort()
    return result


class GroupCoordinator:
    """Membership, assignment and fencing of every consumer group on this broker."""

    def __init__(
        self,
        clock: Clock,
        *,
        session_timeout_ms_min: int = 6_000,
        session_timeout_ms_max: int = 300_000,
        max_members_per_group: int = 1_000,
        max_groups: int = 100_000,
        member_id_factory: Callable[[str], str] | None = None,
    ) -> None:
        """`member_id_factory(client_id)` issues new member ids (default: the client id,
        a dash and 12 random hex digits); tests pass a deterministic one."""
        if not 0 < session_timeout_ms_min <= session_timeout_ms_max:
            raise ConfigError(
                "group session timeouts need 0 < session_timeout_ms_min <= "
                f"session_timeout_ms_max, got {session_timeout_ms_min} and "
                f"{session_timeout_ms_max}"
            )
        if max_members_per_group < 1:
            raise ConfigError(f"max_members_per_group must be >= 1, got {max_members_per_group}")
        if max_groups < 1:
            raise ConfigError(f"max_groups must be >= 1, got {max_groups}")
        self._clock = clock
        self._timeout_min = session_timeout_ms_min
        self._timeout_max = session_timeout_ms_max
        self._max_members = max_members_per_group
        self._max_groups = max_groups
        self._new_member_id = member_id_factory or _random_member_id
        self._groups: dict[str, _Group] = {}
        #: Names of EMPTY groups, longest empty first (dicts keep insertion order).
        self._empty: dict[str, None] = {}
        #: (deadline, group, member id); an entry is current only while it equals the
        #: member's deadline, older ones are skipped when they surface.
        self._deadlines: list[tuple[float, str, str]] = []
        self._live_members = 0

    # ------------------------------------------------------------------ membership

    def join(
        self,
        group: str,
        *,
        member_id: str,
        client_id: str,
        topics: list[str],
        session_timeout_ms: int,
        queue_counts: Mapping[str, int],
    ) -> Assignment:
        """Join (member_id "") or rejoin (a member id this group issued) and return the
        assignment. Raises InvalidRequest for malformed names, an out-of-range session
        timeout, or a full group or coordinator; TopicNotFound for a subscribed topic
        missing from `queue_counts`; UnknownMember for a non-empty member id the group
        does not hold (expired or never issued: join again with "")."""
        _check_name("group", group, MAX_GROUP_NAME_CHARS)
        _check_text("client id", client_id, MAX_CLIENT_ID_CHARS)
        if len(member_id) > MAX_MEMBER_ID_CHARS:
            raise InvalidRequest(f"member id longer than {MAX_MEMBER_ID_CHARS} characters")
        subscription = self._check_topics(topics, queue_counts)
        if not self._timeout_min <= session_timeout_ms <= self._timeout_max:
            raise InvalidRequest(
                f"session_timeout_ms {session_timeout_ms} is outside the broker's bounds "
                f"[{self._timeout_min}, {self._timeout_max}]"
            )
        state = self._groups.get(group)
        if member_id:
            known = state.members.get(member_id) if state is not None else None
            if state is None or known is None:
                raise UnknownMember(
                    f"member {member_id!r} is not in group {group!r} (expired or never "
                    "joined): join again with an empty member id"
                )
            refs = _refs_after(state.topic_refs, known.topics, subscription)
            counts = _counts_for(refs, queue_counts, state.counts)
            changed = known.topics != subscription
            known.client_id = client_id
            known.topics = subscription
            state.topic_refs = refs
            self._refresh(state, known, session_timeout_ms)
            self._reassign_if(state, changed, counts)
            return _assignment(state, known)

        if state is not None and len(state.members) >= self._max_members:
            raise InvalidRequest(
                f"group {group!r} already has {len(state.members)} members, the broker's "
                "max_members_per_group"
            )
        in_use = state.counts if state is not None else {}
        refs = _refs_after(state.topic_refs if state is not None else {}, (), subscription)
        counts = _counts_for(refs, queue_counts, in_use)
        new_id = self._issue_member_id(group, state, client_id)
        if state is None:
            state = self._create_group(group)
        member = _Member(new_id, client_id, subscription, session_timeout_ms, 0.0)
        state.members[new_id] = member
        state.topic_refs = refs
        self._live_members += 1
        self._empty.pop(group, None)
        self._refresh(state, member, session_timeout_ms)
        self._reassign_if(state, True, counts)
        return _assignment(state, member)

    def heartbeat(
        self, group: str, member_id: str, generation: int, queue_counts: Mapping[str, int]
    ) -> Assignment:
        """Keep the member alive and return the current generation and its assignment.

        An older `generation` is not an error: the answer carries the new one, which is how
        members learn of rebalances. Raises UnknownMember if the member is not in the group
        (it must join again) and InvalidRequest for a generation the group never reached."""
        state = self._groups.get(group)
        member = state.members.get(member_id) if state is not None else None
        if state is None or member is None:
            raise UnknownMember(
                f"member {member_id!r} is not in group {group!r} (expired or never joined): "
                "join again with an empty member id"
            )
        if generation > state.generation:
            raise InvalidRequest(
                f"generation {generation} is newer than group {group!r}'s current "
                f"generation {state.generation}"
            )
        counts = _counts_for(state.topic_refs, queue_counts, state.counts)
        self._refresh(state, member, member.session_timeout_ms)
        self._reassign_if(state, False, counts)
        return _assignment(state, member)

    def leave(self, group: str, member_id: str) -> bool:
        """Remove the member; False (and nothing changes) if it was not in the group, so a
        leave after an expiry or a retried leave is harmless."""
        state = self._groups.get(group)
        if state is None or member_id not in state.members:
            return False
        self._remove(state, [member_id])
        return True

    def expire(self) -> list[tuple[str, str]]:
        """Remove every member whose last join or heartbeat is more than its session
        timeout ago; one generation bump per affected group. Returns (group, member id)
        in expiry order."""
        now = self._clock.monotonic_ms()
        # group -> member ids (a dict as an ordered set: equal deadlines may be queued twice)
        expired: dict[str, dict[str, None]] = {}
        while self._deadlines and self._deadlines[0][0] < now:
            deadline, group, member_id = heapq.heappop(self._deadlines)
            state = self._groups.get(group)
            member = state.members.get(member_id) if state is not None else None
            if member is not None and member.deadline_ms == deadline:
                expired.setdefault(group, {})[member_id] = None
        for group, member_ids in expired.items():
            self._remove(self._groups[group], list(member_ids))
        return [(group, member_id) for group, ids in expired.items() for member_id in ids]

    # ------------------------------------------------------------------ fencing

    def check_commit(self, group: str, member_id: str, generation: int) -> None:
        """Raise StaleGeneration unless an offset commit from (member_id, generation) may
        be applied: a member of the group's current generation, or member id "" with
        generation -1 while the group has no members."""
        state = self._groups.get(group)
        members = len(state.members) if state is not None else 0
        current = state.generation if state is not None else 0
        if not member_id:
            if generation != NO_GENERATION:
                raise InvalidRequest(
                    f"a commit without a member id must carry generation {NO_GENERATION}, "
                    f"got {generation}"
                )
            if members:
                raise StaleGeneration(
                    f"group {group!r} is active (generation {current}, {members} members): "
                    "only its members may commit offsets"
                )
            return
        if state is None or member_id not in state.members:
            raise StaleGeneration(
                f"member {member_id!r} is not in group {group!r}: join again before committing"
            )
        if generation != current:
            raise StaleGeneration(
                f"generation {generation} of group {group!r} is not the current generation "
                f"{current}: heartbeat to take the new assignment before committing"
            )

    # ------------------------------------------------------------------ queries

    def describe(self, group: str) -> GroupState:
        state = self._groups.get(group)
        if state is None:
            return GroupState(group, 0, [])
        members = [
            MemberState(m.member_id, m.client_id, list(m.queues), list(m.topics))
            for m in sorted(state.members.values(), key=lambda m: m.member_id)
        ]
        return GroupState(group, state.generation, members)

    def groups(self) -> list[str]:
        """Groups that have members, sorted."""
        return sorted(name for name, state in self._groups.items() if state.members)

    def assignment_owner(self, group: str, topic: str, queue: int) -> str | None:
        """The member that owns the queue in the current generation, or None."""
        state = self._groups.get(group)
        return state.owners.get((topic, queue)) if state is not None else None

    # ------------------------------------------------------------------ internals

    def _check_topics(self, topics: list[str], queue_counts: Mapping[str, int]) -> tuple[str, ...]:
        if not topics:
            raise InvalidRequest("a member must subscribe to at least one topic")
        subscription = tuple(sorted(set(topics)))
        if len(subscription) > MAX_TOPICS_PER_MEMBER:
            raise InvalidRequest(
                f"{len(subscription)} topics in one subscription, more than {MAX_TOPICS_PER_MEMBER}"
            )
        for topic in subscription:
            _check_name("topic", topic, MAX_SUBSCRIBED_TOPIC_CHARS)
        missing = [topic for topic in subscription if topic not in queue_counts]
        if missing:
            raise TopicNotFound(f"subscribed topics not found: {', '.join(missing[:10])}")
        return subscription

    def _create_group(self, group: str) -> _Group:
        if len(self._groups) >= self._max_groups:
            if not self._empty:
                raise InvalidRequest(
                    f"the coordinator already holds {len(self._groups)} active groups, its "
                    "max_groups"
                )
            oldest = next(iter(self._empty))
            del self._empty[oldest]
            del self._groups[oldest]
        state = _Group(group)
        self._groups[group] = state
        return state

    def _issue_member_id(self, group: str, state: _Group | None, client_id: str) -> str:
        for _ in range(_MEMBER_ID_ATTEMPTS):
            candidate = self._new_member_id(client_id)
            if (
                candidate
                and len(candidate) <= MAX_MEMBER_ID_CHARS
                and (state is None or candidate not in state.members)
            ):
                return candidate
        raise InvalidRequest(f"could not issue a unique member id in group {group!r}")

    def _refresh(self, state: _Group, member: _Member, session_timeout_ms: int) -> None:
        member.session_timeout_ms = session_timeout_ms
        deadline = self._clock.monotonic_ms() + session_timeout_ms
        if deadline == member.deadline_ms:
            return  # already queued
        member.deadline_ms = deadline
        heapq.heappush(self._deadlines, (member.deadline_ms, state.name, member.member_id))
        if len(self._deadlines) > 2 * self._live_members + _HEAP_SLACK:
            self._deadlines = [
                (m.deadline_ms, g.name, m.member_id)
                for g in self._groups.values()
                for m in g.members.values()
            ]
            heapq.heapify(self._deadlines)

    def _remove(self, state: _Group, member_ids: list[str]) -> None:
        refs = state.topic_refs
        for member_id in member_ids:
            refs = _refs_after(refs, state.members.pop(member_id).topics, ())
        state.topic_refs = refs
        self._live_members -= len(member_ids)
        if not state.members:
            self._empty[state.name] = None
        # Topics nobody subscribes to any more drop out; the rest keep their counts.
        self._reassign_if(state, True, {t: state.counts.get(t, 0) for t in refs})

    def _reassign_if(self, state: _Group, membership_changed: bool, counts: dict[str, int]) -> None:
        """Bump the generation and recompute the assignment if the membership changed or the
        queue counts of the subscribed topics (`counts`) differ from the ones in use."""
        if not membership_changed and counts == state.counts:
            return
        state.generation += 1
        state.counts = counts
        assigned = assign_queues({m.member_id: m.topics for m in state.members.values()}, counts)
        state.owners = {}
        for member_id, queues in assigned.items():
            state.members[member_id].queues = tuple(queues)
            for queue in queues:
                state.owners[queue] = member_id


def _assignment(state: _Group, member: _Member) -> Assignment:
    return Assignment(member.member_id, state.generation, list(member.queues))


def _check_text(what: str, value: str, max_chars: int) -> None:
    if len(value) > max_chars:
        raise InvalidRequest(f"{what} longer than {max_chars} characters: {value[:40]!r}...")
    if not value.isprintable():
        raise InvalidRequest(f"{what} {value[:max_chars]!r} contains control characters")


def _check_name(what: str, value: str, max_chars: int) -> None:
    if not value:
        raise InvalidRequest(f"{what} name must not be empty")
    _check_text(f"{what} name", value, max_chars)
    valid = names.is_group_name(value) if what == "group" else names.is_topic_name(value)
    if not valid:
        problem = names.user_name_problem(value, group=what == "group")
        problem = problem or "is not one of tidemq's internal names"
        raise InvalidRequest(f"{what} name {value!r} {problem}; use {names.NAME_RULE}")


def check_group_name(group: str) -> None:
    """Refuse, with InvalidRequest, a group name outside `tidemq.core.names` (user names,
    and the internal %REDRIVE%g and g%BROADCAST%member under which clients commit)."""
    _check_name("group", group, MAX_GROUP_NAME_CHARS)


def _refs_after(
    refs: Mapping[str, int], removed: Iterable[str], added: Iterable[str]
) -> dict[str, int]:
    """Subscriber counts per topic after a member drops `removed` and takes `added`."""
    after = dict(refs)
    for topic in removed:
        after[topic] -= 1
        if not after[topic]:
            del after[topic]
    for topic in added:
        after[topic] = after.get(topic, 0) + 1
    return after


def _counts_for(
    topics: Iterable[str], queue_counts: Mapping[str, int], in_use: Mapping[str, int]
) -> dict[str, int]:
    """Queue counts of the group's topics: from `queue_counts`, else the count in use."""
    counts = {topic: queue_counts.get(topic, in_use.get(topic, 0)) for topic in topics}
    for topic, count in counts.items():
        # The mapping is the broker's own metadata: an impossible count is a bug there,
        # worth a loud error rather than a huge assignment.
        if not 0 <= count <= limits.MAX_QUEUES_PER_TOPIC:
            raise InvalidRequest(
                f"topic {topic!r} has {count} queues, outside [0, {limits.MAX_QUEUES_PER_TOPIC}]"
            )
    return counts
