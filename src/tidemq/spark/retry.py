"""A request of the connector's, retried with the client's backoff while it fails
retriably (a broker restarting, routes moving): the fetches and the tier file lists that
executors send."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from tidemq.client.cluster import ClusterClient
from tidemq.core.errors import TidemqError

__all__ = ["retrying"]

T = TypeVar("T")


async def retrying(cluster: ClusterClient, call: Callable[[], Awaitable[T]]) -> T:
    """`call()` until it succeeds, or fails with an error that is not retriable, or
    `cluster.config.retries` retries have failed (the routes refreshed after each)."""
    attempt = 0
    while True:
        try:
            return await call()
        except TidemqError as exc:
            cluster.invalidate(exc)
            attempt += 1
            if not exc.retriable or attempt > cluster.config.retries:
                raise
            await asyncio.sleep(cluster.backoff_s(attempt))
