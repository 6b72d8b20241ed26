"""Tiered storage in the broker: the tier service, made when `tiered.url` is set, and the
TIER_STATUS, TIER_OFFLOAD and TIER_FILES requests (answered without it too)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from tidemq.broker.config import BrokerConfig
from tidemq.broker.store_gateway import StoreGateway
from tidemq.broker.topics import TopicTable
from tidemq.core.clock import Clock
from tidemq.core.errors import ConfigError
from tidemq.protocol.tier_messages import (
    TierFilesRequest,
    TierFilesResponse,
    TierOffloadRequest,
    TierStatusRequest,
    TierStatusResponse,
)

if TYPE_CHECKING:
    from tidemq.broker.tier_service import TierService

__all__ = ["TierRequests", "open_tier"]


def open_tier(
    cfg: BrokerConfig, gateway: StoreGateway, topics: TopicTable, clock: Clock
) -> TierService | None:
    """The tier service, when `tiered.url` is set (its modules need pyarrow and
    obstore, so they are imported only then)."""
    if not cfg.tiered.enabled:
        return None
    try:
        from tidemq.broker.tier_service import TierService  # noqa: PLC0415
    except ImportError as exc:
        raise ConfigError(
            f"tiered.url is set but tiered storage cannot load ({exc}); install "
            "tidemq[server] (pyarrow and obstore)"
        ) from None
    return TierService(cfg.tiered, cfg.broker_name, gateway, topics, clock)


class TierRequests:
    """The tier requests of one broker (`tier` None: no tiered storage)."""

    def __init__(self, broker_name: str, topics: TopicTable, tier: TierService | None) -> None:
        self._broker_name = broker_name
        self._topics = topics
        self._tier = tier

    async def status(self, req: TierStatusRequest) -> TierStatusResponse:
        if self._tier is None:
            return TierStatusResponse(enabled=False, broker=self._broker_name)
        return await self._tier.status(req)

    async def offload(self, req: TierOffloadRequest) -> TierStatusResponse:
        self._topics.get(req.topic)  # TopicNotFound
        if self._tier is None:
            raise ConfigError(f"broker {self._broker_name} has no tiered storage (tiered.url)")
        await self._tier.offload_now(req.topic)
        return await self._tier.status(TierStatusRequest(topic=req.topic))

    async def files(self, req: TierFilesRequest) -> TierFilesResponse:
        if req.queue >= 0:
            await self._topics.check_queue(req.topic, req.queue)
        else:
            self._topics.get(req.topic)  # TopicNotFound
        if self._tier is None:
            return TierFilesResponse()
        return await self._tier.reads.files(req)
