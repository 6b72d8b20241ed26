"""The broker's periodic chores: expiring silent group members (and, with a name server
in the process, its heartbeat and silent brokers), and retention."""

from __future__ import annotations

import asyncio
import logging

from tidemq.broker.groups import GroupCoordinator
from tidemq.broker.name_server_link import LocalNameServer
from tidemq.broker.static_service import StaticService
from tidemq.broker.store_gateway import StoreGateway

__all__ = ["retention_forever", "sweep_forever"]

log = logging.getLogger(__name__)

#: How often expired group members and silent brokers are swept.
_SWEEP_INTERVAL_S = 1.0
#: How often retention runs.
_RETENTION_INTERVAL_S = 60.0


async def sweep_forever(coordinator: GroupCoordinator, local: LocalNameServer | None) -> None:
    """Until cancelled: expire silent group members; beat and sweep the local name server."""
    while True:
        await asyncio.sleep(_SWEEP_INTERVAL_S)
        coordinator.expire()
        if local is not None:
            local.sweep(_SWEEP_INTERVAL_S)


async def retention_forever(gateway: StoreGateway, static: StaticService) -> None:
    """Until cancelled: drop the commit-log segments and static links past retention."""
    while True:
        await asyncio.sleep(_RETENTION_INTERVAL_S)
        try:
            deleted = await gateway.call(lambda s: s.enforce_retention())
            if deleted:
                log.info("retention deleted %d commit-log segments", deleted)
            await static.prune_expired()
        except Exception:
            log.exception("retention failed")
