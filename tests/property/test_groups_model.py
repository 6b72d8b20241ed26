"""GroupCoordinator against a model of membership, liveness and generations.

The model tracks, per group, its members (subscription and deadline), the queue counts the
current assignment uses and the expected generation, bumped exactly where the coordinator's
contract says. The assignment itself is not modelled, only its invariants: every queue of
every subscribed topic is owned by exactly one member subscribed to it, members with equal
subscriptions differ by at most one queue, and what a member learns from a heartbeat (even
with a stale generation) is what `describe` says.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tidemq.broker.groups import NO_GENERATION, GroupCoordinator
from tidemq.core.errors import StaleGeneration, UnknownMember
from tidemq.testing.clock import ManualClock

GROUPS = ("g0", "g1")
TOPICS = ("t0", "t1", "t2")
MAX_QUEUES = 9
TIMEOUT_MIN = 6_000
TIMEOUT_MAX = 30_000

topic_sets = st.sets(st.sampled_from(TOPICS), min_size=1).map(sorted)
# A few round values so that time often lands exactly on a deadline (still alive there).
_ROUND = (TIMEOUT_MIN, 10_000, TIMEOUT_MAX)
timeouts = st.one_of(st.sampled_from(_ROUND), st.integers(TIMEOUT_MIN, TIMEOUT_MAX))
advances = st.one_of(st.sampled_from((1, *_ROUND)), st.integers(0, 15_000))
picks = st.integers(0, 1 << 16)


@dataclass
class _ModelMember:
    topics: list[str]
    deadline: float
    #: the last generation this member was told (by join or heartbeat)
    known_generation: int


@dataclass
class _ModelGroup:
    generation: int = 0
    members: dict[str, _ModelMember] = field(default_factory=dict)
    in_use: dict[str, int] = field(default_factory=dict)

    def subscribed(self) -> set[str]:
        return {t for m in self.members.values() for t in m.topics}


class GroupModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()
        ids = itertools.count(1)
        self.gc = GroupCoordinator(
            self.clock,
            session_timeout_ms_min=TIMEOUT_MIN,
            session_timeout_ms_max=TIMEOUT_MAX,
            member_id_factory=lambda client: f"{client}-{next(ids):04d}",
        )
        self.counts = {"t0": 1, "t1": 2, "t2": 3}
        self.groups = {g: _ModelGroup() for g in GROUPS}
        #: every (group, member id) ever issued, live or not
        self.issued: list[tuple[str, str]] = []
        self.timeouts: dict[str, int] = {}

    # ------------------------------------------------------------------ helpers

    def _refresh_counts(self, group: _ModelGroup, membership_changed: bool) -> None:
        in_use = {t: self.counts[t] for t in group.subscribed()}
        if membership_changed or in_use != group.in_use:
            group.generation += 1
        group.in_use = in_use

    def _live(self) -> list[tuple[str, str]]:
        return [(g, m) for g, m in self.issued if m in self.groups[g].members]

    # ------------------------------------------------------------------ rules

    @rule(group=st.sampled_from(GROUPS), topics=topic_sets, timeout=timeouts)
    def join_new(self, group: str, topics: list[str], timeout: int) -> None:
        a = self.gc.join(
            group,
            member_id="",
            client_id=group,
            topics=topics,
            session_timeout_ms=timeout,
            queue_counts=self.counts,
        )
        model = self.groups[group]
        model.members[a.member_id] = _ModelMember(
            topics, self.clock.monotonic_ms() + timeout, a.generation
        )
        self.timeouts[a.member_id] = timeout
        self.issued.append((group, a.member_id))
        self._refresh_counts(model, membership_changed=True)
        assert a.generation == model.generation

    @precondition(lambda self: bool(self._live()))
    @rule(pick=picks, topics=topic_sets, timeout=timeouts)
    def rejoin(self, pick: int, topics: list[str], timeout: int) -> None:
        group, member_id = self._live()[pick % len(self._live())]
        a = self.gc.join(
            group,
            member_id=member_id,
            client_id=group,
            topics=topics,
            session_timeout_ms=timeout,
            queue_counts=self.counts,
        )
        model = self.groups[group]
        member = model.members[member_id]
        changed = member.topics != topics
        member.topics = topics
        member.deadline = self.clock.monotonic_ms() + timeout
        self.timeouts[member_id] = timeout
        self._refresh_counts(model, membership_changed=changed)
        member.known_generation = a.generation
        assert (a.member_id, a.generation) == (member_id, model.generation)

    @precondition(lambda self: bool(self.issued))
    @rule(pick=picks)
    def heartbeat(self, pick: int) -> None:
        """A member heartbeats with the last generation it was told, however stale."""
        group, member_id = self.issued[pick % len(self.issued)]
        model = self.groups[group]
        member = model.members.get(member_id)
        if member is None:
            with pytest.raises(UnknownMember):
                self.gc.heartbeat(group, member_id, model.generation, self.counts)
            return
        a = self.gc.heartbeat(group, member_id, member.known_generation, self.counts)
        member.deadline = self.clock.monotonic_ms() + self.timeouts[member_id]
        self._refresh_counts(model, membership_changed=False)
        assert a.generation == model.generation
        described = {m.member_id: m.assignment for m in self.gc.describe(group).members}
        assert a.queues == described[member_id]
        member.known_generation = a.generation
        self.gc.check_commit(group, member_id, a.generation)  # it may commit now

    @precondition(lambda self: bool(self.issued))
    @rule(pick=picks)
    def leave(self, pick: int) -> None:
        group, member_id = self.issued[pick % len(self.issued)]
        model = self.groups[group]
        removed = self.gc.leave(group, member_id)
        assert removed == (member_id in model.members)
        if removed:
            del model.members[member_id]
            model.generation += 1
            model.in_use = {t: model.in_use[t] for t in model.subscribed()}

    @rule(ms=advances)
    def advance(self, ms: int) -> None:
        self.clock.advance(ms)

    @rule()
    def expire(self) -> None:
        now = self.clock.monotonic_ms()
        expected = set()
        for name, model in self.groups.items():
            gone = [m for m, member in model.members.items() if member.deadline < now]
            for member_id in gone:
                del model.members[member_id]
                expected.add((name, member_id))
            if gone:
                model.generation += 1
                model.in_use = {t: model.in_use[t] for t in model.subscribed()}
        assert set(self.gc.expire()) == expected

    @rule(topic=st.sampled_from(TOPICS), more=st.integers(1, 3))
    def add_queues(self, topic: str, more: int) -> None:
        self.counts[topic] = min(MAX_QUEUES, self.counts[topic] + more)

    @precondition(lambda self: bool(self.issued))
    @rule(pick=picks, delta=st.integers(-2, 1))
    def commit(self, pick: int, delta: int) -> None:
        group, member_id = self.issued[pick % len(self.issued)]
        model = self.groups[group]
        generation = model.generation + delta
        if member_id in model.members and delta == 0:
            self.gc.check_commit(group, member_id, generation)
        else:
            with pytest.raises(StaleGeneration):
                self.gc.check_commit(group, member_id, generation)

    @rule(group=st.sampled_from(GROUPS))
    def standalone_commit(self, group: str) -> None:
        if self.groups[group].members:
            with pytest.raises(StaleGeneration, match="active"):
                self.gc.check_commit(group, "", NO_GENERATION)
        else:
            self.gc.check_commit(group, "", NO_GENERATION)

    # ------------------------------------------------------------------ invariants

    @invariant()
    def generations_and_members_match_the_model(self) -> None:
        for name, model in self.groups.items():
            state = self.gc.describe(name)
            assert state.generation == model.generation  # so it never decreases either
            assert [m.member_id for m in state.members] == sorted(model.members)
            for m in state.members:
                assert m.topics == model.members[m.member_id].topics
        assert self.gc.groups() == sorted(g for g, m in self.groups.items() if m.members)

    @invariant()
    def every_subscribed_queue_has_exactly_one_subscribed_owner(self) -> None:
        for name, model in self.groups.items():
            state = self.gc.describe(name)
            owned = [(m.member_id, q) for m in state.members for q in m.assignment]
            queues = [q for _, q in owned]
            assert len(queues) == len(set(queues))
            expected = {(t, q) for t, n in model.in_use.items() for q in range(n)}
            assert set(queues) == expected
            for member_id, (topic, queue) in owned:
                assert topic in model.members[member_id].topics
                assert self.gc.assignment_owner(name, topic, queue) == member_id

    @invariant()
    def equal_subscriptions_get_equal_shares(self) -> None:
        for name in GROUPS:
            members = self.gc.describe(name).members
            if len({tuple(m.topics) for m in members}) == 1:
                loads = [len(m.assignment) for m in members]
                assert max(loads) - min(loads) <= 1

    @invariant()
    def only_the_current_generation_may_commit(self) -> None:
        for name, model in self.groups.items():
            for member_id in model.members:
                self.gc.check_commit(name, member_id, model.generation)
                with pytest.raises(StaleGeneration):
                    self.gc.check_commit(name, member_id, model.generation - 1)


GroupModel.TestCase.settings = settings(max_examples=100, stateful_step_count=40, deadline=None)
test_group_coordinator_matches_model = GroupModel.TestCase
