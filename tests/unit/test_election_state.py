"""The election's state table: the paths a member takes, and every other pair refused."""

from __future__ import annotations

import itertools

import pytest

from tidemq.cluster.election_state import TRANSITIONS, Event, IllegalTransition, State, next_state


def _walk(start: State, *events: Event) -> list[State]:
    states = [start]
    for event in events:
        states.append(next_state(states[-1], event))
    return states


def test_a_member_that_wins_leads_and_a_fenced_one_steps_down_to_follower() -> None:
    assert _walk(
        State.FOLLOWER, Event.CAMPAIGN, Event.WON, Event.LEASE_LOST, Event.STEPPED_DOWN
    ) == [State.FOLLOWER, State.CANDIDATE, State.LEADER, State.FENCED, State.FOLLOWER]
    assert _walk(State.LEADER, Event.DEPOSED)[-1] is State.FENCED


def test_a_member_that_loses_follows_and_may_campaign_again() -> None:
    assert _walk(State.FOLLOWER, Event.CAMPAIGN, Event.LOST, Event.CAMPAIGN)[-1] is (
        State.CANDIDATE
    )


def test_resign_only_from_leader_and_stop_from_anywhere() -> None:
    assert next_state(State.LEADER, Event.RESIGNED) is State.STOPPED
    for state in State:
        assert next_state(state, Event.STOP) is State.STOPPED


def test_a_leader_never_leads_again_without_stepping_down_and_winning() -> None:
    # The only way into LEADER is WON from CANDIDATE; the only way out of FENCED is down.
    into_leader = [key for key, to in TRANSITIONS.items() if to is State.LEADER]
    assert into_leader == [(State.CANDIDATE, Event.WON)]
    out_of_fenced = {to for (state, event), to in TRANSITIONS.items() if state is State.FENCED}
    assert out_of_fenced == {State.FOLLOWER, State.STOPPED}


@pytest.mark.parametrize(
    ("state", "event"),
    [pair for pair in itertools.product(State, Event) if pair not in TRANSITIONS],
)
def test_every_other_pair_is_refused(state: State, event: Event) -> None:
    with pytest.raises(IllegalTransition, match=f"{event.value} in state {state.value}"):
        next_state(state, event)
