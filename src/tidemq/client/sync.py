"""The synchronous client API: thin wrappers running the asyncio classes on a background
loop (`_loop`). Same names and arguments as `tidemq.aio`; durations in seconds as floats
unless the name carries its unit."""

from __future__ import annotations

import concurrent.futures
import contextlib
import inspect
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, Self, TypeVar

from tidemq.client._loop import call_soon, run
from tidemq.client.acls import Acl
from tidemq.client.admin import AsyncAdmin
from tidemq.client.blocking_send import BlockingSends
from tidemq.client.broadcast_consumer import AsyncBroadcastConsumer
from tidemq.client.cluster import ClientConfig
from tidemq.client.group_consumer import AssignmentCallback, AsyncGroupConsumer
from tidemq.client.key_query import DEFAULT_QUERY_LIMIT
from tidemq.client.kv import CompactionReport, KeyLookup
from tidemq.client.producer import AsyncProducer, Delay, DeliverAt, ValueSerializer
from tidemq.client.push_consumer import DEFAULT_RETRY_POLICY, AsyncPushConsumer, RetryPolicy
from tidemq.client.records import check_send, due_ms_of
from tidemq.client.results import (
    BrokerInfo,
    BrokerStatus,
    CancelResult,
    CommittedOffset,
    GroupDescription,
    LeaderHandover,
    NewTopic,
    PopStatus,
    ResumeResult,
    TierFile,
    TierStatus,
    TimerStatus,
    TopicInfo,
    TransactionStatus,
    UserInfo,
)
from tidemq.client.simple_consumer import AsyncReceivedMessage, AsyncSimpleConsumer, Filter
from tidemq.client.static_admin import RemapReport
from tidemq.client.static_leave import PrunedQueue
from tidemq.client.stream_consumer import AsyncStreamConsumer, D, TopicQueue
from tidemq.client.table_view import AsyncTableView, TableListener
from tidemq.client.transaction import (
    AsyncTransaction,
    AsyncTransactionProducer,
    Checker,
    TxnRef,
)
from tidemq.core.batch import MessageRecord
from tidemq.core.errors import RequestTimeout, TidemqError
from tidemq.core.filters import Sql92
from tidemq.core.message import Message, MessageBatch, Receipt, V
from tidemq.core.scram import DEFAULT_ITERATIONS

__all__ = [
    "Admin",
    "BroadcastConsumer",
    "GroupConsumer",
    "Producer",
    "PushConsumer",
    "ReceivedMessage",
    "SimpleConsumer",
    "StreamConsumer",
    "Transaction",
    "TransactionProducer",
]


async def _make(cls: type[Any], *args: Any, **kwargs: Any) -> Any:
    return cls(*args, **kwargs)


class Producer:
    """Sends messages; see `tidemq.aio.Producer` for the behaviour. Arguments are checked
    in the calling thread, so a wrong one raises at the call; sends to one queue are
    stored in the order of the calls, whichever method made them."""

    def __init__(
        self,
        bootstrap: str = "127.0.0.1:9876",
        *,
        linger_ms: float = 0,
        batch_bytes: int = 1 << 20,
        batch_messages: int = 4096,
        idempotent: bool = True,
        acks: str | int = "all",
        compression: str = "none",
        max_in_flight_per_queue: int = 32,
        delivery_timeout_ms: int = 120_000,
        max_request_bytes: int = 16 << 20,
        client_config: ClientConfig | None = None,
        value_serializer: ValueSerializer | None = None,
        key_serializer: ValueSerializer | None = None,
    ) -> None:
        """`value_serializer(topic, value) -> bytes` and `key_serializer(topic, key) ->
        bytes`: see `tidemq.aio.Producer` (they run in the calling thread, so a value or a
        key that does not fit raises at the call)."""
        self._p: AsyncProducer = run(
            _make(
                AsyncProducer, bootstrap, linger_ms=linger_ms, batch_bytes=batch_bytes,
                batch_messages=batch_messages, idempotent=idempotent, acks=acks,
                compression=compression, max_in_flight_per_queue=max_in_flight_per_queue,
                delivery_timeout_ms=delivery_timeout_ms, max_request_bytes=max_request_bytes,
                client_config=client_config, value_serializer=value_serializer,
                key_serializer=key_serializer,
            )
        )  # fmt: skip
        #: The longest a blocking send waits: the delivery timeout, one attempt's grace,
        #: and a margin. Past it, something is wrong in the client itself: say so.
        self._wait_s = delivery_timeout_ms / 1000 + _SEND_WAIT_MARGIN_S
        self._blocking = BlockingSends(self._p)

    def serialize(self, topic: object, value: object) -> object:
        """`value` through the producer's `value_serializer` (as it is without one)."""
        return self._p.serialize(topic, value)

    def serialize_key(self, topic: object, key: object) -> object:
        """`key` through the producer's `key_serializer` (as it is without one)."""
        return self._p.serialize_key(topic, key)

    def send(
        self,
        topic: str,
        value: object,
        *,
        key: object = None,
        tag: str | None = None,
        keys: Sequence[str] = (),
        headers: Mapping[str, bytes] | None = None,
        queue: int | None = None,
        timestamp: datetime | float | None = None,
        delay: Delay = None,
        deliver_at: DeliverAt = None,
    ) -> Receipt:
        """Send one message and wait for its receipt. `delay` (seconds or a timedelta) or
        `deliver_at` (aware datetime or epoch seconds) schedules it (see `cancel`).

        When nothing else of this producer is on its way, the message is written and its
        answer read on the calling thread (`blocking_send.py`), not on the client loop."""
        checked = check_send(
            topic,
            self._p.serialize(topic, value),
            self._p.serialize_key(topic, key),
            tag,
            keys,
            headers,
            queue,
            timestamp,
        )
        due_ms = due_ms_of(delay, deliver_at)
        if not due_ms:
            sent = self._blocking.send(*checked)
            if isinstance(sent, Receipt):
                return sent
            if sent is not None:  # handed to the loop after an unknown outcome
                return _wait(sent, self._wait_s)
        return _wait(self._start_send(checked, due_ms), self._wait_s)

    def send_async(
        self,
        topic: str,
        value: object,
        *,
        key: object = None,
        tag: str | None = None,
        keys: Sequence[str] = (),
        headers: Mapping[str, bytes] | None = None,
        queue: int | None = None,
        timestamp: datetime | float | None = None,
        delay: Delay = None,
        deliver_at: DeliverAt = None,
    ) -> concurrent.futures.Future[Receipt]:
        """Send one message; the future completes with its receipt. Sends made close
        together to one queue travel as one batch (but for the first, which leaves at once
        when nothing else is on its way to that queue). Cancelling the future stops the
        send only before the client loop has picked it up."""
        checked = check_send(
            topic,
            self._p.serialize(topic, value),
            self._p.serialize_key(topic, key),
            tag,
            keys,
            headers,
            queue,
            timestamp,
        )
        return self._start_send(checked, due_ms_of(delay, deliver_at))

    def _start_send(
        self, checked: tuple[str, MessageRecord, bytes | None, int | None], due_ms: int
    ) -> concurrent.futures.Future[Receipt]:
        future: concurrent.futures.Future[Receipt] = concurrent.futures.Future()
        self._blocking.track(future)  # no blocking send overtakes it
        # One loop wake-up, no task: the producer completes `future` from the answer.
        call_soon(self._p.start_send, future, *checked, due_ms)
        return future

    def send_batch(
        self,
        topic: str,
        values: Sequence[object],
        *,
        keys: Sequence[object] | None = None,
        tags: Sequence[str | None] | None = None,
        headers: Mapping[str, bytes] | None = None,
        queue: int | None = None,
        timestamp: datetime | float | None = None,
        delay: Delay = None,
        deliver_at: DeliverAt = None,
    ) -> Sequence[Receipt]:
        """Send `values` as one end-to-end batch (one record, one index entry)."""
        future = self.send_batch_async(
            topic, values, keys=keys, tags=tags, headers=headers, queue=queue,
            timestamp=timestamp, delay=delay, deliver_at=deliver_at,
        )  # fmt: skip
        return _wait(future, self._wait_s)

    def send_batch_async(
        self,
        topic: str,
        values: Sequence[object],
        *,
        keys: Sequence[object] | None = None,
        tags: Sequence[str | None] | None = None,
        headers: Mapping[str, bytes] | None = None,
        queue: int | None = None,
        timestamp: datetime | float | None = None,
        delay: Delay = None,
        deliver_at: DeliverAt = None,
    ) -> concurrent.futures.Future[Sequence[Receipt]]:
        """`send_batch`, returning a future of the receipts (in order with every other
        send of this producer to the same queue)."""
        checked = self._p.check_batch(topic, values, keys, tags, headers, queue, timestamp)
        due_ms = due_ms_of(delay, deliver_at)
        future: concurrent.futures.Future[Sequence[Receipt]] = concurrent.futures.Future()
        self._blocking.track(future)
        call_soon(self._p.start_send_batch, future, *checked, due_ms)
        return future

    def cancel(self, message_id: str) -> CancelResult:
        """Cancel a delayed message before delivery (AlreadyDelivered after it)."""
        return run(self._p.cancel(message_id))

    def flush(self) -> None:
        run(self._p.flush())

    def close(self) -> None:
        self._blocking.close()
        run(self._p.close())

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: What a blocking send waits beyond the delivery timeout before it reports the client
#: stuck: one attempt's grace (1 s) plus room for a loaded machine.
_SEND_WAIT_MARGIN_S = 15.0

T = TypeVar("T")


def _wait(future: concurrent.futures.Future[T], timeout_s: float) -> T:
    """The future's result, or RequestTimeout after `timeout_s` (never a hang)."""
    try:
        return future.result(timeout_s)
    except concurrent.futures.TimeoutError:
        raise RequestTimeout(
            f"no answer within {timeout_s:.0f} s (the delivery timeout and a margin); "
            "the outcome is unknown"
        ) from None


class TransactionProducer:
    """Transactional (half) messages; see `tidemq.aio.TransactionProducer`. A plain
    `checker` function runs on a worker thread when the broker checks back."""

    def __init__(
        self,
        bootstrap: str = "127.0.0.1:9876",
        group: str = "",
        *,
        checker: Checker | None = None,
        client_config: ClientConfig | None = None,
        compression: str = "none",
    ) -> None:
        self._p: AsyncTransactionProducer = run(
            _make(
                AsyncTransactionProducer, bootstrap, group, checker=checker,
                client_config=client_config, compression=compression,
            )
        )  # fmt: skip
        run(self._p.start())  # a checker answers from now on, not from the first begin

    def begin(self) -> Transaction:
        return Transaction(run(self._p.begin()))

    @contextlib.contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """Commits when the block ends normally, rolls back when it raises."""
        tx = self.begin()
        try:
            yield tx
        except BaseException:
            if not tx.ended:
                with contextlib.suppress(TidemqError):
                    tx.rollback()
            raise
        if not tx.ended:
            tx.commit()

    def commit_many(
        self, refs: Sequence[TxnRef], *, sink_id: str = "", batch_id: int = -1
    ) -> list[Receipt]:
        return run(self._p.commit_many(refs, sink_id=sink_id, batch_id=batch_id))

    def rollback_many(self, refs: Sequence[TxnRef]) -> None:
        run(self._p.rollback_many(refs))

    def sink_marker(self, sink_id: str) -> int:
        return run(self._p.sink_marker(sink_id))

    def close(self) -> None:
        run(self._p.close())

    def __enter__(self) -> TransactionProducer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Transaction:
    """One transaction of a `TransactionProducer`."""

    def __init__(self, tx: AsyncTransaction) -> None:
        self._tx = tx

    @property
    def ended(self) -> bool:
        return self._tx.ended

    @property
    def refs(self) -> list[TxnRef]:
        return self._tx.refs

    def send(
        self,
        topic: str,
        value: bytes | None,
        *,
        key: bytes | None = None,
        tag: str | None = None,
        keys: Sequence[str] = (),
        headers: Mapping[str, bytes] | None = None,
        queue: int | None = None,
        timestamp: datetime | float | None = None,
    ) -> Receipt:
        return run(
            self._tx.send(
                topic, value, key=key, tag=tag, keys=keys, headers=headers, queue=queue,
                timestamp=timestamp,
            )
        )  # fmt: skip

    def send_batch(
        self,
        topic: str,
        values: Sequence[bytes | None],
        *,
        keys: Sequence[bytes | None] | None = None,
        tags: Sequence[str | None] | None = None,
        headers: Mapping[str, bytes] | None = None,
        queue: int | None = None,
        timestamp: datetime | float | None = None,
    ) -> list[Receipt]:
        return run(
            self._tx.send_batch(
                topic, values, keys=keys, tags=tags, headers=headers, queue=queue,
                timestamp=timestamp,
            )
        )  # fmt: skip

    def commit(self, *, sink_id: str = "", batch_id: int = -1) -> list[Receipt]:
        return run(self._tx.commit(sink_id=sink_id, batch_id=batch_id))

    def rollback(self) -> None:
        run(self._tx.rollback())


class BroadcastConsumer(Generic[D]):
    """Every member gets every message; see `tidemq.aio.BroadcastConsumer`."""

    def __init__(
        self,
        bootstrap: str,
        group: str,
        topics: Iterable[str],
        *,
        member: str,
        start: str = "latest",
        auto_commit: bool = True,
        filter: str | Sql92 | None = None,
        client_config: ClientConfig | None = None,
        value_deserializer: Callable[[bytes], D] | None = None,
    ) -> None:
        self._c: AsyncBroadcastConsumer[D] = run(
            _make(
                AsyncBroadcastConsumer, bootstrap, group, topics, member=member, start=start,
                auto_commit=auto_commit, filter=filter, client_config=client_config,
                value_deserializer=value_deserializer,
            )
        )  # fmt: skip

    def poll(self, timeout_ms: int = 1000) -> list[Message[D | None]]:
        return run(self._c.poll(timeout_ms))

    def commit(self) -> None:
        run(self._c.commit())

    def close(self) -> None:
        run(self._c.close())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class StreamConsumer(Generic[D]):
    """Assign queues, seek, poll; see `tidemq.aio.StreamConsumer`."""

    def __init__(
        self,
        bootstrap: str = "127.0.0.1:9876",
        *,
        start: str = "latest",
        max_bytes_per_queue: int = 1 << 20,
        fetch_wait_ms: int = 500,
        tags: Iterable[str] | None = None,
        filter: str | Sql92 | None = None,
        client_config: ClientConfig | None = None,
        value_deserializer: Callable[[bytes], D] | None = None,
    ) -> None:
        self._c: AsyncStreamConsumer[D] = run(
            _make(
                AsyncStreamConsumer, bootstrap, start=start,
                max_bytes_per_queue=max_bytes_per_queue, fetch_wait_ms=fetch_wait_ms,
                tags=tags, filter=filter, client_config=client_config,
                value_deserializer=value_deserializer,
            )
        )  # fmt: skip

    def assign(self, queues: Iterable[TopicQueue]) -> None:
        """Read exactly these queues, a list of (topic, queue) pairs."""
        run(_call(self._c.assign, queues))

    def assignment(self) -> list[TopicQueue]:
        return self._c.assignment()

    def seek(self, topic: str, queue: int, offset: int) -> None:
        """Read `topic`/`queue` from `offset` next (past the end: the next poll raises
        OffsetOutOfRange)."""
        run(_call(self._c.seek, topic, queue, offset))

    def position(self, topic: str, queue: int) -> int | None:
        return run(_call(self._c.position, topic, queue))  # type: ignore[no-any-return]

    def seek_to_beginning(self, topic: str | None = None, queue: int | None = None) -> None:
        """`topic`/`queue`, every assigned queue of `topic`, or every assigned queue, to
        its first offset."""
        run(self._c.seek_to_beginning(topic, queue))

    def seek_to_end(self, topic: str | None = None, queue: int | None = None) -> None:
        """`topic`/`queue`, every assigned queue of `topic`, or every assigned queue, to
        its end."""
        run(self._c.seek_to_end(topic, queue))

    def seek_to_time(
        self, timestamp: float | datetime, topic: str | None = None, queue: int | None = None
    ) -> None:
        """`topic`/`queue`, every assigned queue of `topic`, or every assigned queue, to
        its first message at or after `timestamp` (seconds since the epoch, or an aware
        datetime)."""
        run(self._c.seek_to_time(timestamp, topic, queue))

    def poll(self, timeout_ms: int = 1000) -> list[Message[D | None]]:
        return run(self._c.poll(timeout_ms))

    def poll_batches(self, timeout_ms: int = 1000) -> list[MessageBatch]:
        """`poll`, column by column (see `tidemq.aio.StreamConsumer.poll_batches`)."""
        return run(self._c.poll_batches(timeout_ms))

    def __iter__(self) -> Iterator[Message[D | None]]:
        while True:
            yield from self.poll()

    def close(self) -> None:
        run(self._c.close())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class TableView:
    """The latest value of every key of a compact topic, kept current; see
    `tidemq.aio.TableView`. Filled when the constructor returns; listeners run on the
    client's background thread."""

    def __init__(
        self,
        topic: str,
        bootstrap: str = "127.0.0.1:9876",
        *,
        client_config: ClientConfig | None = None,
    ) -> None:
        view: AsyncTableView = run(
            _make(AsyncTableView, topic, bootstrap, client_config=client_config)
        )
        self._v = run(view.start())
        self.topic = self._v.topic

    def get(self, key: bytes) -> bytes | None:
        return self._v.get(key)

    def refresh(self) -> None:
        """Apply every message stored before this call (read-your-writes)."""
        run(self._v.refresh())

    def listen(self, listener: TableListener) -> None:
        self._v.listen(listener)

    def snapshot(self) -> dict[bytes, bytes]:
        return run(_call(self._v.snapshot))

    def __contains__(self, key: object) -> bool:
        return key in self._v

    def __len__(self) -> int:
        return len(self._v)

    def close(self) -> None:
        run(self._v.close())

    def __enter__(self) -> TableView:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class GroupConsumer(Generic[D]):
    """A member of a consumer group; see `tidemq.aio.GroupConsumer`."""

    def __init__(
        self,
        bootstrap: str,
        group: str,
        topics: Iterable[str],
        *,
        start: str | float | datetime = "latest",
        auto_commit: bool = True,
        session_timeout_ms: int = 10_000,
        heartbeat_interval_ms: int = 1_000,
        client_id: str = "",
        on_assign: AssignmentCallback | None = None,
        on_revoke: AssignmentCallback | None = None,
        max_bytes_per_queue: int = 1 << 20,
        filter: str | Sql92 | None = None,
        client_config: ClientConfig | None = None,
        value_deserializer: Callable[[bytes], D] | None = None,
    ) -> None:
        self._c: AsyncGroupConsumer[D] = run(
            _make(
                AsyncGroupConsumer, bootstrap, group, topics, start=start,
                auto_commit=auto_commit, session_timeout_ms=session_timeout_ms,
                heartbeat_interval_ms=heartbeat_interval_ms, client_id=client_id,
                on_assign=on_assign, on_revoke=on_revoke,
                max_bytes_per_queue=max_bytes_per_queue, filter=filter,
                client_config=client_config, value_deserializer=value_deserializer,
            )
        )  # fmt: skip

    @property
    def member_id(self) -> str:
        return self._c.member_id

    @property
    def generation(self) -> int:
        return self._c.generation

    def assignment(self) -> list[TopicQueue]:
        return self._c.assignment()

    def poll(self, timeout_ms: int = 1000) -> list[Message[D | None]]:
        return run(self._c.poll(timeout_ms))

    def commit(self, offsets: dict[TopicQueue, int] | None = None) -> None:
        run(self._c.commit(offsets))

    def __iter__(self) -> Iterator[Message[D | None]]:
        while True:
            yield from self.poll()

    def close(self) -> None:
        run(self._c.close())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Admin:
    """Topics, groups, cluster; see `tidemq.aio.Admin`."""

    def __init__(
        self, bootstrap: str = "127.0.0.1:9876", *, client_config: ClientConfig | None = None
    ) -> None:
        self._a: AsyncAdmin = run(_make(AsyncAdmin, bootstrap, client_config=client_config))

    def create_topic(
        self,
        name: str,
        queues: int = 8,
        *,
        message_type: str = "MIXED",
        config: Mapping[str, str] | None = None,
        exist_ok: bool = False,
        static: bool = False,
        brokers: list[str] | None = None,
    ) -> TopicInfo:
        """Create a topic; with `exist_ok`, an existing topic's info is returned as it is
        (even if its queues, type or configs differ from the ones asked for). `static`: a
        static topic over `brokers` (names; default every live broker), see
        `AsyncAdmin.create_topic`."""
        return run(
            self._a.create_topic(
                name,
                queues,
                message_type=message_type,
                config=config,
                exist_ok=exist_ok,
                static=static,
                brokers=brokers,
            )
        )

    def create_topics(
        self, topics: Iterable[NewTopic], *, exist_ok: bool = False
    ) -> list[TopicInfo]:
        """See `AsyncAdmin.create_topics`."""
        return run(self._a.create_topics(topics, exist_ok=exist_ok))

    def get_message(self, message_id: str) -> Message | None:
        """See `AsyncAdmin.get_message`."""
        return run(self._a.get_message(message_id))

    def message_at(
        self, topic: str, queue: int, *, offset: int | None = None, at: float | None = None
    ) -> Message | None:
        """See `AsyncAdmin.message_at`."""
        return run(self._a.message_at(topic, queue, offset=offset, at=at))

    def rollback_transaction(self, txn_id: str) -> None:
        """See `AsyncAdmin.rollback_transaction`."""
        run(self._a.rollback_transaction(txn_id))

    def messages(
        self,
        topic: str,
        queue: int,
        *,
        offset: int | None = None,
        at: float | None = None,
        limit: int = 20,
    ) -> list[Message]:
        """See `AsyncAdmin.messages`."""
        return run(self._a.messages(topic, queue, offset=offset, at=at, limit=limit))

    def query_messages(
        self,
        topic: str,
        key: str | bytes,
        *,
        start: float | datetime | None = None,
        end: float | datetime | None = None,
        limit: int = DEFAULT_QUERY_LIMIT,
    ) -> list[Message]:
        """See `AsyncAdmin.query_messages`."""
        return run(self._a.query_messages(topic, key, start=start, end=end, limit=limit))

    def remove_broker(self, name: str) -> list[PrunedQueue]:
        """See `AsyncAdmin.remove_broker`."""
        return run(self._a.remove_broker(name))

    def remap_topic(
        self,
        name: str,
        *,
        brokers: list[str] | None = None,
        queue: int | None = None,
        to: str | None = None,
        repair: bool = False,
    ) -> RemapReport:
        """Move a static topic's write ends (see `AsyncAdmin.remap_topic`)."""
        return run(self._a.remap_topic(name, brokers=brokers, queue=queue, to=to, repair=repair))

    def alter_topic(
        self, name: str, *, queues: int | None = None, config: Mapping[str, str] | None = None
    ) -> TopicInfo:
        return run(self._a.alter_topic(name, queues=queues, config=config))

    def delete_topic(self, name: str) -> None:
        run(self._a.delete_topic(name))

    def list_topics(
        self,
        prefix: str = "",
        *,
        after: str = "",
        limit: int | None = None,
        keep: Callable[[str], bool] | None = None,
    ) -> list[TopicInfo]:
        """See `tidemq.aio.Admin.list_topics`."""
        return run(self._a.list_topics(prefix, after=after, limit=limit, keep=keep))

    def describe_topic(self, name: str) -> TopicInfo:
        return run(self._a.describe_topic(name))

    def get(self, topic: str, key: bytes) -> bytes | None:
        """The latest value of `key` in compact topic `topic` (None: deleted or unknown)."""
        return run(self._a.get(topic, key))

    def lookup(self, topic: str, key: bytes) -> KeyLookup | None:
        """`get` with the queue, offset and timestamp of the key's latest message."""
        return run(self._a.lookup(topic, key))

    def compact(self, topic: str) -> list[CompactionReport]:
        """Compact every queue of compact topic `topic` now."""
        return run(self._a.compact(topic))

    def list_groups(self) -> list[str]:
        return run(self._a.list_groups())

    def describe_group(self, group: str) -> GroupDescription:
        return run(self._a.describe_group(group))

    def reset_offsets(
        self, group: str, topic: str, *, to: str, value: int = 0, execute: bool = False
    ) -> list[CommittedOffset]:
        return run(self._a.reset_offsets(group, topic, to=to, value=value, execute=execute))

    def cluster_status(self) -> list[BrokerInfo]:
        return run(self._a.cluster_status())

    def broker_status(self, address: str) -> BrokerStatus:
        return run(self._a.broker_status(address))

    def elect_leader(
        self, group: str, member: str, *, timeout_ms: int = 10_000, wait_ms: int = 30_000
    ) -> LeaderHandover:
        """See `tidemq.aio.Admin.elect_leader`."""
        return run(
            self._a.elect_leader(group, member, timeout_ms=timeout_ms, wait_ms=wait_ms),
            timeout_s=(timeout_ms + wait_ms) / 1000 + 30,
        )

    def timer_status(self, topic: str = "") -> TimerStatus:
        return run(self._a.timer_status(topic))

    def tier_status(self, topic: str = "") -> list[TierStatus]:
        return run(self._a.tier_status(topic))

    def tier_offload(self, topic: str) -> list[TierStatus]:
        return run(self._a.tier_offload(topic))

    def tier_files(
        self, topic: str, *, queue: int | None = None, start: int = 0, end: int | None = None
    ) -> list[TierFile]:
        return run(self._a.tier_files(topic, queue=queue, start=start, end=end))

    def pop_status(self, group: str) -> list[PopStatus]:
        return run(self._a.pop_status(group))

    def resume(self, group: str, message_id: str, *, action: str = "retry") -> ResumeResult:
        return run(self._a.resume(group, message_id, action=action))

    def transaction_status(self) -> TransactionStatus:
        return run(self._a.transaction_status())

    def create_user(
        self, name: str, password: str, *, iterations: int = DEFAULT_ITERATIONS
    ) -> None:
        """Create a user (or set its password) on every live broker."""
        run(self._a.create_user(name, password, iterations=iterations))

    def delete_user(self, name: str) -> None:
        run(self._a.delete_user(name))

    def list_users(self) -> list[UserInfo]:
        return run(self._a.list_users())

    def create_acls(self, acls: Iterable[Acl]) -> int:
        """Add ACL entries on every live broker; how many were new."""
        return run(self._a.create_acls(acls))

    def delete_acls(self, acls: Iterable[Acl]) -> int:
        """Remove ACL entries on every live broker; how many were there."""
        return run(self._a.delete_acls(acls))

    def list_acls(
        self, *, principal: str | None = None, resource_type: str | None = None
    ) -> list[Acl]:
        return run(self._a.list_acls(principal=principal, resource_type=resource_type))

    def dead_letters(self, group: str, *, limit: int = 100) -> list[Message]:
        """The first `limit` messages of `%DLQ%<group>`, with their `tidemq.dlq.*` headers."""
        return run(self._a.dead_letters(group, limit=limit))

    def redrive(self, group: str, *, limit: int | None = None) -> int:
        """Send dead letters not redriven yet back to their origin topics; how many."""
        return run(self._a.redrive(group, limit=limit))

    def redrive_position(self, group: str) -> int:
        return run(self._a.redrive_position(group))

    def close(self) -> None:
        run(self._a.close())

    def __enter__(self) -> Admin:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True, slots=True)
class ReceivedMessage(Message[V]):
    """A leased message (see `SimpleConsumer`): `Message` fields plus its delivery attempt
    and handle, with `ack`, `nack`, `release` and `change_invisible_duration`."""

    delivery_attempt: int = 1
    #: Opaque: names this lease. A newer lease of the same message makes it stale.
    handle: str = ""
    #: When the lease runs out (epoch ms), unless acked or changed.
    invisible_until_ms: int = 0
    _leased: AsyncReceivedMessage[V] | None = field(default=None, repr=False, compare=False)

    @classmethod
    def _of(cls, m: AsyncReceivedMessage[V]) -> ReceivedMessage[V]:
        return ReceivedMessage(
            m.topic, m.queue, m.offset, m.value, m.key, m.tag, m.keys, m.headers, m.timestamp_ms,
            m.origin, m.deliver_at_ms, m.delivery_attempt, m.handle, m.invisible_until_ms, m,
        )  # fmt: skip

    def _lease(self) -> AsyncReceivedMessage[V]:
        if self._leased is None:
            raise TidemqError("this message was not received by a SimpleConsumer")
        return self._leased

    def ack(self) -> None:
        """Done: the group never sees it again."""
        run(self._lease().ack())

    def nack(self, delay: float = 0.0, *, reason: str = "") -> None:
        """Deliver it again after `delay` seconds; this delivery counts as an attempt."""
        run(self._lease().nack(delay, reason=reason))

    def release(self) -> None:
        """Give it back at once, without counting this delivery."""
        run(self._lease().release())

    def change_invisible_duration(self, duration: float) -> ReceivedMessage[V]:
        """Keep the lease `duration` seconds from now; returns the message with its new
        handle (this one becomes stale)."""
        return ReceivedMessage._of(run(self._lease().change_invisible_duration(duration)))


def _received(msg: object, arg: str = "msg") -> ReceivedMessage[Any]:
    if not isinstance(msg, ReceivedMessage):
        raise TypeError(
            f"{arg} must be a message received by this consumer, got {type(msg).__name__}"
        )
    return msg


class SimpleConsumer(Generic[D]):
    """Pop consumption: lease messages, then ack / nack / release each; see
    `tidemq.aio.SimpleConsumer`."""

    def __init__(
        self,
        bootstrap: str = "127.0.0.1:9876",
        group: str = "",
        subscriptions: Mapping[str, Filter] | None = None,
        *,
        invisible_duration: float = 60.0,
        max_attempts: int = 16,
        on_exhausted: str = "dead-letter",
        await_duration: float = 5.0,
        client_config: ClientConfig | None = None,
        value_deserializer: Callable[[bytes], D] | None = None,
    ) -> None:
        self._c: AsyncSimpleConsumer[D] = run(
            _make(
                AsyncSimpleConsumer, bootstrap, group, subscriptions,
                invisible_duration=invisible_duration, max_attempts=max_attempts,
                on_exhausted=on_exhausted, await_duration=await_duration,
                client_config=client_config, value_deserializer=value_deserializer,
            )
        )  # fmt: skip

    @property
    def group(self) -> str:
        return self._c.group

    def receive(
        self, max_messages: int = 16, invisible_duration: float | None = None
    ) -> list[ReceivedMessage[D | None]]:
        """Lease up to `max_messages` messages; waits up to `await_duration` for some."""
        got = run(self._c.receive(max_messages, invisible_duration))
        return [ReceivedMessage._of(m) for m in got]

    def ack(self, msg: ReceivedMessage[Any]) -> None:
        _received(msg).ack()

    def ack_many(self, messages: Iterable[ReceivedMessage[Any]]) -> None:
        """Acknowledge several in one request per broker; raises for the first refused."""
        if not isinstance(messages, list | tuple):
            raise TypeError(f"messages must be a list of messages, got {type(messages).__name__}")
        leases = [_received(m, f"messages[{i}]")._lease() for i, m in enumerate(messages)]
        run(self._c.ack_many(leases))

    def nack(self, msg: ReceivedMessage[Any], *, delay: float = 0.0, reason: str = "") -> None:
        _received(msg).nack(delay, reason=reason)

    def release(self, msg: ReceivedMessage[Any]) -> None:
        _received(msg).release()

    def change_invisible_duration(
        self, msg: ReceivedMessage[V], duration: float
    ) -> ReceivedMessage[V]:
        return _received(msg).change_invisible_duration(duration)

    def close(self) -> None:
        run(self._c.close())

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class PushConsumer:
    """Calls `handler(message)` for every message, on worker threads, with retries and
    dead letters; see `tidemq.aio.PushConsumer`. The handler is a plain function of a
    `ReceivedMessage`: it returns (the message is acknowledged) or raises (retried after
    `retry_policy.delay(attempt)`; after `max_attempts` deliveries, dead-lettered)."""

    def __init__(
        self,
        bootstrap: str = "127.0.0.1:9876",
        group: str = "",
        subscriptions: Mapping[str, Filter] | None = None,
        handler: Callable[[ReceivedMessage[Any]], object] | None = None,
        *,
        max_concurrency: int = 16,
        max_attempts: int = 16,
        on_exhausted: str = "dead-letter",
        retry_policy: RetryPolicy = DEFAULT_RETRY_POLICY,
        invisible_duration: float = 60.0,
        handler_timeout: float | None = None,
        await_duration: float = 1.0,
        client_config: ClientConfig | None = None,
        value_deserializer: Callable[[bytes], Any] | None = None,
    ) -> None:
        if handler is None or not callable(handler):
            raise TypeError("a PushConsumer needs a handler: a function of one message")
        if inspect.iscoroutinefunction(handler):
            raise TypeError(
                "the handler of tidemq.PushConsumer is a plain function; a coroutine "
                "function goes to tidemq.aio.PushConsumer"
            )
        user = handler

        def on_worker_thread(m: AsyncReceivedMessage[Any]) -> object:
            return user(ReceivedMessage._of(m))

        self._c: AsyncPushConsumer = run(
            _make(
                AsyncPushConsumer, bootstrap, group, subscriptions, on_worker_thread,
                max_concurrency=max_concurrency, max_attempts=max_attempts,
                on_exhausted=on_exhausted, retry_policy=retry_policy,
                invisible_duration=invisible_duration, handler_timeout=handler_timeout,
                await_duration=await_duration, client_config=client_config,
                value_deserializer=value_deserializer,
            )
        )  # fmt: skip

    @property
    def group(self) -> str:
        return self._c.group

    @property
    def running(self) -> bool:
        return self._c.running

    def start(self) -> PushConsumer:
        """Start receiving and handling in the background; returns self."""
        run(self._c.start())
        return self

    def close(self) -> None:
        """Stop receiving and wait for the running handlers to finish."""
        run(self._c.close())

    def __enter__(self) -> PushConsumer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


async def _call(fn: Any, *args: Any) -> Any:
    return fn(*args)
