"""GroupCoordinator: membership, deterministic assignment, generation fencing, expiry."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest

from tidemq.broker.groups import (
    MAX_GROUP_NAME_CHARS,
    MAX_TOPICS_PER_MEMBER,
    NO_GENERATION,
    Assignment,
    GroupCoordinator,
    assign_queues,
)
from tidemq.core.errors import (
    ConfigError,
    InvalidRequest,
    StaleGeneration,
    TopicNotFound,
    UnknownMember,
)
from tidemq.testing.clock import ManualClock

SESSION = 10_000
COUNTS = {"orders": 4, "payments": 2, "audit": 1}


def _ids() -> Callable[[str], str]:
    counter = itertools.count(1)
    return lambda client_id: f"{client_id or 'member'}-{next(counter):03d}"


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def gc(clock: ManualClock) -> GroupCoordinator:
    return GroupCoordinator(clock, member_id_factory=_ids())


def _join(
    gc: GroupCoordinator,
    group: str = "g",
    *,
    member_id: str = "",
    client_id: str = "c",
    topics: list[str] | None = None,
    session_timeout_ms: int = SESSION,
    queue_counts: dict[str, int] | None = None,
) -> Assignment:
    return gc.join(
        group,
        member_id=member_id,
        client_id=client_id,
        topics=["orders"] if topics is None else topics,
        session_timeout_ms=session_timeout_ms,
        queue_counts=COUNTS if queue_counts is None else queue_counts,
    )


# ------------------------------------------------------------------ join


def test_first_join_gets_a_new_member_id_generation_one_and_every_queue(
    gc: GroupCoordinator,
) -> None:
    a = _join(gc, client_id="host-1")
    assert a.member_id == "host-1-001"
    assert a.generation == 1
    assert a.queues == [("orders", q) for q in range(4)]


def test_default_member_ids_are_unique_and_start_with_the_client_id(clock: ManualClock) -> None:
    gc = GroupCoordinator(clock)
    ids = {_join(gc, client_id="host-1").member_id for _ in range(20)}
    assert len(ids) == 20
    assert all(i.startswith("host-1-") and len(i) == len("host-1-") + 12 for i in ids)
    assert _join(gc, client_id="").member_id.startswith("member-")


def test_each_join_bumps_the_generation_and_splits_queues_round_robin_by_member_id(
    gc: GroupCoordinator,
) -> None:
    a = _join(gc)
    b = _join(gc)
    assert b.generation == 2
    assert gc.describe("g").generation == 2
    state = {m.member_id: m.assignment for m in gc.describe("g").members}
    assert state == {
        a.member_id: [("orders", 0), ("orders", 2)],
        b.member_id: [("orders", 1), ("orders", 3)],
    }


def test_rejoin_with_same_subscription_keeps_id_and_generation(gc: GroupCoordinator) -> None:
    a = _join(gc)
    _join(gc)
    again = _join(gc, member_id=a.member_id)
    assert again.member_id == a.member_id
    assert again.generation == 2  # a retried join must not start a rebalance


def test_rejoin_with_new_topics_bumps_and_reassigns(gc: GroupCoordinator) -> None:
    a = _join(gc)
    again = _join(gc, member_id=a.member_id, topics=["orders", "payments"])
    assert again.generation == 2
    assert again.queues == [("orders", q) for q in range(4)] + [("payments", 0), ("payments", 1)]
    assert gc.describe("g").members[0].topics == ["orders", "payments"]


def test_rejoin_with_an_unknown_member_id_must_join_again_with_an_empty_id(
    gc: GroupCoordinator,
) -> None:
    _join(gc)
    with pytest.raises(UnknownMember, match="join again"):
        _join(gc, member_id="made-up")
    with pytest.raises(UnknownMember):
        _join(gc, "other-group", member_id="made-up")
    assert gc.describe("g").generation == 1


def test_members_get_only_queues_of_topics_they_subscribe_to(gc: GroupCoordinator) -> None:
    a = _join(gc, topics=["orders"])
    b = _join(gc, topics=["payments", "orders"])
    state = {m.member_id: m.assignment for m in gc.describe("g").members}
    # orders is shared 2/2; payments has only b as subscriber.
    assert state[a.member_id] == [("orders", 0), ("orders", 2)]
    assert state[b.member_id] == [("orders", 1), ("orders", 3), ("payments", 0), ("payments", 1)]


def test_round_robin_continues_across_topics_so_small_topics_spread() -> None:
    subs = {m: ["a", "b", "c"] for m in ("m1", "m2", "m3")}
    assigned = assign_queues(subs, {"a": 1, "b": 1, "c": 1})
    assert assigned == {"m1": [("a", 0)], "m2": [("b", 0)], "m3": [("c", 0)]}


def test_assignment_is_a_pure_function_of_members_and_counts() -> None:
    subs = {"z": ["t1", "t2"], "a": ["t2"], "m": ["t1"]}
    first = assign_queues(subs, {"t1": 5, "t2": 7})
    second = assign_queues(dict(reversed(subs.items())), {"t2": 7, "t1": 5})
    assert first == second
    owned = sorted(q for queues in first.values() for q in queues)
    assert owned == [("t1", q) for q in range(5)] + [("t2", q) for q in range(7)]


def test_more_members_than_queues_leaves_some_members_idle(gc: GroupCoordinator) -> None:
    members = [_join(gc, topics=["audit"]).member_id for _ in range(3)]
    owners = {m.member_id: m.assignment for m in gc.describe("g").members}
    assert owners[members[0]] == [("audit", 0)]
    assert owners[members[1]] == owners[members[2]] == []


def test_join_with_an_unknown_topic_raises_topic_not_found_and_changes_nothing(
    gc: GroupCoordinator,
) -> None:
    _join(gc)
    with pytest.raises(TopicNotFound, match="nope"):
        _join(gc, topics=["orders", "nope"])
    assert gc.describe("g").generation == 1
    assert len(gc.describe("g").members) == 1


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"group": ""}, "group name must not be empty"),
        ({"group": "g" * (MAX_GROUP_NAME_CHARS + 1)}, "longer than 255"),
        ({"group": "bad\nname"}, "control characters"),
        ({"topics": []}, "at least one topic"),
        ({"topics": [""]}, "topic name must not be empty"),
        ({"topics": ["t" * 256]}, "longer than 255"),
        ({"client_id": "c" * 256}, "client id longer"),
        ({"member_id": "m" * 256}, "member id longer"),
        ({"session_timeout_ms": 5_999}, r"session_timeout_ms 5999 .*\[6000, 300000\]"),
        ({"session_timeout_ms": 300_001}, "outside the broker's bounds"),
        ({"queue_counts": {"orders": -1}}, "outside"),
        ({"queue_counts": {"orders": 5000}}, "outside"),
    ],
)
def test_join_validates_its_request(
    gc: GroupCoordinator, kwargs: dict[str, object], match: str
) -> None:
    args: dict[str, object] = {
        "group": "g",
        "member_id": "",
        "client_id": "c",
        "topics": ["orders"],
        "session_timeout_ms": SESSION,
        "queue_counts": COUNTS,
    }
    args.update(kwargs)
    with pytest.raises(InvalidRequest, match=match):
        gc.join(**args)  # type: ignore[arg-type]
    assert gc.groups() == []


def test_join_refuses_too_many_topics(gc: GroupCoordinator) -> None:
    topics = [f"t{i}" for i in range(MAX_TOPICS_PER_MEMBER + 1)]
    with pytest.raises(InvalidRequest, match="topics in one subscription"):
        _join(gc, topics=topics, queue_counts=dict.fromkeys(topics, 1))


def test_duplicate_topics_in_a_subscription_count_once(gc: GroupCoordinator) -> None:
    a = _join(gc, topics=["orders", "orders"])
    assert a.queues == [("orders", q) for q in range(4)]
    assert gc.describe("g").members[0].topics == ["orders"]


def test_member_limit_per_group(clock: ManualClock) -> None:
    gc = GroupCoordinator(clock, max_members_per_group=2, member_id_factory=_ids())
    _join(gc)
    _join(gc)
    with pytest.raises(InvalidRequest, match="max_members_per_group"):
        _join(gc)
    _join(gc, "other")  # the limit is per group
    assert gc.describe("g").generation == 2


def test_group_limit_forgets_the_longest_empty_group_first(clock: ManualClock) -> None:
    gc = GroupCoordinator(clock, max_groups=2, member_id_factory=_ids())
    a = _join(gc, "g1")
    _join(gc, "g2")
    with pytest.raises(InvalidRequest, match="max_groups"):
        _join(gc, "g3")
    gc.leave("g1", a.member_id)
    assert gc.describe("g1").generation == 2  # EMPTY keeps its generation
    _join(gc, "g3")  # room made by forgetting g1
    assert gc.describe("g1").generation == 0
    assert gc.groups() == ["g2", "g3"]


def test_member_id_factory_collisions_are_retried_then_refused(clock: ManualClock) -> None:
    gc = GroupCoordinator(clock, member_id_factory=lambda _client: "same")
    assert _join(gc).member_id == "same"
    with pytest.raises(InvalidRequest, match="unique member id"):
        _join(gc)
    assert len(gc.describe("g").members) == 1


@pytest.mark.parametrize(
    "kwargs",
    [
        {"session_timeout_ms_min": 0},
        {"session_timeout_ms_min": 10, "session_timeout_ms_max": 9},
        {"max_members_per_group": 0},
        {"max_groups": 0},
    ],
)
def test_constructor_rejects_bad_config(clock: ManualClock, kwargs: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        GroupCoordinator(clock, **kwargs)


# ------------------------------------------------------------------ heartbeat


def test_heartbeat_with_an_old_generation_returns_the_new_assignment(
    gc: GroupCoordinator,
) -> None:
    a = _join(gc)
    b = _join(gc)
    hb = gc.heartbeat("g", a.member_id, a.generation, COUNTS)
    assert hb == Assignment(a.member_id, b.generation, [("orders", 0), ("orders", 2)])


def test_heartbeat_from_an_unknown_member_raises_unknown_member(gc: GroupCoordinator) -> None:
    _join(gc)
    with pytest.raises(UnknownMember):
        gc.heartbeat("g", "ghost", 1, COUNTS)
    with pytest.raises(UnknownMember):
        gc.heartbeat("no-such-group", "ghost", 1, COUNTS)


def test_heartbeat_with_a_generation_from_the_future_is_invalid(gc: GroupCoordinator) -> None:
    a = _join(gc)
    with pytest.raises(InvalidRequest, match="newer"):
        gc.heartbeat("g", a.member_id, 7, COUNTS)


def test_heartbeat_that_sees_new_queues_bumps_and_reassigns(gc: GroupCoordinator) -> None:
    a = _join(gc)
    b = _join(gc)
    grown = {**COUNTS, "orders": 6}
    hb = gc.heartbeat("g", a.member_id, b.generation, grown)
    assert hb.generation == 3
    assert hb.queues == [("orders", 0), ("orders", 2), ("orders", 4)]
    assert gc.assignment_owner("g", "orders", 5) == b.member_id
    # The same counts again: nothing changes.
    assert gc.heartbeat("g", b.member_id, 3, grown).generation == 3


def test_heartbeat_counts_for_unsubscribed_topics_do_not_rebalance(gc: GroupCoordinator) -> None:
    a = _join(gc)
    assert gc.heartbeat("g", a.member_id, 1, {"orders": 4, "payments": 99}).generation == 1


def test_absent_topics_keep_their_counts_and_zero_drops_a_deleted_topic(
    gc: GroupCoordinator,
) -> None:
    a = _join(gc, topics=["orders", "payments"])
    # A caller may pass only the group's topics it still has; absent means "unchanged".
    assert gc.heartbeat("g", a.member_id, 1, {"orders": 4}).queues == a.queues
    # A second member joining with only its own topic's count does not zero the others.
    b = _join(gc, topics=["audit"], queue_counts={"audit": 1})
    assert gc.assignment_owner("g", "payments", 1) == a.member_id
    assert b.queues == [("audit", 0)]
    # Deleted topic, passed as 0: its queues leave the assignment.
    hb = gc.heartbeat("g", a.member_id, b.generation, {"payments": 0})
    assert hb.generation == b.generation + 1
    assert hb.queues == [("orders", q) for q in range(4)]


def test_heartbeat_refreshes_liveness(gc: GroupCoordinator, clock: ManualClock) -> None:
    a = _join(gc)
    for _ in range(5):
        clock.advance(SESSION - 1)
        gc.heartbeat("g", a.member_id, a.generation, COUNTS)
        assert gc.expire() == []
    assert gc.groups() == ["g"]


# ------------------------------------------------------------------ leave and expiry


def test_leave_bumps_and_gives_the_queues_to_the_rest(gc: GroupCoordinator) -> None:
    a = _join(gc)
    b = _join(gc)
    assert gc.leave("g", a.member_id) is True
    state = gc.describe("g")
    assert state.generation == 3
    assert [(m.member_id, m.assignment) for m in state.members] == [
        (b.member_id, [("orders", q) for q in range(4)])
    ]


def test_leave_of_an_unknown_member_is_a_harmless_no_op(gc: GroupCoordinator) -> None:
    _join(gc)
    assert gc.leave("g", "ghost") is False
    assert gc.leave("nope", "ghost") is False
    assert gc.describe("g").generation == 1


def test_last_member_leaving_empties_the_group_but_keeps_its_generation(
    gc: GroupCoordinator,
) -> None:
    a = _join(gc)
    gc.leave("g", a.member_id)
    assert gc.groups() == []
    assert gc.describe("g").generation == 2
    assert gc.assignment_owner("g", "orders", 0) is None
    assert _join(gc).generation == 3


def test_expire_removes_members_silent_longer_than_their_session_timeout(
    gc: GroupCoordinator, clock: ManualClock
) -> None:
    short = _join(gc, session_timeout_ms=6_000)
    long = _join(gc, session_timeout_ms=20_000)
    clock.advance(6_000)
    assert gc.expire() == []  # exactly at the timeout: still alive
    clock.advance(1)
    assert gc.expire() == [("g", short.member_id)]
    state = gc.describe("g")
    assert state.generation == 3
    assert [m.member_id for m in state.members] == [long.member_id]
    with pytest.raises(UnknownMember):
        gc.heartbeat("g", short.member_id, 2, COUNTS)
    clock.advance(20_000)
    assert gc.expire() == [("g", long.member_id)]
    assert gc.groups() == []


def test_expire_bumps_each_group_once_however_many_members_it_loses(
    gc: GroupCoordinator, clock: ManualClock
) -> None:
    for _ in range(3):
        _join(gc, "g1")
    _join(gc, "g2")
    clock.advance(SESSION + 1)
    assert len(gc.expire()) == 4
    assert gc.describe("g1").generation == 4
    assert gc.describe("g2").generation == 2


def test_a_deadline_queued_twice_expires_the_member_once(
    gc: GroupCoordinator, clock: ManualClock
) -> None:
    a = _join(gc, session_timeout_ms=20_000)  # deadline 20_000
    clock.advance(1_000)
    gc.heartbeat("g", a.member_id, 1, COUNTS)  # deadline 21_000
    clock.advance(13_000)
    _join(gc, member_id=a.member_id, session_timeout_ms=6_000)  # deadline 20_000 again
    clock.advance(6_001)
    assert gc.expire() == [("g", a.member_id)]
    assert gc.expire() == []


def test_rejoin_refreshes_liveness_and_can_shorten_the_session(
    gc: GroupCoordinator, clock: ManualClock
) -> None:
    a = _join(gc, session_timeout_ms=20_000)
    clock.advance(15_000)
    _join(gc, member_id=a.member_id, session_timeout_ms=6_000)
    clock.advance(6_001)
    assert gc.expire() == [("g", a.member_id)]


def test_many_heartbeats_do_not_grow_the_deadline_heap_without_bound(
    gc: GroupCoordinator, clock: ManualClock
) -> None:
    a = _join(gc)
    for _ in range(5_000):
        clock.advance(1)  # each heartbeat queues a new deadline; old ones are superseded
        gc.heartbeat("g", a.member_id, 1, COUNTS)
        gc.heartbeat("g", a.member_id, 1, COUNTS)  # same deadline: not queued twice
    assert len(gc._deadlines) <= 2 + 1_024 + 1
    clock.advance(SESSION + 1)
    assert gc.expire() == [("g", a.member_id)]


# ------------------------------------------------------------------ fencing


def test_check_commit_accepts_only_the_current_generation(gc: GroupCoordinator) -> None:
    a = _join(gc)
    gc.check_commit("g", a.member_id, 1)
    _join(gc)
    with pytest.raises(StaleGeneration, match="heartbeat"):
        gc.check_commit("g", a.member_id, 1)
    gc.check_commit("g", a.member_id, 2)


def test_check_commit_refuses_members_not_in_the_group(gc: GroupCoordinator) -> None:
    a = _join(gc)
    with pytest.raises(StaleGeneration, match="not in group"):
        gc.check_commit("g", "ghost", 1)
    with pytest.raises(StaleGeneration, match="not in group"):
        gc.check_commit("other", a.member_id, 1)


def test_standalone_commit_is_allowed_only_while_the_group_has_no_members(
    gc: GroupCoordinator,
) -> None:
    gc.check_commit("never-seen", "", NO_GENERATION)
    a = _join(gc)
    with pytest.raises(StaleGeneration, match="active"):
        gc.check_commit("g", "", NO_GENERATION)
    gc.leave("g", a.member_id)
    gc.check_commit("g", "", NO_GENERATION)


def test_commit_without_member_id_must_carry_generation_minus_one(gc: GroupCoordinator) -> None:
    with pytest.raises(InvalidRequest, match="generation -1"):
        gc.check_commit("g", "", 3)


def test_commit_from_an_expired_member_is_stale(gc: GroupCoordinator, clock: ManualClock) -> None:
    a = _join(gc)
    clock.advance(SESSION + 1)
    gc.expire()
    with pytest.raises(StaleGeneration):
        gc.check_commit("g", a.member_id, a.generation)


# ------------------------------------------------------------------ queries


def test_describe_lists_members_sorted_with_client_ids_and_topics(gc: GroupCoordinator) -> None:
    _join(gc, client_id="zeta", topics=["payments"])
    _join(gc, client_id="alpha", topics=["orders", "audit"])
    state = gc.describe("g")
    assert [(m.member_id, m.client_id, m.topics) for m in state.members] == [
        ("alpha-002", "alpha", ["audit", "orders"]),
        ("zeta-001", "zeta", ["payments"]),
    ]


def test_describe_of_an_unknown_group_is_empty_generation_zero(gc: GroupCoordinator) -> None:
    state = gc.describe("nobody")
    assert (state.group, state.generation, state.members) == ("nobody", 0, [])


def test_snapshots_are_copies(gc: GroupCoordinator) -> None:
    a = _join(gc)
    a.queues.clear()
    gc.describe("g").members[0].assignment.clear()
    assert gc.heartbeat("g", a.member_id, 1, COUNTS).queues == [("orders", q) for q in range(4)]


def test_groups_lists_only_groups_with_members(gc: GroupCoordinator) -> None:
    _join(gc, "b")
    x = _join(gc, "a")
    _join(gc, "c")
    gc.leave("a", x.member_id)
    assert gc.groups() == ["b", "c"]


def test_assignment_owner(gc: GroupCoordinator) -> None:
    a = _join(gc)
    b = _join(gc)
    assert gc.assignment_owner("g", "orders", 0) == a.member_id
    assert gc.assignment_owner("g", "orders", 1) == b.member_id
    assert gc.assignment_owner("g", "orders", 9) is None
    assert gc.assignment_owner("g", "payments", 0) is None
    assert gc.assignment_owner("nope", "orders", 0) is None
