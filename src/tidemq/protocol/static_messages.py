"""Static-topic requests (codes 90-92): open links, seal a write end, store newer chains.
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
    "StaticUpdateRequest",
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


STATIC_REQUESTS: Final[dict[RequestCode, tuple[type[msgspec.Struct], type[msgspec.Struct]]]] = {
    RequestCode.STATIC_OPEN: (StaticOpenRequest, StaticChainsResponse),
    RequestCode.STATIC_SEAL: (StaticSealRequest, StaticChainsResponse),
    RequestCode.STATIC_UPDATE: (StaticUpdateRequest, StaticChainsResponse),
}
