"""ORIGIN_MESSAGE: a delayed or transactional message found by its id.

Such a message's id names where this broker first stored it: its timer topic (delayed) or
its half topic (transactional), qualified by the broker's name, at the batch's offset
there. The id stays the same once the message is delivered or published, so it is also
the id its consumers see. The answer is the record as first stored (its payload is the
batch the producer sent, unchanged), where it goes (topic and queue, from the record's
properties), its state, and where it was delivered when that is known:

* delayed: a batch no longer scheduled was delivered (or cancelled); its copy is looked
  for in the target queue from the first batch stored at its due time, at most
  `DELIVERED_SEARCH_BATCHES` batches on (the delivery appends it at or soon after that
  time), by the origin its properties name;
* transactional: the transaction's state, and for a committed one that is still
  remembered (the newest 10,000), where each of its batches was published.

An id of another broker, or of a batch no longer kept, is answered `found=False`; the
client asks every live broker.
"""

from __future__ import annotations

from typing import Final

from tidemq.broker.store_gateway import StoreGateway
from tidemq.broker.system_topics import HALF_TOPIC, TIMER_TOPIC, InternalRecord, read_internal
from tidemq.broker.timer_service import TimerService
from tidemq.broker.transaction_service import TransactionService
from tidemq.core.errors import InvalidRequest, TidemqError
from tidemq.core.message import parse_message_id, topic_hash
from tidemq.core.properties import decode_properties
from tidemq.core.record import HEADER, RecordFlags, parse_header
from tidemq.protocol.query_messages import OriginMessageRequest, OriginMessageResponse
from tidemq.store.message_store import MessageStore, ReadStatus

__all__ = ["DELIVERED_SEARCH_BATCHES", "OriginLookup"]

#: Batches of the target queue looked at for a delivered delayed batch's copy.
DELIVERED_SEARCH_BATCHES: Final = 256
_READ_BYTES: Final = 1 << 20


class OriginLookup:
    def __init__(
        self, gateway: StoreGateway, timers: TimerService, transactions: TransactionService
    ) -> None:
        self._gateway = gateway
        self._timers = timers
        self._transactions = transactions

    async def find(self, req: OriginMessageRequest) -> tuple[OriginMessageResponse, bytes]:
        try:
            wanted, queue, offset = parse_message_id(req.message_id)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None
        origins = {
            topic_hash(self._timers.origin): (self._timers.origin, TIMER_TOPIC),
            topic_hash(self._transactions.origin): (self._transactions.origin, HALF_TOPIC),
        }
        if wanted not in origins or queue != 0:
            return OriginMessageResponse(), b""
        origin, internal = origins[wanted]
        rec = await self._gateway.call(lambda s: _record_at(s, internal, offset))
        if rec is None:
            return OriginMessageResponse(), b""
        props = rec.props
        answer = OriginMessageResponse(
            found=True,
            origin=origin,
            base_offset=rec.offset,
            topic=props.tt,
            queue=props.tq,
            deliver_at_ms=props.due,
        )
        if internal == TIMER_TOPIC:
            await self._delayed(answer)
        else:
            self._transactional(answer, props.tx)
        return answer, rec.record

    async def _delayed(self, answer: OriginMessageResponse) -> None:
        if self._timers.is_pending(answer.base_offset):
            answer.state = "pending"
            return
        answer.state = "delivered"
        try:
            found = await self._gateway.call(lambda s: _delivered_copy(s, answer))
        except TidemqError:  # the target topic or queue is gone since
            found = -1
        answer.delivered_base = found

    def _transactional(self, answer: OriginMessageResponse, txn_id: str) -> None:
        answer.state, published = self._transactions.outcome(txn_id)
        for batch in published:
            if batch.origin_offset == answer.base_offset:
                answer.delivered_base = batch.base_offset


def _record_at(store: MessageStore, internal: str, offset: int) -> InternalRecord | None:
    """The data batch of the internal topic holding `offset` (None: not kept, or a
    control record)."""
    for rec in read_internal(store, internal, offset, max_bytes=1):
        if not rec.offset <= offset < rec.offset + rec.count:
            return None
        return None if rec.header.flags & RecordFlags.CONTROL else rec
    return None


def _delivered_copy(store: MessageStore, answer: OriginMessageResponse) -> int:
    """First offset of the delivered copy of the delayed batch in its target queue (-1:
    not within the search's bounds)."""
    topic, queue = answer.topic, answer.queue
    offset = store.offset_for_time(topic, queue, answer.deliver_at_ms)
    looked = 0
    while looked < DELIVERED_SEARCH_BATCHES:
        result = store.read(topic, queue, offset, max_bytes=_READ_BYTES)
        if result.status is not ReadStatus.FOUND or not result.batches:
            return -1
        for batch in result.batches:
            looked += 1
            header = parse_header(batch.record)
            if header.flags & RecordFlags.FROM_TIMER:
                props = decode_properties(
                    memoryview(batch.record)[HEADER.size : header.payload_start]
                )
                if props.ot == answer.origin and props.oo == answer.base_offset:
                    return batch.base_offset
        offset = result.next_offset
    return -1
