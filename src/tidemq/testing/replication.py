"""Fault injection for replica groups (`tidemq.broker.replica_node`): the election's
switch (`ElectionFaultSwitch`: cut a member off from etcd's lease service, hold its
campaigns) plus holding a follower's fetches, as if the network between it and its
leader were down, and holding a follower's start-over at one of its steps."""

from __future__ import annotations

import threading

from tidemq.testing.election import ElectionFaultSwitch

__all__ = ["ReplicaFaultSwitch"]


class ReplicaFaultSwitch(ElectionFaultSwitch):
    """Implements `tidemq.broker.replica_follower.ReplicaFaults`; all on until flipped."""

    def __init__(self) -> None:
        super().__init__()
        self._fetch_held = False
        #: The start-over step to hold (None: none), and set once held there.
        self.hold_start_over_at: str | None = None
        self.start_over_held = threading.Event()
        self._start_over_released = threading.Event()

    def fetch_held(self) -> bool:
        return self._fetch_held

    def hold_fetches(self) -> None:
        self._fetch_held = True

    def release_fetches(self) -> None:
        self._fetch_held = False

    def start_over_step(self, step: str) -> None:
        """Holds the start-over (its worker thread) before `hold_start_over_at` until
        `release_start_over`: a test kills the process there, or lets it go on."""
        if step == self.hold_start_over_at:
            self.start_over_held.set()
            self._start_over_released.wait()

    def release_start_over(self) -> None:
        self._start_over_released.set()
