"""The schema registry of a tidemq node: its state, kept by reading the compact topic
`_schemas` (queue 0) through the client, and its writes, appended there.

Every node runs one; they agree because they read the same log (`RegistryState`). Before
answering, a node reads the log up to the end it has now, so an answer reflects every
write acknowledged before the request. A write is planned on that state, appended, and
read back: if another node's record came first and took its id or version, the state
ignored ours; then its tombstone is written and the write planned again (at most
`_WRITE_ATTEMPTS` times). One lock per node serializes its requests.

A node that must serve before the cluster can be reached (a replica group member,
whose group may have no leader yet) does not call `start()`: the registry then opens
at its first request, and a request that cannot reach the cluster fails (50001) and
leaves the next one to try again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Final, TypeVar

from tidemq.client.admin import AsyncAdmin
from tidemq.client.cluster import ClientConfig, ClusterClient
from tidemq.client.producer import AsyncProducer
from tidemq.client.stream_consumer import AsyncStreamConsumer
from tidemq.core.errors import TidemqError, TopicAlreadyExists
from tidemq.schema.model import ErrorCode, RegistryError
from tidemq.schema.registry_state import Record, RegistryState

__all__ = ["SCHEMAS_TOPIC", "RegistryService"]

log = logging.getLogger(__name__)

SCHEMAS_TOPIC: Final = "_schemas"
#: Writes planned again after losing a race to another node.
_WRITE_ATTEMPTS: Final = 5
#: Longest a request waits to read the log up to its end.
_CATCH_UP_S: Final = 30.0

T = TypeVar("T")


class RegistryService:
    def __init__(self, bootstrap: str, *, client_config: ClientConfig | None = None) -> None:
        self._bootstrap = bootstrap
        self._config = client_config
        self._cluster = ClusterClient(bootstrap, client_config)
        self._consumer = AsyncStreamConsumer(
            start="earliest", cluster=self._cluster, fetch_wait_ms=100
        )
        self._producer: AsyncProducer | None = None
        self.state = RegistryState()
        #: Offsets of records this node wrote, and whether the state took them.
        self._outcomes: dict[int, bool] = {}
        self._lock = asyncio.Lock()
        self._started = False
        #: Writes that lost a race to another node's (then undone and planned again).
        self.lost_races = 0

    async def start(self) -> None:
        """Create `_schemas` (a compact topic of one queue) when missing, and read it."""
        async with self._lock:
            await self._open()
            await self._catch_up()

    async def _open(self) -> None:
        if self._started:
            return
        async with AsyncAdmin(self._bootstrap, client_config=self._config) as admin:
            with contextlib.suppress(TopicAlreadyExists):  # another node was first
                await admin.create_topic(
                    SCHEMAS_TOPIC, 1, config={"cleanup.policy": "compact"}, exist_ok=True
                )
            info = await admin.describe_topic(SCHEMAS_TOPIC)
        policy = info.config.get("cleanup.policy", "delete")
        if policy != "compact" or info.queues != 1:
            # With retention (delete), schemas would expire; with more queues, the log
            # would have no one order. Refused rather than served wrong.
            raise RegistryError(
                ErrorCode.STORE_ERROR,
                f"topic {SCHEMAS_TOPIC} exists with cleanup.policy={policy} and "
                f"{info.queues} queues; the registry needs one queue and cleanup.policy="
                f"compact (tidemq topic alter {SCHEMAS_TOPIC} --config cleanup.policy=compact)",
            )
        self._producer = AsyncProducer(self._bootstrap, client_config=self._config)
        self._consumer.assign([(SCHEMAS_TOPIC, 0)])
        self._started = True

    async def close(self) -> None:
        if self._producer is not None:
            await self._producer.close()
        await self._consumer.close()
        await self._cluster.close()

    async def _catch_up(self, until: int | None = None) -> None:
        """Apply the log up to `until` (default: its end now)."""
        if until is None:
            until = (await self._cluster.list_offsets(SCHEMAS_TOPIC, 0)).max_offset
        deadline = time.monotonic() + _CATCH_UP_S
        while (self._consumer.position(SCHEMAS_TOPIC, 0) or 0) < until:
            if time.monotonic() > deadline:
                raise RegistryError(
                    ErrorCode.OPERATION_TIMEOUT,
                    f"the registry could not read {SCHEMAS_TOPIC} up to offset {until}",
                )
            for m in await self._consumer.poll(200):
                if m.key is None:
                    continue
                applied = self.state.apply(m.key, m.value)
                if m.offset in self._outcomes:
                    self._outcomes[m.offset] = applied

    async def read(self, fn: Callable[[RegistryState], T]) -> T:
        """`fn(state)` on the state as of now (every acknowledged write applied)."""
        async with self._lock:
            await self._guarded(self._open())
            await self._guarded(self._catch_up())
            return fn(self.state)

    async def unregistered(self, subject: str, ids: set[int]) -> set[int]:
        """Of `ids`, those not registered under `subject`: answered from the state at
        hand when it knows them all, else after reading the log to its end (a schema
        registered a moment ago through another node counts). The broker's check for
        topics with schema.validation=true."""
        missing = ids - self.state.registered_ids(subject)
        if missing:
            missing = await self.read(lambda state: ids - state.registered_ids(subject))
        return missing

    async def write(self, plan: Callable[[RegistryState], tuple[T, list[Record]]]) -> T:
        """Plan on the current state, append the records, read them back; again if
        another node's records won the race."""
        async with self._lock:
            await self._guarded(self._open())
            for _ in range(_WRITE_ATTEMPTS):
                await self._guarded(self._catch_up())
                answer, records = plan(self.state)
                if not records:
                    return answer
                offsets = await self._guarded(self._append(records))
                await self._guarded(self._catch_up(offsets[-1] + 1))
                lost = [o for o in offsets if not self._outcomes.pop(o, True)]
                if not lost:
                    return answer
                self.lost_races += 1
                log.info("a registry write lost a race to another node's; writing it again")
                # Our records lost: remove them, so that compaction never revives them.
                await self._guarded(self._append([(r[0], None) for r in records]))
            raise RegistryError(
                ErrorCode.STORE_ERROR,
                f"the write kept losing to other nodes' writes ({_WRITE_ATTEMPTS} attempts)",
            )

    async def _append(self, records: list[Record]) -> list[int]:
        assert self._producer is not None
        offsets = []
        for key, value in records:
            receipt = await self._producer.send(SCHEMAS_TOPIC, value, key=key, queue=0)
            self._outcomes[receipt.offset] = True
            offsets.append(receipt.offset)
        return offsets

    @staticmethod
    async def _guarded(step: Awaitable[T]) -> T:
        try:
            return await step
        except TidemqError as exc:
            raise RegistryError(ErrorCode.STORE_ERROR, f"the registry's log failed: {exc}") from exc
