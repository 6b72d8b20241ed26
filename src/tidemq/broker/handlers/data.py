"""Produce, fetch (with long polling), list offsets, init producer."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import msgspec

from tidemq.broker.config import BrokerConfig
from tidemq.broker.filters import Filter, compile_filter, filter_mask, summary_mask
from tidemq.broker.handlers.tier_fetch import foreign_bounds, read_link
from tidemq.broker.long_polling import LongPolling
from tidemq.broker.metrics import Traffic
from tidemq.broker.schema_validation import SchemaCheck, validate_batch
from tidemq.broker.static_service import StaticService
from tidemq.broker.static_view import LinkView
from tidemq.broker.store_gateway import StoreGateway
from tidemq.broker.timer_service import TimerService
from tidemq.broker.topics import TopicTable
from tidemq.broker.transaction_service import TransactionService
from tidemq.core.errors import (
    BatchTooLarge,
    InvalidRequest,
    MessageTypeMismatch,
    QueueMoved,
    TierUnavailable,
)
from tidemq.core.static_chain import Link, link_for
from tidemq.net.budget import ConnectionBudget
from tidemq.protocol.commands import (
    FetchRequest,
    FetchResponse,
    InitProducerRequest,
    InitProducerResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    ProduceRequest,
    ProduceResponse,
)
from tidemq.store.compacted_queues import message_keys
from tidemq.store.message_store import AppendResult, MessageStore, ReadResult, ReadStatus
from tidemq.store.metadata import CleanupPolicy, MessageType, TopicInfo
from tidemq.store.producer_state import ProducerStamp

if TYPE_CHECKING:
    from tidemq.broker.tier_service import TierService

__all__ = ["DataHandlers"]


class DataHandlers:
    def __init__(
        self,
        config: BrokerConfig,
        gateway: StoreGateway,
        topics: TopicTable,
        polling: LongPolling,
        *,
        timers: TimerService,
        transactions: TransactionService,
        static: StaticService,
    ) -> None:
        self._config = config
        self._gateway = gateway
        self._topics = topics
        self._polling = polling
        self._timers = timers
        self._transactions = transactions
        self._static = static
        #: Messages and bytes in and out per topic (the HTTP listener's /metrics).
        self.traffic = Traffic()
        #: The schema registry's check for topics with schema.validation=true (set by the
        #: node that runs the registry; None: sends to such topics are refused).
        self.schema_check: SchemaCheck | None = None
        #: Tiered storage's reads of offloaded offsets (None: not configured).
        self.tier: TierService | None = None

    async def produce(self, req: ProduceRequest, body: bytes | memoryview) -> ProduceResponse:
        """`body`: the batch payload; a view of the request's own buffer when large (the
        frame decoder reads big frames straight into one), appended without a copy."""
        info = await self._topics.check_queue(req.topic, req.queue, create=True)
        kind = self._check_batch(req, body, info)
        if self._topics.schema_validation(req.topic):
            await validate_batch(req.topic, body, self.schema_check)
        view = self._static.view(req.topic, req.queue)
        if view is not None and (
            not view.writable or (req.topic, req.queue) in self._static.sealing
        ):
            # Checked here for every kind (the store refuses plain appends itself; a
            # transaction's half or a delayed batch would be accepted and stranded here).
            raise QueueMoved(
                f"queue {req.queue} of static topic {req.topic!r} is being switched to "
                "another broker; refresh the routes"
            )
        if kind is not MessageType.NORMAL and info.cleanup_policy is not CleanupPolicy.DELETE:
            # At the send, not when the timer or the commit appends it much later: every
            # message of a compact topic needs a key (the store checks its own appends).
            message_keys(body, req.topic)
        if kind is MessageType.DELAY:
            # The timer and transaction services take bytes: rare paths, one copy is fine.
            result = await self._timers.schedule(
                req.topic, req.queue, bytes(body), req.deliver_at_ms
            )
            self.traffic.stored(req.topic, result.count, len(body), "delay")
            return ProduceResponse(
                base_offset=result.base_offset,
                count=result.count,
                store_time_ms=result.store_time_ms,
                origin_topic=self._timers.origin,
            )
        if kind is MessageType.TRANSACTION:
            result = await self._transactions.send(req.txn_id, req.topic, req.queue, bytes(body))
            self.traffic.stored(req.topic, result.count, len(body), "transaction")
            return ProduceResponse(
                base_offset=result.base_offset,
                count=result.count,
                store_time_ms=result.store_time_ms,
                origin_topic=self._transactions.origin,
            )
        stamp = _stamp(req)
        result = await self._gateway.append(req.topic, req.queue, body, producer=stamp)
        self._count(req, info, result, len(body))
        base = result.base_offset
        if view is not None:
            # The chain may have been sealed while the append waited for its flush: the
            # record is below the seal's end either way, so its link is known.
            view = self._static.view(req.topic, req.queue) or view
            base = view.logical(base)
        return ProduceResponse(
            base_offset=base,
            count=result.count,
            duplicate=result.duplicate,
            store_time_ms=result.store_time_ms,
        )

    def produce_now(self, req: ProduceRequest, body: bytes | memoryview) -> ProduceResponse | None:
        """`produce` of a request that needs no waiting, answered here (from the protocol
        callback, with no task): a plain batch to a queue of a known topic that is not
        static and validates no schema, with async flush. None for any other (a topic
        unknown here too: `produce` creates it when the broker auto-creates topics, or
        refuses it): `produce` serves it. The checks are `produce`'s own (`_check_batch`,
        `_stamp`), in the same order, so both paths refuse alike."""
        if req.deliver_at_ms or req.txn_id or not self._gateway.appends_at_once:
            return None
        topics = self._topics
        info = topics.find(req.topic)
        if info is None or topics.is_static(req.topic) or topics.schema_validation(req.topic):
            return None
        topics.check_hosted(req.topic, req.queue)
        self._check_batch(req, body, info)
        result = self._gateway.append_now(req.topic, req.queue, body, producer=_stamp(req))
        self._count(req, info, result, len(body))
        return ProduceResponse(
            base_offset=result.base_offset,
            count=result.count,
            duplicate=result.duplicate,
            store_time_ms=result.store_time_ms,
        )

    def _check_batch(
        self, req: ProduceRequest, body: bytes | memoryview, info: TopicInfo
    ) -> MessageType:
        """What both produce paths check first, in this order: the batch's size against
        the topic's max.message.bytes, the request's kind (delayed, transactional or
        plain; not both), that kind against the topic's message.type. The kind."""
        limit = self._topics.max_message_bytes(req.topic)
        if len(body) > limit:
            raise BatchTooLarge(
                f"batch of {len(body)} bytes exceeds max.message.bytes ({limit}) of "
                f"topic {req.topic!r}"
            )
        kind = _message_kind(req)
        _check_type(req.topic, info.message_type, kind)
        return kind

    def _count(self, req: ProduceRequest, info: TopicInfo, result: AppendResult, size: int) -> None:
        """A plain append's traffic (a duplicate stored nothing)."""
        if not result.duplicate:
            fifo = info.message_type is MessageType.FIFO
            self.traffic.stored(req.topic, result.count, size, "fifo" if fifo else "normal")

    async def fetch(
        self, req: FetchRequest, *, budget: ConnectionBudget | None = None
    ) -> tuple[FetchResponse, bytes]:
        """`budget`: the connection's response budget. Each read reserves its bytes from it
        first and reads at most what was granted (less than max_bytes when answers being
        sent hold the rest: the consumer asks again); a read that finds nothing releases
        them before the fetch parks."""
        await self._topics.check_queue(req.topic, req.queue)
        if not 0 < req.max_bytes <= self._config.max_fetch_bytes:
            raise InvalidRequest(f"max_bytes must be 1..{self._config.max_fetch_bytes}")
        if not 0 <= req.max_wait_ms <= self._config.max_fetch_wait_ms:
            raise InvalidRequest(f"max_wait_ms must be 0..{self._config.max_fetch_wait_ms}")
        if req.offset < 0:
            raise InvalidRequest(f"offset must be >= 0, got {req.offset}")
        view = self._static.view(req.topic, req.queue)
        if view is not None:
            return await self._fetch_static(req, view, budget)
        return await self._fetch(req, req.offset, budget)

    async def _fetch_static(
        self, req: FetchRequest, view: LinkView, budget: ConnectionBudget | None
    ) -> tuple[FetchResponse, bytes]:
        """A static queue's fetch: the link holding the logical offset is read at its
        physical offset (another broker's sealed link from the object store, when this
        broker has a tier); the answer speaks logical offsets (records rebased)."""
        link = link_for(view.chain, req.offset)
        log_start = None
        if (
            link is not None
            and link.broker != view.broker
            and not link.is_open
            and self.tier is not None
        ):
            response, records, log_start = await self._fetch_link(req, link, budget)
        else:
            link, physical = view.physical(req.offset)
            if not link.is_open:
                req = msgspec.structs.replace(req, max_wait_ms=0)  # a sealed link has it all
            response, records = await self._fetch(req, physical, budget, join=False)
        kept = view.records(link, records)
        # Within the link read (a later link of the same physical queue starts where a
        # sealed one ends).
        next_offset = link.logical_start + response.next_offset - link.physical_start
        if link.logical_end is not None:
            next_offset = min(next_offset, link.logical_end)
        low, high = view.bounds(response.min_offset, response.max_offset)
        if log_start is not None and low == link.logical_start and link.logical_end is not None:
            # The chain starts with that link: its broker may have expired part of it.
            start = link.logical_start + max(log_start - link.physical_start, 0)
            low = min(start, link.logical_end)
        response = msgspec.structs.replace(
            response,
            next_offset=next_offset,
            min_offset=low,
            max_offset=high,
            record_sizes=[len(r) for r in kept],
            masks=response.masks[: len(kept)],
        )
        return response, b"".join(kept)

    async def _fetch_link(
        self, req: FetchRequest, link: Link, budget: ConnectionBudget | None
    ) -> tuple[FetchResponse, list[bytes], int]:
        """A fetch of another broker's sealed link from the object store
        (`tier_fetch.read_link`): the answer, its records and that broker's first offset
        still in the bucket."""
        assert self.tier is not None
        flt = compile_filter(req.filter_kind, req.filter_expression) if req.filter_kind else None
        tag_mask = req.tag_mask | (summary_mask(flt) if flt is not None else 0)
        info = self._topics.get(req.topic)
        result, log_start = await read_link(
            self.tier, self._gateway, req, info=info, link=link, tag_mask=tag_mask, budget=budget
        )
        response, records = self._respond(req, result, flt)
        return response, records, log_start

    async def _fetch(
        self,
        req: FetchRequest,
        offset: int,
        budget: ConnectionBudget | None,
        *,
        join: bool = True,
    ) -> tuple[FetchResponse, Any]:
        """The fetch of `offset` (physical) in the queue; the body joined, or (`join`
        False) the list of records."""
        key = (req.topic, req.queue)
        deadline = time.monotonic() + req.max_wait_ms / 1000

        flt = compile_filter(req.filter_kind, req.filter_expression) if req.filter_kind else None
        tag_mask = req.tag_mask | (summary_mask(flt) if flt is not None else 0)

        max_bytes = req.max_bytes

        def read(store: MessageStore) -> ReadResult:
            return store.read(req.topic, req.queue, offset, max_bytes=max_bytes, tag_mask=tag_mask)

        while True:
            seen = self._polling.version(key)
            if budget is not None:
                max_bytes = await budget.acquire(req.max_bytes)
            result = await self._gateway.call(read)
            if result.status is ReadStatus.REMOTE:
                result = await self._read_remote(req.topic, req.queue, result, max_bytes, tag_mask)
            if budget is not None:
                budget.hold(sum(len(b.record) for b in result.batches))
            if result.status is not ReadStatus.NO_NEW_MESSAGE or result.next_offset != offset:
                break
            remaining = deadline - time.monotonic()
            if remaining <= 0 or not await self._polling.wait(key, seen, remaining):
                break
        response, records = self._respond(req, result, flt)
        return response, (b"".join(records) if join else records)

    def _respond(
        self, req: FetchRequest, result: ReadResult, flt: Filter | None
    ) -> tuple[FetchResponse, list[bytes]]:
        """A fetch's answer to `result`: the records (those where `flt` matches nothing
        left out) and their per-message masks."""
        records: list[bytes] = [b.record for b in result.batches]
        masks: list[bytes] = []
        count = sum(b.count for b in result.batches)
        if flt is not None:
            # Per message, on the broker; records where nothing matches are left out.
            kept = [(b, filter_mask(b.record, flt)) for b in result.batches]
            kept = [(b, m) for b, m in kept if not m or any(m)]
            records, masks = [b.record for b, _ in kept], [m for _, m in kept]
            count = sum(int.from_bytes(m, "little").bit_count() if m else b.count
                        for b, m in kept)  # fmt: skip
        if records:
            self.traffic.sent(req.topic, count, sum(len(r) for r in records))
        response = FetchResponse(
            status=result.status.value,
            next_offset=result.next_offset,
            min_offset=result.min_offset,
            max_offset=result.max_offset,
            record_sizes=[len(r) for r in records],
            masks=masks,
        )
        return response, records

    async def _read_remote(
        self, topic: str, queue: int, local: ReadResult, max_bytes: int, tag_mask: int
    ) -> ReadResult:
        """A read of an offset the store holds in the object store only (tiered storage)."""
        if self.tier is None:
            raise TierUnavailable(
                f"offset {local.next_offset} of {topic}/{queue} is in the object store, and "
                "tiered storage (tiered.url) is not set on this broker"
            )
        info = self._topics.get(topic)
        got = await self.tier.reads.read(info, queue, local.next_offset, max_bytes, tag_mask)
        if got is None:
            # Remote retention removed the offset while the read waited: out of range now.
            offset = local.next_offset
            return await self._gateway.call(
                lambda s: s.read(topic, queue, offset, max_bytes=max_bytes, tag_mask=tag_mask)
            )
        batches, next_offset = got
        status = ReadStatus.FOUND if batches else ReadStatus.NO_NEW_MESSAGE
        return ReadResult(status, batches, next_offset, local.min_offset, local.max_offset)

    async def list_offsets(self, req: ListOffsetsRequest) -> ListOffsetsResponse:
        await self._topics.check_queue(req.topic, req.queue)

        view = self._static.view(req.topic, req.queue)

        def run(store: MessageStore) -> tuple[int, int, int | None, int]:
            lo, hi = store.queue_bounds(req.topic, req.queue)
            at = None
            if req.timestamp_ms is not None:
                at = store.offset_for_time(req.topic, req.queue, req.timestamp_ms)
            return lo, hi, at, store.index_of(req.topic, req.queue)[1].min_offset

        lo, hi, at, local_min = await self._gateway.call(run)
        if at is not None and at <= local_min and lo < local_min and self.tier is not None:
            # The first local match may have an earlier one in the object store.
            assert req.timestamp_ms is not None
            info = self._topics.get(req.topic)
            remote = await self.tier.reads.offset_for_time(info, req.queue, req.timestamp_ms)
            at = at if remote is None else remote
        if view is None:
            return ListOffsetsResponse(min_offset=lo, max_offset=hi, offset_for_time=at)
        if at is not None:
            at = view.logical(max(at, lo))
        lo, hi = view.bounds(lo, hi)
        if self.tier is not None:
            lo, earlier = await foreign_bounds(self.tier, req, view, lo)
            at = earlier if earlier is not None else at
        if at is not None:
            at = min(max(at, lo), hi)
        return ListOffsetsResponse(min_offset=lo, max_offset=hi, offset_for_time=at)

    async def init_producer(self, req: InitProducerRequest) -> InitProducerResponse:
        # Every producer instance gets a fresh id at epoch 0: its sequences start over,
        # and nothing can confuse it with an earlier instance.
        producer_id = await self._gateway.call(lambda s: s.allocate_producer_id())
        window = self._config.store.idempotence_window
        return InitProducerResponse(producer_id=producer_id, epoch=0, window=window)


def _stamp(req: ProduceRequest) -> ProducerStamp | None:
    """The idempotence stamp of a plain produce (None: not idempotent)."""
    if req.producer_id < 0:
        return None
    if req.epoch < 0 or req.base_sequence < 0:
        raise InvalidRequest("an idempotent produce needs epoch and base_sequence >= 0")
    return ProducerStamp(req.producer_id, req.epoch, req.base_sequence)


def _message_kind(req: ProduceRequest) -> MessageType:
    if req.deliver_at_ms and req.txn_id:
        raise InvalidRequest("a message cannot be both delayed and transactional")
    if req.deliver_at_ms:
        if req.deliver_at_ms < 0:
            raise InvalidRequest(f"deliver_at_ms must be > 0, got {req.deliver_at_ms}")
        return MessageType.DELAY
    if req.txn_id:
        return MessageType.TRANSACTION
    return MessageType.NORMAL


#: What each declared topic type accepts (MIXED, the default, accepts everything). FIFO
#: topics take ordinary sends: their ordering comes from message groups, not from timers.
_ACCEPTS = {
    MessageType.NORMAL: {MessageType.NORMAL},
    MessageType.FIFO: {MessageType.NORMAL},
    MessageType.DELAY: {MessageType.DELAY},
    MessageType.TRANSACTION: {MessageType.TRANSACTION},
}


def _check_type(topic: str, declared: MessageType, kind: MessageType) -> None:
    accepts = _ACCEPTS.get(declared)
    if accepts is not None and kind not in accepts:
        what = {
            MessageType.NORMAL: "an ordinary message",
            MessageType.DELAY: "a delayed message",
            MessageType.TRANSACTION: "a transactional message",
        }[kind]
        raise MessageTypeMismatch(
            f"topic {topic!r} has message.type {declared.value}; {what} cannot be sent to it"
        )
