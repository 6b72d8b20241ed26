"""What a broker's name servers need to hear: its topic list as a version, and the topics
changed since any recent version (RocketMQ's brokers send a data version with their
heartbeat for the same reason: a thousand topics are not re-sent every beat).

A broker registers in full once (its whole list, with its `epoch` and `version`); then
each beat or change sends only the topics changed since the version that name server
acknowledged (`delta`), and a beat with nothing changed is a few bytes. A name server
that does not hold the broker at that base version (it restarted, the broker lapsed, a
delta was lost) refuses the delta, and the broker registers in full again. `epoch` is new
at every broker start: versions of an earlier run never match.

The journal keeps the newest version of each changed topic, at most `MAX_CHANGES`
topics; a base older than what it forgot, or than a change it cannot name (`touch(None)`:
a reload, a static topic's chains), needs a full registration. Pure: no I/O.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

__all__ = [
    "MAX_CHANGES",
    "STATIC",
    "Delta",
    "StaticMark",
    "TopicJournal",
    "TopicLookup",
    "TopicRegistration",
]

#: Changed topics remembered for deltas; past this, the oldest are forgotten and a name
#: server behind them gets a full registration.
MAX_CHANGES: Final = 100_000

#: (topic, total queues, message type, hosted queue ids; [] = all), as registered.
TopicRegistration = tuple[str, int, str, list[int]]


class StaticMark:
    """The lookup's answer for a static topic: registered with its chains, in full."""


#: Returned by a delta's lookup for a static topic.
STATIC: Final = StaticMark()

#: A topic's registration now; None if it was deleted; STATIC for a static topic.
TopicLookup = Callable[[str], "TopicRegistration | StaticMark | None"]


@dataclass(frozen=True, slots=True)
class Delta:
    """The change from a name server's version to the broker's."""

    base_version: int
    version: int
    upserts: list[TopicRegistration]
    removed: list[str]


class TopicJournal:
    def __init__(self, *, max_changes: int = MAX_CHANGES) -> None:
        self.epoch = secrets.token_hex(8)
        self.version = 0
        self._max = max_changes
        #: topic -> version of its last change, oldest change first.
        self._changed: OrderedDict[str, int] = OrderedDict()
        #: A base below this cannot be brought up to date by a delta.
        self._floor = 0

    def touch(self, topic: str | None) -> None:
        """`topic` changed (created, altered, deleted); None: something that cannot be
        named changed (the next registration of every name server is full)."""
        self.version += 1
        if topic is None:
            self._floor = self.version
            self._changed.clear()
            return
        self._changed[topic] = self.version
        self._changed.move_to_end(topic)
        if len(self._changed) > self._max:
            _, forgotten = self._changed.popitem(last=False)
            self._floor = max(self._floor, forgotten)

    def delta(
        self,
        base: int | None,
        lookup: TopicLookup,
    ) -> Delta | None:
        """The delta from `base` (the version a name server acknowledged; None: none yet)
        to now; None when only a full registration will do. `lookup(topic)`: its current
        registration, None if deleted, STATIC for a static topic."""
        if base is None or base < self._floor or base > self.version:
            return None
        upserts: list[TopicRegistration] = []
        removed: list[str] = []
        for topic, version in reversed(self._changed.items()):
            if version <= base:
                break
            found = lookup(topic)
            if isinstance(found, StaticMark):
                return None
            if found is None:
                removed.append(topic)
            else:
                upserts.append(found)
        return Delta(base, self.version, upserts, removed)
