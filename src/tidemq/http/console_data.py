"""What the web console's JSON API answers, read from the cluster through the client's
admin API (the console sees what `tidemq` commands see, over the same protocol, with the
listener's client config: TLS and login included).

Each function returns plain JSON-ready data. Per-broker and per-queue reads are bounded
(`MAX_LAG_TIME_QUEUES`, `STATUS_TIMEOUT_S`): a page never waits on one slow broker for
long, and a group with thousands of queues costs at most that many reads.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from typing import Any, Final

import msgspec

from tidemq.client.admin import AsyncAdmin, dlq_topic
from tidemq.client.producer import AsyncProducer
from tidemq.client.results import BrokerInfo
from tidemq.core.errors import TidemqError
from tidemq.http.console_values import ValueDecoder, message_record
from tidemq.http.registry_service import RegistryService
from tidemq.schema.registry_state import RegistryState

__all__ = [
    "MAX_LAG_TIME_QUEUES",
    "STATUS_TIMEOUT_S",
    "ConsoleData",
]

#: Longest wait for one broker's status on the cluster page.
STATUS_TIMEOUT_S: Final = 5.0
#: Queues of a group whose lag in time is measured (one message read each), the most
#: lagging first.
MAX_LAG_TIME_QUEUES: Final = 32
#: Topic names of dead letters: this, then the consumer group's name.
DLQ_PREFIX: Final = dlq_topic("")
#: Dead letters listed per page.
MAX_DEAD_LETTERS: Final = 500


def _now_ms() -> int:
    return int(time.time() * 1000)


class ConsoleData:
    """The console's reads and actions over one admin client and the node's registry."""

    def __init__(
        self, admin: AsyncAdmin, producer: AsyncProducer, registry: RegistryService
    ) -> None:
        self._admin = admin
        self._producer = producer
        self._registry = registry
        self._decoder = ValueDecoder(self._schema)

    def _schema(self, schema_id: int) -> Any:
        try:
            return self._registry.state.schema(schema_id)
        except Exception:
            return None

    # ------------------------------------------------------------------ cluster

    async def cluster(self, name_servers: str) -> dict[str, Any]:
        brokers = await self._admin.cluster_status()
        statuses = await asyncio.gather(*(self._broker(b) for b in brokers))
        return {
            "now_ms": _now_ms(),
            "name_servers": [a for a in name_servers.split(",") if a],
            "brokers": list(statuses),
        }

    async def _broker(self, broker: BrokerInfo) -> dict[str, Any]:
        entry: dict[str, Any] = dataclasses.asdict(broker)
        try:
            status = await asyncio.wait_for(
                self._admin.broker_status(broker.address), STATUS_TIMEOUT_S
            )
        except (TidemqError, OSError, TimeoutError) as exc:
            entry["status_error"] = str(exc) or type(exc).__name__
        else:
            entry["status"] = dataclasses.asdict(status)
        return entry

    # ------------------------------------------------------------------ topics

    async def topics(self, prefix: str, after: str, limit: int, *, system: bool) -> dict[str, Any]:
        """A page of topics by name; `next`: the `after` of the next page ("": the last)."""
        page = await self._admin.list_topics(
            prefix, after=after, limit=limit + 1, keep=None if system else _user_topic
        )
        more = len(page) > limit  # one more asked for: whether a next page exists
        page = page[:limit]
        return {
            "topics": [
                {
                    "name": t.name,
                    "queues": t.queues,
                    "message_type": t.message_type,
                    "config": dict(t.config),
                    "system": not _user_topic(t.name),
                }
                for t in page
            ],
            "next": page[-1].name if more else "",
        }

    async def topic(self, name: str) -> dict[str, Any]:
        info = await self._admin.describe_topic(name)
        return {
            "now_ms": _now_ms(),
            "name": info.name,
            "queues": info.queues,
            "message_type": info.message_type,
            "config": dict(info.config),
            "queue_info": [dataclasses.asdict(q) for q in info.queue_info],
            "chains": [msgspec.to_builtins(c) for c in info.chains],
        }

    # ------------------------------------------------------------------ groups

    async def groups(self) -> list[str]:
        return sorted(await self._admin.list_groups())

    async def group(self, group: str) -> dict[str, Any]:
        description = await self._admin.describe_group(group)
        offsets = [dataclasses.asdict(o) for o in description.offsets]
        lagging = sorted(
            (o for o in offsets if o["lag"] > 0 and o["committed"] >= 0),
            key=lambda o: -int(o["lag"]),
        )[:MAX_LAG_TIME_QUEUES]
        now = _now_ms()
        for o in lagging:
            # Lag in time: how long ago the oldest message not yet consumed was stored.
            oldest = await self._admin.message_at(o["topic"], o["queue"], offset=o["committed"])
            if oldest is not None:
                o["lag_ms"] = max(0, now - oldest.timestamp_ms)
        return {
            "group": description.group,
            "generation": description.generation,
            "members": [dataclasses.asdict(m) for m in description.members],
            "offsets": offsets,
        }

    async def reset(
        self, group: str, topic: str, *, to: str, value: int, execute: bool
    ) -> list[dict[str, Any]]:
        planned = await self._admin.reset_offsets(group, topic, to=to, value=value, execute=execute)
        return [dataclasses.asdict(p) for p in planned]

    # ------------------------------------------------------------------ messages

    async def browse(
        self, topic: str, queue: int, *, offset: int | None, at: float | None, limit: int
    ) -> list[dict[str, Any]]:
        found = await self._admin.messages(topic, queue, offset=offset, at=at, limit=limit)
        return [message_record(m, self._decoder) for m in found]

    async def by_key(
        self, topic: str, key: str, *, start: float | None, end: float | None, limit: int
    ) -> list[dict[str, Any]]:
        found = await self._admin.query_messages(topic, key, start=start, end=end, limit=limit)
        return [message_record(m, self._decoder) for m in found]

    async def message(self, message_id: str) -> dict[str, Any] | None:
        found = await self._admin.get_message(message_id)
        return None if found is None else message_record(found, self._decoder)

    # ------------------------------------------------------------------ dead letters

    async def dead_letter_groups(self) -> list[str]:
        topics = await self._admin.list_topics(DLQ_PREFIX)
        return [t.name[len(DLQ_PREFIX) :] for t in topics]

    async def dead_letters(self, group: str, limit: int) -> dict[str, Any]:
        letters = await self._admin.dead_letters(group, limit=min(limit, MAX_DEAD_LETTERS))
        return {
            "group": group,
            "redriven_below": await self._admin.redrive_position(group),
            "letters": [message_record(m, self._decoder) for m in letters],
        }

    async def redrive(self, group: str, limit: int | None) -> int:
        return await self._admin.redrive(group, limit=limit)

    # ------------------------------------------------------------------ delayed, transactions

    async def timers(self) -> dict[str, Any]:
        return dataclasses.asdict(await self._admin.timer_status())

    async def cancel_timer(self, message_id: str) -> dict[str, Any]:
        return dataclasses.asdict(await self._producer.cancel(message_id))

    async def transactions(self) -> dict[str, Any]:
        return dataclasses.asdict(await self._admin.transaction_status())

    async def rollback(self, txn_id: str) -> None:
        await self._admin.rollback_transaction(txn_id)

    # ------------------------------------------------------------------ schemas

    async def schemas(self) -> list[dict[str, Any]]:
        return await self._registry.read(_subjects)


def _subjects(state: RegistryState) -> list[dict[str, Any]]:
    out = []
    for subject in state.subjects():
        versions = []
        for number in state.versions(subject):
            info = state.version(subject, number)
            versions.append(
                {
                    "version": info.version,
                    "id": info.schema_id,
                    "type": info.schema.schema_type.value,
                    "schema": info.schema.text,
                }
            )
        out.append(
            {
                "subject": subject,
                "compatibility": state.compatibility(subject).value,
                "versions": versions,
            }
        )
    return out


def _user_topic(name: str) -> bool:
    """Not one of the system's (`%RETRY%g`, `%DLQ%g`, ... and `_schemas`)."""
    return not name.startswith(("%", "_"))
