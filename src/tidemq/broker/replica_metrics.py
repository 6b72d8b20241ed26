"""A replica group member's replication figures, for its HTTP listener's `/metrics`
(`tidemq.http.metrics_api`; docs/guide/operations.md lists the series).

A member has one role at a time (`replica_node.py`). Leading, it runs a whole broker,
whose `MetricsSnapshot` carries these figures beside the broker's own. Following, no
broker runs: `/metrics` then reports these figures alone (with the commit log's size and
the disk's), never a broker's counters as zeros. Positions are byte positions in the
group's commit log, the same on every member.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = ["ReplicaMetrics", "ReplicaRole"]


class ReplicaRole(enum.Enum):
    LEADER = "leader"
    FOLLOWER = "follower"
    #: Between two roles: its broker starting (just elected) or stopping (deposed).
    NONE = "none"


@dataclass(frozen=True, slots=True)
class ReplicaMetrics:
    group: str
    member: str
    role: ReplicaRole
    #: The epoch this member leads under, or of the leader it follows (0: none known).
    epoch: int
    #: This member's log end and durable (flushed) position; None between roles.
    log_end: int | None = None
    durable: int | None = None
    #: The group's committed position as this member knows it (a follower: as its
    #: leader last said, clamped to its own log end).
    committed: int | None = None
    #: Bytes this member's log is behind the leader's end (a follower: the leader's end
    #: at its last answer; 0 on the leader). None: not known (no answer yet).
    lag_bytes: int | None = None
    #: A follower: seconds since a leader last answered its fetch (None: none has since
    #: it began following); fetch rounds answered and truncations of its log since then.
    fetch_age_s: float | None = None
    fetch_rounds: int = 0
    truncations: int = 0
    #: The leader: the in-sync set, min_insync_replicas, and per follower that fetched
    #: this term, the bytes its log is behind the leader's end.
    in_sync: tuple[str, ...] = ()
    min_insync_replicas: int = 0
    follower_lag: dict[str, int] = field(default_factory=dict)
    #: A follower: bytes of commit log it keeps, and its data directory's file system
    #: (size, free); a leader's are its broker's (`MetricsSnapshot`).
    log_bytes: int | None = None
    disk: tuple[int, int] | None = None
