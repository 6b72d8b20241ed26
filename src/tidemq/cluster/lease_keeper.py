"""One etcd lease kept alive in the background, with a deadline this process can trust.

The deadline is the time the last successful keep-alive was *sent* plus the TTL etcd
granted in its answer: etcd started its own countdown later than that, so etcd never
expires the lease before this deadline passes here (clock rates aside, which monotonic
clocks keep close). A holder that checks `alive()` before acting can therefore not act
on a lease etcd has expired. Refreshed every third of the TTL, so two refreshes may fail
(etcd electing its own leader, a slow answer) before the lease is at risk.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Protocol

from tidemq.cluster.etcd_client import EtcdClient, Lease
from tidemq.core.clock import Clock
from tidemq.core.errors import EtcdUnavailable

__all__ = ["LeaseFaults", "LeaseKeeper"]

log = logging.getLogger(__name__)


class LeaseFaults(Protocol):
    """Fault injection for tests (`tidemq.testing.election`); production passes none.
    While `keepalive_paused()`, the lease is neither refreshed nor revoked: the holder is
    cut off from etcd's lease service and etcd expires the lease after its TTL."""

    def keepalive_paused(self) -> bool: ...


class LeaseKeeper:
    """Owns one lease: refreshes it until it is lost (`lost` is set) or abandoned.
    Owned by one event loop."""

    def __init__(
        self,
        client: EtcdClient,
        lease: Lease,
        *,
        granted_ms: float,
        clock: Clock,
        faults: LeaseFaults | None = None,
    ) -> None:
        self.lease = lease
        #: Monotonic ms after which etcd may have expired the lease.
        self.deadline_ms = granted_ms + lease.ttl_s * 1000
        #: Set once the lease is lost: expired in etcd, past its deadline, or abandoned.
        self.lost = asyncio.Event()
        self._client = client
        self._clock = clock
        self._faults = faults
        self._interval_ms = lease.ttl_s * 1000 // 3
        self._task = asyncio.create_task(self._keep_alive(), name=f"lease-{lease.id:x}")

    @classmethod
    async def grant(
        cls, client: EtcdClient, ttl_s: int, *, clock: Clock, faults: LeaseFaults | None = None
    ) -> LeaseKeeper:
        sent_ms = clock.monotonic_ms()
        lease = await client.grant_lease(ttl_s)
        return cls(client, lease, granted_ms=sent_ms, clock=clock, faults=faults)

    def alive(self) -> bool:
        """Not lost, and etcd cannot have expired it yet by this process's clock."""
        return not self.lost.is_set() and self._clock.monotonic_ms() < self.deadline_ms

    def _paused(self) -> bool:
        return self._faults is not None and self._faults.keepalive_paused()

    async def _keep_alive(self) -> None:
        while not self.lost.is_set():
            wait_ms = min(self._interval_ms, self.deadline_ms - self._clock.monotonic_ms())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.lost.wait(), max(wait_ms, 0) / 1000)
            if self.lost.is_set():
                return
            if not self._paused():
                await self._refresh()
            if self._clock.monotonic_ms() >= self.deadline_ms:
                self.lost.set()

    async def _refresh(self) -> None:
        sent_ms = self._clock.monotonic_ms()
        try:
            # One try may not outlast the interval: a call stuck on a dead connection
            # would otherwise use up the whole lease (the request timeout is 2 s, as
            # long as the shortest lease), leaving no time to try on a fresh one.
            ttl_s = await self._client.keep_alive(self.lease.id, timeout_ms=self._interval_ms)
        except EtcdUnavailable as error:
            log.warning("lease %x keep-alive failed: %s", self.lease.id, error)
            return
        if ttl_s <= 0:
            self.lost.set()  # etcd expired it, and the keys attached to it
        else:
            self.deadline_ms = sent_ms + ttl_s * 1000

    async def abandon(self) -> None:
        """Stop refreshing and revoke the lease, deleting its keys (best effort: a lease
        etcd cannot revoke now expires on its own)."""
        self.lost.set()
        if self._task is not asyncio.current_task():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._paused():
            return
        try:
            await self._client.revoke_lease(self.lease.id)
        except EtcdUnavailable as error:
            log.warning("lease %x not revoked (it expires by itself): %s", self.lease.id, error)
