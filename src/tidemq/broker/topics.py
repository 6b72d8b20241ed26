"""The event loop's view of the broker's topics, and the topic admin operations.

The store owns topics; this table mirrors them on the loop so that every produce and fetch
can be checked (topic exists, queue served here, size limit) without a trip to the writer
thread. Every change goes through the gateway first, then updates the mirror's entry for
that topic (not the whole table: a broker with 100,000 topics creates one more in constant
time) and tells the broker, which tells the name servers.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable, KeysView

from tidemq.broker.config import BrokerConfig
from tidemq.broker.store_gateway import StoreGateway
from tidemq.broker.system_topics import is_internal
from tidemq.broker.topic_config import (
    HOSTED_QUEUES_KEY,
    TopicSettings,
    check_tier_config,
    parse_hosted,
    parse_message_type,
    parse_topic_config,
)
from tidemq.core import limits, names
from tidemq.core.errors import (
    ConfigError,
    InvalidRequest,
    InvalidTopicName,
    QueueNotFound,
    TidemqError,
    TopicAlreadyExists,
    TopicNotFound,
)
from tidemq.core.static_chain import STATIC_KEY
from tidemq.protocol.commands import CreateTopicRequest
from tidemq.store.compaction_settings import compaction_settings
from tidemq.store.message_store import MessageStore
from tidemq.store.metadata import CleanupPolicy, TopicInfo

__all__ = ["TopicTable", "check_user_topic"]


def _hosted_value(hosted: list[int], queues: int) -> dict[str, str]:
    if not hosted:
        return {}
    bad = [q for q in hosted if not 0 <= q < queues]
    if bad or len(set(hosted)) != len(hosted):
        raise ConfigError(f"hosted queues {hosted} must be distinct ids in 0..{queues - 1}")
    return {HOSTED_QUEUES_KEY: ",".join(str(q) for q in sorted(hosted))}


def check_user_topic(name: str) -> None:
    """Refuse, with InvalidTopicName, a name a client may not create a topic under
    (`tidemq.core.names`: internal names are the broker's to create)."""
    problem = names.user_name_problem(name)
    if problem is not None:
        raise InvalidTopicName(f"topic name {name[:140]!r} {problem}; use {names.NAME_RULE}")


class TopicTable:
    def __init__(self, config: BrokerConfig, gateway: StoreGateway) -> None:
        self._config = config
        self._gateway = gateway
        self._topics: dict[str, TopicInfo] = {}
        #: The names of `_topics`, sorted: lists and pages without sorting 100,000 names.
        self._names: list[str] = []
        self._hosted: dict[str, frozenset[int]] = {}
        #: Static topics (tidemq.core.static_chain): their queues are links of chains.
        self._static: frozenset[str] = frozenset()
        #: Called after any change, with the topic changed (None: the whole table was
        #: read again), so the broker tells its name servers (cluster/topic_journal.py).
        self.on_change: Callable[[str | None], None] = lambda topic: None

    async def refresh(self) -> None:
        """Read the whole table from the store again (at start, and after changes made
        behind the table's back, such as topics restored from the tier)."""
        topics = await self._gateway.call(lambda s: s.topics())
        # Internal topics belong to the broker's services: not listed, routed, or open
        # to clients.
        topics = [t for t in topics if not is_internal(t.name)]
        self._topics = {t.name: t for t in topics}
        self._names = sorted(self._topics)
        self._hosted = {t.name: frozenset(parse_hosted(t.config, t.queues)) for t in topics}
        self._static = frozenset(t.name for t in topics if t.config.get(STATIC_KEY) == "true")
        self.on_change(None)

    def _put(self, info: TopicInfo) -> None:
        """One topic created or altered: its entry replaced, not the whole table (a broker
        with 100,000 topics creates the next one in constant time)."""
        if is_internal(info.name):
            return
        if info.name not in self._topics:
            bisect.insort(self._names, info.name)
        self._topics[info.name] = info
        self._hosted[info.name] = frozenset(parse_hosted(info.config, info.queues))
        if info.config.get(STATIC_KEY) == "true":
            self._static = self._static | {info.name}
        self.on_change(info.name)

    def _drop(self, name: str) -> None:
        if self._topics.pop(name, None) is None:
            return
        del self._names[bisect.bisect_left(self._names, name)]
        self._hosted.pop(name, None)
        if name in self._static:
            self._static = self._static - {name}
        self.on_change(name)

    def find(self, name: str) -> TopicInfo | None:
        return self._topics.get(name)

    def is_static(self, name: str) -> bool:
        return name in self._static

    def all(self) -> list[TopicInfo]:
        """Every topic, by name."""
        return [self._topics[name] for name in self._names]

    def page(self, prefix: str, after: str, limit: int) -> tuple[list[TopicInfo], str]:
        """Up to `limit` topics by name, those starting with `prefix` and after `after`;
        and the name to continue after ("" when none is left)."""
        names = self._names
        i = (
            bisect.bisect_right(names, after)
            if after >= prefix
            else bisect.bisect_left(names, prefix)
        )
        out: list[TopicInfo] = []
        while i < len(names) and names[i].startswith(prefix):
            if len(out) == limit:
                return out, out[-1].name
            out.append(self._topics[names[i]])
            i += 1
        return out, ""

    def get(self, name: str) -> TopicInfo:
        info = self._topics.get(name)
        if info is None:
            raise TopicNotFound(f"topic {name[:140]!r} does not exist on this broker")
        return info

    def names(self) -> KeysView[str]:
        """The topics' names, a live read-only view (O(1) membership, no copy)."""
        return self._topics.keys()

    def hosts(self, name: str, queue: int) -> bool:
        """Whether this broker stores `queue` of topic `name` (O(1): metrics ask this of
        every committed offset)."""
        return queue in self._hosted.get(name, ())

    def hosted(self, name: str) -> list[int]:
        return sorted(self._hosted.get(name, ()))

    def max_message_bytes(self, name: str) -> int:
        info = self._topics.get(name)
        raw = info.config.get("max.message.bytes") if info else None
        limit = self._config.max_message_bytes
        return min(limit, int(raw)) if raw else limit

    def schema_validation(self, name: str) -> bool:
        """Whether sends to the topic are checked against the schema registry."""
        info = self._topics.get(name)
        return info is not None and info.config.get("schema.validation", "").lower() == "true"

    async def check_queue(self, topic: str, queue: int, *, create: bool = False) -> TopicInfo:
        info = self._topics.get(topic)
        if info is None and create and self._config.auto_create_topics:
            check_user_topic(topic)
            try:
                info = await self.create(topic, self._config.default_queues)
            except TopicAlreadyExists:
                await self.refresh()
                info = self.get(topic)
        if info is None:
            raise TopicNotFound(f"topic {topic[:140]!r} does not exist on this broker")
        self.check_hosted(topic, queue)
        return info

    def check_hosted(self, topic: str, queue: int) -> None:
        """QueueNotFound unless this broker serves `queue` of `topic` (a known topic)."""
        if queue not in self._hosted.get(topic, ()):
            raise QueueNotFound(
                f"queue {queue} of topic {topic!r} is not served by this broker "
                f"(it serves {self.hosted(topic)})"
            )

    # ------------------------------------------------------------------ admin

    async def create(
        self,
        name: str,
        queues: int,
        *,
        message_type: str = "MIXED",
        config: dict[str, str] | None = None,
        hosted: list[int] | None = None,
        static: bool = False,
    ) -> TopicInfo:
        """Create a topic: a user name (`check_user_topic` first, for requests from
        clients) or a per-group internal one the broker's services need (%RETRY%g, %DLQ%g)."""
        template = self._template(
            name, queues, message_type=message_type, config=config, hosted=hosted, static=static
        )
        (info,) = await self._gateway.call(lambda store: store.create_topics([template]))
        self._put(info)
        return info

    async def create_many(
        self, requests: list[CreateTopicRequest]
    ) -> tuple[list[TopicInfo], list[tuple[str, TidemqError]]]:
        """Create user topics in one metadata transaction: (created, [(name, why not)]).
        Each request is checked alone; the ones refused (a bad name or config, one that
        exists, a name twice) do not stop the others."""
        templates: list[TopicInfo] = []
        failed: list[tuple[str, TidemqError]] = []
        seen: set[str] = set()
        for r in requests:
            try:
                check_user_topic(r.name)
                if r.name in seen:
                    raise InvalidRequest(f"topic {r.name!r} appears twice in the batch")
                if r.name in self._topics:
                    raise TopicAlreadyExists(f"topic {r.name!r} already exists")
                templates.append(
                    self._template(
                        r.name,
                        r.queues,
                        message_type=r.message_type,
                        config=dict(r.config),
                        hosted=list(r.hosted_queues),
                    )
                )
                seen.add(r.name)
            except TidemqError as exc:
                failed.append((r.name, exc))
        infos: list[TopicInfo] = []
        if templates:
            infos = await self._gateway.call(lambda store: store.create_topics(templates))
        for info in infos:
            self._put(info)
        return infos, failed

    def _template(
        self,
        name: str,
        queues: int,
        *,
        message_type: str,
        config: dict[str, str] | None,
        hosted: list[int] | None,
        static: bool = False,
    ) -> TopicInfo:
        """A new topic's record, checked (its id and creation time are the store's)."""
        if "%" in name and not names.is_internal_topic(name):
            raise InvalidTopicName(
                f"invalid topic name {name[:140]!r}: '%' is reserved for tidemq's internal "
                f"names; use {names.NAME_RULE}"
            )
        if name.startswith("%SYS%"):
            raise InvalidTopicName(f"topic {name!r} is one of the broker's own")
        if not 1 <= queues <= limits.MAX_QUEUES_PER_TOPIC:
            raise ConfigError(f"queues must be 1..{limits.MAX_QUEUES_PER_TOPIC}, got {queues}")
        settings = parse_topic_config(config or {})
        self._check_tier(None, config or {}, settings)
        extra = {**settings.extra, **_hosted_value(hosted or [], queues)}
        if static:
            extra[STATIC_KEY] = "true"
        return TopicInfo(
            id=0,
            name=name,
            queues=queues,
            message_type=parse_message_type(message_type),
            cleanup_policy=settings.cleanup_policy or CleanupPolicy.DELETE,
            retention_ms=settings.retention_ms,
            retention_bytes=settings.retention_bytes,
            config=extra,
            created_ms=0,
        )

    async def alter(
        self, name: str, *, queues: int | None, config: dict[str, str], hosted: list[int]
    ) -> TopicInfo:
        current = self.get(name)
        if name in self._static and queues is not None and queues != current.queues:
            raise ConfigError(
                f"topic {name!r} is static: its {current.queues} queues are fixed (keys keep "
                "their queue); scale it with `tidemq topic remap` instead"
            )
        settings = parse_topic_config(config)
        compaction_settings({**current.config, **config})  # min/max lag checked together
        self._check_tier(current, config, settings)
        total = current.queues if queues is None else queues
        extra = {**settings.extra, **_hosted_value(hosted, total)}

        def run(store: MessageStore) -> TopicInfo:
            return store.alter_topic(
                name,
                queues=queues,
                cleanup_policy=settings.cleanup_policy,
                retention_ms=settings.retention_ms,
                retention_bytes=settings.retention_bytes,
                config=extra,
            )

        info = await self._gateway.call(run)
        self._put(info)
        return info

    def _check_tier(
        self, current: TopicInfo | None, config: dict[str, str], settings: TopicSettings
    ) -> None:
        """The tiered-storage configs of a topic being created (current None) or altered,
        with what it already has and the broker's defaults."""
        store = self._config.store
        policy = settings.cleanup_policy or (
            CleanupPolicy.DELETE if current is None else current.cleanup_policy
        )

        def pick(new: int | None, old: int | None, default: int) -> int:
            return new if new is not None else old if old is not None else default

        check_tier_config(
            None if current is None else current.config,
            {**(current.config if current else {}), **config},
            compact=policy is not CleanupPolicy.DELETE,
            retention_ms=pick(
                settings.retention_ms,
                None if current is None else current.retention_ms,
                store.retention_ms,
            ),
            retention_bytes=pick(
                settings.retention_bytes,
                None if current is None else current.retention_bytes,
                store.retention_bytes,
            ),
            tier_configured=self._config.tiered.enabled,
        )

    async def delete(self, name: str) -> None:
        self.get(name)
        await self._gateway.call(lambda s: s.delete_topic(name))
        self._drop(name)
