"""Creating many topics at once (`Admin.create_topics`, `tidemq topic create --from-file`).

Each topic's queues are spread over the live brokers as `create_topic` spreads them; each
broker gets one CREATE_TOPICS request per `limits.MAX_TOPICS_PER_CREATE` topics, creates
them in one metadata transaction and registers them with the name servers once. A topic
refused (it exists, a bad name or config) does not stop the others: the refusals are
collected and raised together at the end, the topics created staying created.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterable

from tidemq.client import checks
from tidemq.client.cluster import ClusterClient
from tidemq.client.results import NewTopic, TopicInfo, topic_info_from_wire
from tidemq.core import limits
from tidemq.core.errors import ConfigError, TidemqError, TopicAlreadyExists, for_code
from tidemq.protocol.commands import (
    CreateTopicRequest,
    CreateTopicsRequest,
    CreateTopicsResponse,
    TopicFailure,
)

__all__ = ["create_topics"]

#: Refusals named in the error raised at the end (the rest are counted).
_NAMED_FAILURES = 10


def _checked(topics: Iterable[NewTopic]) -> list[NewTopic]:
    out = []
    for t in topics:
        if not isinstance(t, NewTopic):
            raise TypeError(f"create_topics takes NewTopic items, got {type(t).__name__}")
        checks.check_topic_name(t.name, "name")
        if isinstance(t.queues, bool) or not isinstance(t.queues, int):
            raise TypeError(f"topic {t.name!r}: queues must be an int")
        if not 1 <= t.queues <= limits.MAX_QUEUES_PER_TOPIC:
            raise ConfigError(
                f"topic {t.name!r}: queues must be 1..{limits.MAX_QUEUES_PER_TOPIC}, got {t.queues}"
            )
        out.append(t)
    return out


def _plans(topics: list[NewTopic], brokers: list[str]) -> dict[str, list[CreateTopicRequest]]:
    """Per broker address, the create requests of the topics it hosts queues of."""
    single = len(brokers) == 1
    plans: dict[str, list[CreateTopicRequest]] = {b: [] for b in brokers}
    for t in topics:
        hosted: dict[str, list[int]] = {}
        for q in range(t.queues):
            hosted.setdefault(brokers[q % len(brokers)], []).append(q)
        for address, queues in hosted.items():
            plans[address].append(
                CreateTopicRequest(
                    name=t.name,
                    queues=t.queues,
                    message_type=t.message_type,
                    config=dict(t.config),
                    hosted_queues=[] if single else queues,
                )
            )
    return plans


async def _send(
    cluster: ClusterClient, address: str, requests: list[CreateTopicRequest]
) -> list[CreateTopicsResponse]:
    answers = []
    step = limits.MAX_TOPICS_PER_CREATE
    for i in range(0, len(requests), step):
        batch = CreateTopicsRequest(topics=requests[i : i + step])
        answers.append(await cluster.call(address, batch, CreateTopicsResponse))
    return answers


async def create_topics(
    cluster: ClusterClient, brokers: list[str], topics: Iterable[NewTopic], *, exist_ok: bool
) -> list[TopicInfo]:
    """Create `topics` over the live `brokers` (addresses); the topics created, in the
    order given. With `exist_ok`, topics that exist already are skipped (not returned).
    Raises the first refusal's error, naming every refused topic, after creating the
    rest."""
    wanted = _checked(topics)
    names = [t.name for t in wanted]
    twice = sorted(n for n, count in Counter(names).items() if count > 1)
    if twice:
        raise ConfigError(f"topics named more than once: {', '.join(twice[:_NAMED_FAILURES])}")
    plans = _plans(wanted, brokers)
    answers = await asyncio.gather(*(_send(cluster, a, reqs) for a, reqs in plans.items() if reqs))
    created: dict[str, TopicInfo] = {}
    failed: dict[str, TopicFailure] = {}
    for answer in (a for per_broker in answers for a in per_broker):
        for info in answer.created:
            created.setdefault(info.name, topic_info_from_wire(info))
        for failure in answer.failed:
            failed.setdefault(failure.name, failure)
    if exist_ok:
        exists = int(TopicAlreadyExists.code)
        failed = {n: f for n, f in failed.items() if f.code != exists}
    # The routes of the topics created, not every route (which, with a million queues,
    # would not fit one answer).
    names_created = list(created)
    for i in range(0, len(names_created), limits.MAX_ROUTE_TOPICS):
        await cluster.refresh_topics(names_created[i : i + limits.MAX_ROUTE_TOPICS])
    if failed:
        raise _refusal(list(failed.values()), len(created))
    return [created[n] for n in names if n in created]


def _refusal(failed: list[TopicFailure], created: int) -> TidemqError:
    first = failed[0]
    named = "; ".join(f"{f.name}: {f.message}" for f in failed[:_NAMED_FAILURES])
    more = f" and {len(failed) - _NAMED_FAILURES} more" if len(failed) > _NAMED_FAILURES else ""
    return for_code(first.code)(
        f"{len(failed)} topic(s) not created ({created} created): {named}{more}"
    )
