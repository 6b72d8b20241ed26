"""Fault injection for replica groups (`tidemq.broker.replica_node`): the election's
switch (`ElectionFaultSwitch`: cut a member off from etcd's lease service, hold its
campaigns) plus holding a follower's fetches, as if the network between it and its
leader were down."""

from __future__ import annotations

from tidemq.testing.election import ElectionFaultSwitch

__all__ = ["ReplicaFaultSwitch"]


class ReplicaFaultSwitch(ElectionFaultSwitch):
    """Implements `tidemq.broker.replica_follower.ReplicaFaults`; all on until flipped."""

    def __init__(self) -> None:
        super().__init__()
        self._fetch_held = False

    def fetch_held(self) -> bool:
        return self._fetch_held

    def hold_fetches(self) -> None:
        self._fetch_held = True

    def release_fetches(self) -> None:
        self._fetch_held = False
