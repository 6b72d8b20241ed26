"""Fault injection for `tidemq.cluster.election`: a switch a test flips to cut one member
off from etcd's lease service (its lease is neither refreshed nor revoked, so etcd expires
it after its TTL, as for a paused or partitioned leader) or to keep it from campaigning."""

from __future__ import annotations

__all__ = ["ElectionFaultSwitch"]


class ElectionFaultSwitch:
    """Implements `tidemq.cluster.election.ElectionFaults`; everything on until flipped."""

    def __init__(self) -> None:
        self._keepalive_paused = False
        self._campaign_held = False

    def keepalive_paused(self) -> bool:
        return self._keepalive_paused

    def campaign_held(self) -> bool:
        return self._campaign_held

    def pause_keepalive(self) -> None:
        self._keepalive_paused = True

    def resume_keepalive(self) -> None:
        self._keepalive_paused = False

    def hold_campaigns(self) -> None:
        self._campaign_held = True

    def release_campaigns(self) -> None:
        self._campaign_held = False
