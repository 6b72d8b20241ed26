"""The states of one member in its replica group's leader election, and the table of
transitions between them. Pure: `tidemq.cluster.election` does the etcd calls and feeds
the events in.

    FOLLOWER --campaign--> CANDIDATE --won--> LEADER --lease_lost / deposed--> FENCED
       ^                      |                 |                                 |
       +-------lost-----------+                 +--resigned--> STOPPED            |
       +------------------------------stepped_down--------------------------------+

FENCED is the state of a member that led and may have acknowledged under an epoch that
etcd no longer grants it: it has stopped acknowledging, and (once log replication exists)
truncates what the new leader does not have before it steps down to FOLLOWER. `stop` ends
the election from any state.
"""

from __future__ import annotations

import enum
from typing import Final

__all__ = ["TRANSITIONS", "Event", "IllegalTransition", "State", "next_state"]


class State(enum.Enum):
    FOLLOWER = "follower"
    CANDIDATE = "candidate"
    LEADER = "leader"
    FENCED = "fenced"
    STOPPED = "stopped"


class Event(enum.Enum):
    #: No leader key: this member tries to create it.
    CAMPAIGN = "campaign"
    WON = "won"
    #: Another member holds the leader key (or etcd could not be asked).
    LOST = "lost"
    #: The member's lease expired or could not be kept alive before its deadline.
    LEASE_LOST = "lease_lost"
    #: etcd's leader key no longer holds this member under its epoch.
    DEPOSED = "deposed"
    #: The fenced member gave up its lease and campaigns again as a follower.
    STEPPED_DOWN = "stepped_down"
    RESIGNED = "resigned"
    STOP = "stop"


class IllegalTransition(AssertionError):
    """An event the state does not accept: a bug in the election, never an etcd answer."""


TRANSITIONS: Final[dict[tuple[State, Event], State]] = {
    (State.FOLLOWER, Event.CAMPAIGN): State.CANDIDATE,
    (State.CANDIDATE, Event.WON): State.LEADER,
    (State.CANDIDATE, Event.LOST): State.FOLLOWER,
    (State.LEADER, Event.LEASE_LOST): State.FENCED,
    (State.LEADER, Event.DEPOSED): State.FENCED,
    (State.LEADER, Event.RESIGNED): State.STOPPED,
    (State.FENCED, Event.STEPPED_DOWN): State.FOLLOWER,
    **{(state, Event.STOP): State.STOPPED for state in State},
}


def next_state(state: State, event: Event) -> State:
    try:
        return TRANSITIONS[(state, event)]
    except KeyError:
        raise IllegalTransition(f"election: {event.value} in state {state.value}") from None
