"""System properties of commit-log records written by the broker's services.

A record's properties block (`tidemq.core.record`) is empty for ordinary batches. Records of
the timer and transaction services carry one `SystemProperties` struct, msgpack-encoded
(msgspec), with short field names because it is stored with every such record. Which
fields are set depends on the record's flags:

============================  =============================================================
record (flags)                fields
============================  =============================================================
schedule (DELAYED)            ``tt`` target topic, ``tq`` target queue, ``due`` deliver-at ms
adopted schedule (DELAYED)    as a schedule, plus where it was sent (its id): ``ob`` broker,
                              ``ho`` its timer offset there; and the broker that handed it
                              over with its offset there: ``hb``, ``hx`` (static topics)
cancel (DELAYED | CONTROL)    ``ref`` timer offset of the schedule it cancels
handoff (DELAYED | CONTROL)   ``hop`` "handoff", ``tt``, ``tq``, ``ref`` the last timer offset
                              handed, ``hb`` the broker they are handed to
handed (DELAYED | CONTROL)    ``hop`` "handed", ``tt``, ``tq``, ``ref``: the handoff is adopted
delivered (FROM_TIMER)        ``ot``/``oq``/``oo`` origin (timer topic qualified by the broker
                              it was sent to, queue, offset), ``due`` the time it was
                              scheduled for; ``ref`` the timer offset here when it differs
                              from ``oo`` (an adopted schedule)
half (TRANSACTION_HALF)       ``tx`` transaction id, ``grp`` producer group, ``tt``, ``tq``
decision (CONTROL | HALF)     ``txs`` transaction ids, ``commit``, ``sink``/``bid`` marker,
                              ``why`` reason (for rollbacks the broker decided)
published (FROM_TRANSACTION)  ``tx``, ``ot``/``oq``/``oo`` origin (half topic, queue, offset)
retry (DELAYED | FROM_POP)    ``tt`` (``%RETRY%<group>``), ``tq``, ``due``, and the pop lease
                              it finishes: ``pg`` group, ``pt`` topic, ``pq`` queue, ``po``
                              offset
dead letter (FROM_POP)        ``pg``, ``pt``, ``pq``, ``po``: the pop lease it finishes
============================  =============================================================

The origin fields give a delivered or published message the id it had when it was sent
(`tidemq.core.message.message_id` of the origin), so a receipt's id still names the
message after the timer or the commit moved it.
"""

from __future__ import annotations

from typing import Final

import msgspec

from tidemq.core.errors import CorruptRecordError

__all__ = [
    "HALF_TOPIC",
    "INTERNAL_PREFIX",
    "OFFSETS_TOPIC",
    "OP_TOPIC",
    "POP_TOPIC",
    "PRODUCERS_TOPIC",
    "TABLES_TOPIC",
    "TIMER_TOPIC",
    "SystemProperties",
    "decode_properties",
    "encode_properties",
    "is_origin_of",
    "qualified_origin",
]

#: Internal topics of the broker's services (`tidemq.broker.system_topics`). Clients see
#: their names only inside message ids' origins.
INTERNAL_PREFIX: Final = "%SYS%"
TIMER_TOPIC: Final = "%SYS%TIMER"
HALF_TOPIC: Final = "%SYS%TXN_HALF"
OP_TOPIC: Final = "%SYS%TXN_OP"
POP_TOPIC: Final = "%SYS%POP"
#: Consumer groups' committed offsets (`tidemq.broker.offset_book`): compact.
OFFSETS_TOPIC: Final = "%SYS%OFFSETS"
#: Which user each producer id was issued to (`tidemq.broker.producer_owner_topic`):
#: compact.
PRODUCERS_TOPIC: Final = "%SYS%PRODUCERS"
#: The tier ranges and static chains, replicated to a group's members
#: (`tidemq.broker.member_tables`): compact.
TABLES_TOPIC: Final = "%SYS%TABLES"


class SystemProperties(msgspec.Struct, kw_only=True, omit_defaults=True):
    tt: str = ""
    tq: int = -1
    due: int = 0
    ref: int = -1
    ot: str = ""
    oq: int = -1
    oo: int = -1
    tx: str = ""
    grp: str = ""
    txs: list[str] = []
    commit: bool = False
    sink: str = ""
    bid: int = -1
    why: str = ""
    pg: str = ""
    pt: str = ""
    pq: int = -1
    po: int = -1
    hop: str = ""
    hb: str = ""
    hx: int = -1
    ob: str = ""
    ho: int = -1

    @property
    def origin(self) -> tuple[str, int, int] | None:
        return (self.ot, self.oq, self.oo) if self.ot else None

    @property
    def pop_lease(self) -> tuple[str, str, int, int] | None:
        """(group, topic, queue, offset) of the pop lease a FROM_POP record finishes."""
        return (self.pg, self.pt, self.pq, self.po) if self.pg else None


def qualified_origin(internal_topic: str, broker: str) -> str:
    """The origin topic named in the ids of messages first stored in `internal_topic` of
    `broker`: each broker's timer and half topics count offsets from 0, so the broker's
    name keeps two brokers' ids apart (a cancel by id reaches only the right schedule)."""
    return f"{internal_topic}@{broker}"


def is_origin_of(origin_topic: str, internal_topic: str) -> bool:
    """Whether `origin_topic` names `internal_topic` (of any broker; ids from before
    origins were qualified name it bare)."""
    return origin_topic == internal_topic or origin_topic.startswith(internal_topic + "@")


_ENCODER: Final = msgspec.msgpack.Encoder()
_DECODER: Final = msgspec.msgpack.Decoder(SystemProperties)


def encode_properties(props: SystemProperties) -> bytes:
    return _ENCODER.encode(props)


def decode_properties(data: bytes | memoryview) -> SystemProperties:
    if not data:
        return SystemProperties()
    try:
        return _DECODER.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        raise CorruptRecordError(f"undecodable record properties: {exc}") from None
