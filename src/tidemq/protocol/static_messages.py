"""Static-topic requests (codes 90-95): open links, seal a write end, store newer chains,
hand pending delayed messages of a sealed queue over to its write end.
Appended to `commands.REQUESTS`; fields only ever added at the end. The chain format is
`tidemq.core.static_chain`; the switch protocol is docs/design/static-topics.md."""

from __future__ import annotations

from typing import Final

import msgspec

from tidemq.core.static_chain import QueueChain
from tidemq.protocol.codes import RequestCode

__all__ = [
    "STATIC_REQUESTS",
    "StaticChainsResponse",
    "StaticOpenRequest",
    "StaticSealRequest",
    "StaticTimersAdoptRequest",
    "StaticTimersAdoptResponse",
    "StaticTimersHandedRequest",
    "StaticTimersHandedResponse",
    "StaticTimersPage",
    "StaticTimersTakeRequest",
    "StaticUpdateRequest",
    "TimerHandover",
]


class _Msg(msgspec.Struct, kw_only=True, omit_defaults=True):
    pass


class StaticOpenRequest(_Msg):
    """Open links on this broker: each chain's last link names this broker, is open, and
    has physical_start -1 (the broker fills in its queue's next offset). Creates the topic
    here when it is new to this broker. Repeating it is harmless (same epoch: the stored
    chain is answered)."""

    topic: str
    queues: int
    message_type: str = "MIXED"
    config: dict[str, str] = {}
    chains: list[QueueChain] = []


class StaticSealRequest(_Msg):
    """Seal this broker's write end of one queue: no append from now on; the stored chain
    becomes `epoch` with the link's physical end and `target`, the broker to open next."""

    topic: str
    queue: int
    epoch: int
    target: str
    #: The newest chain the admin knows (from the routes): the sealed chain is built on it
    #: when it is newer than this broker's but has the same write end (links pruned by
    #: other brokers since).
    chain: QueueChain | None = None


class StaticUpdateRequest(_Msg):
    """Store these chains where they are newer than what this broker has (it holds links
    of their queues): after a switch, the sealed side learns the finished chain."""

    topic: str
    chains: list[QueueChain] = []


class StaticChainsResponse(_Msg):
    chains: list[QueueChain] = []


class TimerHandover(_Msg):
    """One pending delayed batch handed from a sealed queue's broker to its write end."""

    #: Its timer offset on the broker handing it over (the adopter's dedup key).
    offset: int
    #: Where it was sent, which its messages' ids name (kept through every hand-over).
    origin_broker: str
    origin_offset: int
    due_ms: int
    count: int
    payload: bytes


class StaticTimersTakeRequest(_Msg):
    """Hand over the delayed batches pending here for a queue this broker no longer
    writes: the next page is reserved for `dest` (durably), or the page reserved earlier is
    answered again, whatever its destination, until STATIC_TIMERS_HANDED."""

    topic: str
    queue: int
    dest: str
    max_bytes: int = 1 << 20


class StaticTimersPage(_Msg):
    source: str
    #: Where this page must be adopted (a page reserved earlier keeps its destination).
    dest: str = ""
    #: The last timer offset of the page (-1: nothing to hand over).
    through: int = -1
    timers: list[TimerHandover] = []
    #: Whether more batches wait after this page.
    more: bool = False


class StaticTimersAdoptRequest(_Msg):
    """Schedule a page of handed-over batches here; a page (or part) adopted already is
    skipped, so repeating the request after a failure is harmless."""

    topic: str
    queue: int
    source: str
    timers: list[TimerHandover] = []


class StaticTimersAdoptResponse(_Msg):
    adopted: int
    skipped: int


class StaticTimersHandedRequest(_Msg):
    """The page through `through` is adopted: drop it here."""

    topic: str
    queue: int
    through: int


class StaticTimersHandedResponse(_Msg):
    dropped: int


STATIC_REQUESTS: Final[dict[RequestCode, tuple[type[msgspec.Struct], type[msgspec.Struct]]]] = {
    RequestCode.STATIC_OPEN: (StaticOpenRequest, StaticChainsResponse),
    RequestCode.STATIC_SEAL: (StaticSealRequest, StaticChainsResponse),
    RequestCode.STATIC_UPDATE: (StaticUpdateRequest, StaticChainsResponse),
    RequestCode.STATIC_TIMERS_TAKE: (StaticTimersTakeRequest, StaticTimersPage),
    RequestCode.STATIC_TIMERS_ADOPT: (StaticTimersAdoptRequest, StaticTimersAdoptResponse),
    RequestCode.STATIC_TIMERS_HANDED: (StaticTimersHandedRequest, StaticTimersHandedResponse),
}
