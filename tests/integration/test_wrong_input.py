"""Wrong input against a real broker: every public consumer argument of the wrong kind or
value is refused at the call (promptly, before anything is sent) with a TypeError or
ValueError naming the argument, and the consumer keeps working afterwards. The broker
enforces the same rules for clients that skip these checks: the name rule of
`tidemq.core.names`, and commits only within a queue's range."""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, cast

import pytest

import tidemq
from tidemq import aio
from tidemq import aio as _aio
from tidemq.client.cluster import ClusterClient
from tidemq.core.errors import (
    InvalidRequest,
    InvalidTopicName,
    OffsetOutOfRange,
    QueueNotFound,
)
from tidemq.protocol.commands import (
    CommitOffsetsRequest,
    CommitOffsetsResponse,
    CreateTopicRequest,
    DescribeGroupRequest,
    DescribeGroupResponse,
    JoinGroupRequest,
    JoinGroupResponse,
    PopReceiveRequest,
    PopReceiveResponse,
    PopSubscription,
    QueueOffset,
    TopicInfoMsg,
)

if TYPE_CHECKING:
    from tests.integration.conftest import BrokerEnv, Loop, ThreadedBroker

pytestmark = pytest.mark.timeout(120)

TOPIC = "orders"
#: A refused call returns at once: no request, no wait for the broker.
PROMPT_S = 0.5

Call = Callable[[], Any]
#: (what the row shows, the call, the exception, a regex its message matches)
Row = tuple[str, Call, type[Exception], str]


async def _setup(address: str, queues: int = 2, per_queue: int = 3) -> None:
    async with aio.Admin(address) as admin:
        await admin.create_topic(TOPIC, queues)
    async with aio.Producer(address) as producer:
        for q in range(queues):
            for i in range(per_queue):
                await producer.send(TOPIC, b"m-%d-%d" % (q, i), queue=q)


async def _outcome(call: Call) -> object:
    """What `call()` gives, awaited if it is awaitable."""
    result = call()
    return await result if isinstance(result, Awaitable) else result


async def _refused(rows: list[Row]) -> None:
    """Each call raises what its row says, promptly (awaiting it if it is a coroutine)."""
    for what, call, error, match in rows:
        started = time.monotonic()
        with pytest.raises(error, match=match):
            await _outcome(call)
        elapsed = time.monotonic() - started
        assert elapsed < PROMPT_S, f"{what} took {elapsed:.2f} s to be refused"


async def _read(consumer: aio.StreamConsumer | aio.GroupConsumer, n: int) -> list[tidemq.Message]:
    got: list[tidemq.Message] = []
    deadline = time.monotonic() + 20
    while len(got) < n and time.monotonic() < deadline:
        got.extend(await consumer.poll(500))
    return got


# ------------------------------------------------------------------ StreamConsumer


def test_stream_consumer_constructor_checks_its_arguments(loop: Loop, broker: BrokerEnv) -> None:
    a = broker.address
    aio: Any = _aio  # wrong types on purpose
    rows: list[Row] = [
        ("start", lambda: aio.StreamConsumer(a, start="first"), ValueError, "^start must be"),
        ("start int", lambda: aio.StreamConsumer(a, start=0), ValueError, "^start must be"),
        ("tags str", lambda: aio.StreamConsumer(a, tags="paid"), TypeError, "^tags must be a list"),
        ("tag space", lambda: aio.StreamConsumer(a, tags=["a b"]), ValueError, r"^tags\[0\]"),
        ("filter", lambda: aio.StreamConsumer(a, filter=5), TypeError, "^filter must be"),
        (
            "fetch_wait_ms",
            lambda: aio.StreamConsumer(a, fetch_wait_ms=-1),
            ValueError,
            "^fetch_wait_ms must be 0 to",
        ),
        (
            "max_bytes",
            lambda: aio.StreamConsumer(a, max_bytes_per_queue=0),
            ValueError,
            "^max_bytes_per_queue must be 1 to",
        ),
    ]
    loop.run(_refused(rows))


def test_stream_consumer_refuses_wrong_arguments_and_keeps_working(
    loop: Loop, broker: BrokerEnv
) -> None:
    async def main() -> None:
        await _setup(broker.address)
        consumer = aio.StreamConsumer(broker.address, start="earliest")
        c: Any = consumer  # wrong types on purpose
        try:
            await _refused(
                [
                    ("assign str", lambda: c.assign(TOPIC), TypeError, r"not a str"),
                    (
                        "assign one pair",
                        lambda: c.assign((TOPIC, 0)),
                        TypeError,
                        r"^queues must be a list of \(topic, queue\) pairs: write "
                        r"\[\('orders', 0\)\]",
                    ),
                    (
                        "assign queue str",
                        lambda: c.assign([(TOPIC, "0")]),
                        TypeError,
                        r"^queues\[0\]: queue of .* must be an int",
                    ),
                    (
                        "assign queue -1",
                        lambda: c.assign([(TOPIC, -1)]),
                        ValueError,
                        r"^queues\[0\]: queue of .* must be 0 to",
                    ),
                    (
                        "assign bad topic",
                        lambda: c.assign([("..", 0)]),
                        InvalidTopicName,
                        r"^queues\[0\]: topic of .* starts with '\.'",
                    ),
                ]
            )
            assert consumer.assignment() == []
            consumer.assign([(TOPIC, 0), (TOPIC, 1)])
            await _refused(
                [
                    (
                        "seek pair",
                        lambda: c.seek((TOPIC, 0), 0, 1),
                        TypeError,
                        "two arguments",
                    ),
                    ("seek -1", lambda: c.seek(TOPIC, 0, -1), ValueError, "^offset must be 0 to"),
                    ("seek 2**64", lambda: c.seek(TOPIC, 0, 2**64), ValueError, "^offset must"),
                    (
                        "seek 1.5",
                        lambda: c.seek(TOPIC, 0, 1.5),
                        TypeError,
                        "^offset must be an int",
                    ),
                    (
                        "seek bool",
                        lambda: c.seek(TOPIC, True, 0),
                        TypeError,
                        "^queue must be an int",
                    ),
                    ("seek 7", lambda: c.seek(TOPIC, 7, 0), ValueError, "orders/7 is not assigned"),
                    (
                        "position",
                        lambda: c.position(TOPIC, "0"),
                        TypeError,
                        "^queue must be an int",
                    ),
                    (
                        "seek_to_beginning pair",
                        lambda: c.seek_to_beginning((TOPIC, 0)),
                        TypeError,
                        "two arguments",
                    ),
                    (
                        "seek_to_beginning 'topic', 0",
                        lambda: c.seek_to_beginning("topic", 0),
                        ValueError,
                        "topic/0 is not assigned",
                    ),
                    (
                        "seek_to_end queue alone",
                        lambda: c.seek_to_end(None, 0),
                        TypeError,
                        "needs its topic",
                    ),
                    (
                        "seek_to_end other topic",
                        lambda: c.seek_to_end("other"),
                        ValueError,
                        "no queue of topic 'other' is assigned",
                    ),
                    (
                        "seek_to_time ms",
                        lambda: c.seek_to_time(1.7e12),
                        ValueError,
                        "looks like milliseconds; pass seconds",
                    ),
                    ("seek_to_time str", lambda: c.seek_to_time("2024"), TypeError, "^timestamp"),
                    ("seek_to_time None", lambda: c.seek_to_time(None), TypeError, "^timestamp"),
                    ("seek_to_time nan", lambda: c.seek_to_time(math.nan), ValueError, "finite"),
                    ("poll -1", lambda: c.poll(-1), ValueError, "^timeout_ms must be 0 to"),
                    ("poll 1.5", lambda: c.poll(1.5), TypeError, "^timeout_ms must be an int"),
                    ("poll_batches", lambda: c.poll_batches("1"), TypeError, "^timeout_ms"),
                ]
            )
            # Still working: a good seek by time (seconds) and a poll.
            await consumer.seek_to_time(1.7e9)
            assert consumer.position(TOPIC, 0) == 0
            got = await _read(consumer, 6)
            assert sorted(m.value or b"" for m in got) == sorted(
                b"m-%d-%d" % (q, i) for q in range(2) for i in range(3)
            )
            await consumer.seek_to_beginning(TOPIC, 1)
            assert (consumer.position(TOPIC, 0), consumer.position(TOPIC, 1)) == (3, 0)
            await consumer.seek_to_end(TOPIC)
            assert (consumer.position(TOPIC, 0), consumer.position(TOPIC, 1)) == (3, 3)
        finally:
            await consumer.close()

    loop.run(main())


def test_a_seek_past_the_end_raises_at_poll_until_sought_again(
    loop: Loop, broker: BrokerEnv
) -> None:
    async def main() -> None:
        await _setup(broker.address)
        consumer = aio.StreamConsumer(broker.address, start="earliest")
        try:
            consumer.assign([(TOPIC, 0), (TOPIC, 1)])
            consumer.seek(TOPIC, 0, 10**12)
            for _ in range(2):  # and again: never a silent restart from offset 0
                with pytest.raises(OffsetOutOfRange, match=r"offset 10+ of orders/0 .*\[0, 3\]"):
                    await _read(consumer, 6)
            assert consumer.position(TOPIC, 0) == 10**12
            consumer.seek(TOPIC, 0, 3)  # the end itself is a valid position
            got = await _read(consumer, 3)
            assert sorted(m.value or b"" for m in got) == [b"m-1-0", b"m-1-1", b"m-1-2"]
            consumer.seek(TOPIC, 0, 1)
            got = await _read(consumer, 2)
            assert [m.value for m in got] == [b"m-0-1", b"m-0-2"]
        finally:
            await consumer.close()

    loop.run(main())


# ------------------------------------------------------------------ GroupConsumer


def test_group_consumer_refuses_wrong_arguments_and_keeps_working(
    loop: Loop, broker: BrokerEnv
) -> None:
    a = broker.address
    aio: Any = _aio  # wrong types on purpose

    async def main() -> None:
        await _setup(a)
        await _refused(
            [
                (
                    "topics str",
                    lambda: aio.GroupConsumer(a, "g", "ts"),
                    TypeError,
                    r"^topics must be a list of topic names, not a str: write \['ts'\]",
                ),
                ("topics []", lambda: aio.GroupConsumer(a, "g", []), ValueError, "at least one"),
                (
                    "topic ..",
                    lambda: aio.GroupConsumer(a, "g", [".."]),
                    InvalidTopicName,
                    r"^topics\[0\] '\.\.' starts with '\.'",
                ),
                (
                    "group name",
                    lambda: aio.GroupConsumer(a, "my group!", [TOPIC]),
                    ValueError,
                    "^group 'my group!' contains ' '",
                ),
                ("group int", lambda: aio.GroupConsumer(a, 5, [TOPIC]), TypeError, "^group must"),
                (
                    "start ms",
                    lambda: aio.GroupConsumer(a, "g", [TOPIC], start=1.7e12),
                    ValueError,
                    "^start .* looks like milliseconds",
                ),
                (
                    "start word",
                    lambda: aio.GroupConsumer(a, "g", [TOPIC], start="first"),
                    ValueError,
                    "^start must be",
                ),
                (
                    "session",
                    lambda: aio.GroupConsumer(a, "g", [TOPIC], session_timeout_ms="10"),
                    TypeError,
                    "^session_timeout_ms must be an int",
                ),
                (
                    "on_assign",
                    lambda: aio.GroupConsumer(a, "g", [TOPIC], on_assign=5),
                    TypeError,
                    "^on_assign must be a function",
                ),
                (
                    "auto_commit",
                    lambda: aio.GroupConsumer(a, "g", [TOPIC], auto_commit="no"),
                    TypeError,
                    "^auto_commit must be a bool",
                ),
            ]
        )
        group = aio.GroupConsumer(a, "billing", [TOPIC], start="earliest", auto_commit=False)
        g: Any = group  # wrong types on purpose
        try:
            assert len(await _read(group, 6)) == 6
            await _refused(
                [
                    ("poll str", lambda: g.poll("1"), TypeError, "^timeout_ms"),
                    (
                        "commit list",
                        lambda: g.commit([((TOPIC, 0), 1)]),
                        TypeError,
                        "^offsets must be a dict",
                    ),
                    (
                        "commit key str",
                        lambda: g.commit({TOPIC: 1}),
                        TypeError,
                        r"^offsets must hold \(topic, queue\) pairs",
                    ),
                    (
                        "commit -1",
                        lambda: g.commit({(TOPIC, 0): -1}),
                        ValueError,
                        r"^offsets\[\('orders', 0\)\] must be 0 to",
                    ),
                ]
            )
            await group.commit()
            assert [o.committed for o in (await _describe(a, "billing")).offsets] == [3, 3]
        finally:
            await group.close()

    loop.run(main())


async def _describe(address: str, group: str) -> DescribeGroupResponse:
    client = ClusterClient(address)
    try:
        return await client.call(address, DescribeGroupRequest(group=group), DescribeGroupResponse)
    finally:
        await client.close()


# ------------------------------------------------------------------ SimpleConsumer, PushConsumer


def test_simple_consumer_refuses_wrong_arguments_and_keeps_working(
    loop: Loop, broker: BrokerEnv
) -> None:
    a = broker.address
    aio: Any = _aio  # wrong types on purpose

    async def handler(msg: aio.ReceivedMessage) -> None:
        pass

    async def main() -> None:
        await _setup(a, queues=1)
        await _refused(
            [
                (
                    "subscriptions list",
                    lambda: aio.SimpleConsumer(a, "g", ["kt"]),
                    TypeError,
                    r"^subscriptions must be a dict of topic to filter .*got list: write",
                ),
                (
                    "subscriptions str",
                    lambda: aio.SimpleConsumer(a, "g", "kt"),
                    TypeError,
                    r"got str: write \{'kt': '\*'\}",
                ),
                (
                    "subscriptions None",
                    lambda: aio.SimpleConsumer(a, "g", None),
                    ValueError,
                    "^subscriptions are required",
                ),
                (
                    "filter int",
                    lambda: aio.SimpleConsumer(a, "g", {"kt": 5}),
                    TypeError,
                    r"^subscriptions\['kt'\] must be a tag expression",
                ),
                (
                    "topic ..",
                    lambda: aio.SimpleConsumer(a, "g", {"..": "*"}),
                    InvalidTopicName,
                    "^subscriptions: topic '..' starts with",
                ),
                (
                    "group",
                    lambda: aio.SimpleConsumer(a, "my group!", {TOPIC: "*"}),
                    ValueError,
                    "^group 'my group!'",
                ),
                (
                    "group empty",
                    lambda: aio.SimpleConsumer(a, "", {TOPIC: "*"}),
                    ValueError,
                    "^group '' is empty",
                ),
                (
                    "invisible inf",
                    lambda: aio.SimpleConsumer(a, "g", {TOPIC: "*"}, invisible_duration=math.inf),
                    ValueError,
                    "^invisible_duration must be a finite number",
                ),
                (
                    "max_attempts bool",
                    lambda: aio.SimpleConsumer(a, "g", {TOPIC: "*"}, max_attempts=True),
                    TypeError,
                    "^max_attempts must be an int",
                ),
                (
                    "push handler_timeout str",
                    lambda: aio.PushConsumer(a, "g", {TOPIC: "*"}, handler, handler_timeout="1"),
                    TypeError,
                    "^handler_timeout must be a number of seconds",
                ),
                (
                    "push subscriptions list",
                    lambda: aio.PushConsumer(a, "g", [TOPIC], handler),
                    TypeError,
                    "^subscriptions must be a dict",
                ),
            ]
        )
        consumer = aio.SimpleConsumer(a, "jobs", {TOPIC: "*"}, await_duration=1.0)
        c: Any = consumer  # wrong types on purpose
        try:
            got: list[aio.ReceivedMessage] = []
            deadline = time.monotonic() + 20
            while not got and time.monotonic() < deadline:
                got = await consumer.receive(1)
            [msg] = got
            await _refused(
                [
                    ("receive 0", lambda: c.receive(0), ValueError, "^max_messages must be 1 to"),
                    (
                        "receive too many",
                        lambda: c.receive(10**6),
                        ValueError,
                        "^max_messages must be 1 to 1024",
                    ),
                    ("receive str", lambda: c.receive("1"), TypeError, "^max_messages must be"),
                    (
                        "receive nan",
                        lambda: c.receive(1, math.nan),
                        ValueError,
                        "^invisible_duration must be a finite",
                    ),
                    ("ack str", lambda: c.ack("handle"), TypeError, "^msg must be a message"),
                    (
                        "ack_many one",
                        lambda: c.ack_many(msg),
                        TypeError,
                        "^messages must be a list",
                    ),
                    ("nack inf", lambda: c.nack(msg, delay=math.inf), ValueError, "^delay must"),
                    ("nack reason", lambda: c.nack(msg, reason=5), TypeError, "^reason must"),
                    (
                        "change str",
                        lambda: c.change_invisible_duration(msg, "60"),
                        TypeError,
                        "^duration must be a number of seconds",
                    ),
                    ("release None", lambda: c.release(None), TypeError, "^msg must be"),
                ]
            )
            await consumer.ack(msg)  # the lease is still good
            rest = await consumer.receive(16)
            assert sorted(m.value or b"" for m in [msg, *rest]) == [b"m-0-0", b"m-0-1", b"m-0-2"]
            await consumer.ack_many(rest)
        finally:
            await consumer.close()

    loop.run(main())


def test_broadcast_consumer_refuses_wrong_arguments(loop: Loop, broker: BrokerEnv) -> None:
    a = broker.address
    aio: Any = _aio  # wrong types on purpose

    async def main() -> None:
        await _setup(a, queues=1)
        await _refused(
            [
                (
                    "topics str",
                    lambda: aio.BroadcastConsumer(a, "g", "ts", member="m"),
                    TypeError,
                    "^topics must be a list of topic names, not a str",
                ),
                (
                    "group",
                    lambda: aio.BroadcastConsumer(a, "my group!", [TOPIC], member="m"),
                    ValueError,
                    "^group 'my group!'",
                ),
                (
                    "member",
                    lambda: aio.BroadcastConsumer(a, "g", [TOPIC], member="a b"),
                    ValueError,
                    "^member must be",
                ),
                (
                    "member newline",
                    lambda: aio.BroadcastConsumer(a, "g", [TOPIC], member="m\n"),
                    ValueError,
                    "^member must be",
                ),
            ]
        )
        consumer = aio.BroadcastConsumer(a, "cache", [TOPIC], member="host-7", start="earliest")
        try:
            with pytest.raises(TypeError, match=r"^timeout_ms must be an int"):
                await consumer.poll("1")
            got: list[tidemq.Message] = []
            deadline = time.monotonic() + 20
            while len(got) < 3 and time.monotonic() < deadline:
                got.extend(await consumer.poll(500))
            assert len(got) == 3
            await consumer.commit()  # under the internal group cache%BROADCAST%host-7
        finally:
            await consumer.close()

    loop.run(main())


# ------------------------------------------------------------------ the synchronous twins


def test_sync_consumers_take_typed_arguments_and_check_them(sync_broker: ThreadedBroker) -> None:
    a = sync_broker.address
    untyped: Any = tidemq  # wrong types on purpose
    with tidemq.Admin(a) as admin:
        admin.create_topic(TOPIC, 1)
    with tidemq.Producer(a) as producer:
        producer.send(TOPIC, b"one", queue=0)
    with pytest.raises(TypeError, match="bogus"):
        untyped.StreamConsumer(a, bogus=1)
    with pytest.raises(TypeError, match="bogus"):
        untyped.GroupConsumer(a, "g", [TOPIC], bogus=1)
    with pytest.raises(TypeError, match="bogus"):
        untyped.BroadcastConsumer(a, "g", [TOPIC], member="m", bogus=1)
    with pytest.raises(TypeError, match=r"^topics must be a list of topic names, not a str"):
        untyped.GroupConsumer(a, "g", "ts")
    with pytest.raises(TypeError, match=r"^subscriptions must be a dict"):
        untyped.SimpleConsumer(a, "g", ["kt"])
    with tidemq.StreamConsumer(a, start="earliest") as consumer:
        with pytest.raises(TypeError, match="not a str"):
            cast(Any, consumer).assign(TOPIC)
        consumer.assign([(TOPIC, 0)])
        with pytest.raises(TypeError, match="two arguments"):
            cast(Any, consumer).seek_to_beginning((TOPIC, 0))
        with pytest.raises(ValueError, match="looks like milliseconds"):
            consumer.seek_to_time(time.time() * 1000)
        with pytest.raises(TypeError, match=r"^queue must be an int"):
            cast(Any, consumer).position(TOPIC, "0")
        consumer.seek_to_time(time.time() - 3600, TOPIC, 0)
        assert consumer.position(TOPIC, 0) == 0
        assert [m.value for m in consumer.poll(5000)] == [b"one"]
    with tidemq.SimpleConsumer(a, "jobs", {TOPIC: "*"}, await_duration=1.0) as simple:
        with pytest.raises(ValueError, match=r"^max_messages must be 1 to"):
            simple.receive(0)
        with pytest.raises(TypeError, match=r"^msg must be a message"):
            cast(Any, simple).ack("handle")
        [msg] = simple.receive(1)
        simple.ack(msg)


# ------------------------------------------------------------------ the broker's own checks


def test_the_broker_refuses_commits_outside_a_queue(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _setup(broker.address)
        client = ClusterClient(broker.address)

        async def commit(*offsets: tuple[str, int, int]) -> None:
            request = CommitOffsetsRequest(
                group="raw",
                offsets=[QueueOffset(topic=t, queue=q, offset=o) for t, q, o in offsets],
            )
            await client.call(broker.address, request, CommitOffsetsResponse)

        try:
            with pytest.raises(
                OffsetOutOfRange, match=r"offset 4 for orders/0 is past the queue's end \(3\)"
            ):
                await commit((TOPIC, 0, 4))
            with pytest.raises(OffsetOutOfRange, match="negative"):
                await commit((TOPIC, 1, -1))
            with pytest.raises(QueueNotFound, match=r"queues 0\.\.1, not 2"):
                await commit((TOPIC, 2, 0))
            with pytest.raises(OffsetOutOfRange):  # one bad offset refuses the whole commit
                await commit((TOPIC, 0, 1), (TOPIC, 1, 10**12))
            described = await _describe(broker.address, "raw")
            assert all(o.committed == -1 for o in described.offsets)
            await commit((TOPIC, 0, 3), (TOPIC, 1, 0))  # the end itself is fine
            described = await _describe(broker.address, "raw")
            assert [(o.committed, o.lag) for o in described.offsets] == [(3, 0), (0, 3)]
        finally:
            await client.close()
        async with aio.Admin(broker.address) as admin:  # the client keeps working
            assert [o.lag for o in (await admin.describe_group("raw")).offsets] == [0, 3]

    loop.run(main())


def test_the_broker_enforces_the_name_rule(loop: Loop, broker: BrokerEnv) -> None:
    async def main() -> None:
        await _setup(broker.address, queues=1)
        client = ClusterClient(broker.address)
        a = broker.address
        try:
            for name in ["..", ".", "-rf", "%RETRY%x", "%SYS%TIMER", "a b", "x" * 128]:
                with pytest.raises(InvalidTopicName, match="topic name"):
                    await client.call(a, CreateTopicRequest(name=name, queues=1), TopicInfoMsg)
            for group in ["my group!", "-g", "%RETRY%g", "x" * 121]:
                with pytest.raises(InvalidRequest, match="group name"):
                    await client.call(
                        a, JoinGroupRequest(group=group, topics=[TOPIC]), JoinGroupResponse
                    )
                request = CommitOffsetsRequest(
                    group=group, offsets=[QueueOffset(topic=TOPIC, queue=0, offset=0)]
                )
                with pytest.raises(InvalidRequest, match="group name"):
                    await client.call(a, request, CommitOffsetsResponse)
                pop = PopReceiveRequest(
                    group=group,
                    subscriptions=[PopSubscription(topic=TOPIC, expression="*", kind="tag")],
                    max_messages=1,
                    invisible_ms=30_000,
                )
                with pytest.raises(InvalidRequest, match="group name"):
                    await client.request(a, pop, PopReceiveResponse)
            # Internal group names the clients use are accepted.
            for group in ["%REDRIVE%g", "g%BROADCAST%host-7"]:
                request = CommitOffsetsRequest(
                    group=group, offsets=[QueueOffset(topic=TOPIC, queue=0, offset=1)]
                )
                await client.call(a, request, CommitOffsetsResponse)
        finally:
            await client.close()
        async with aio.Admin(a) as admin:
            assert [t.name for t in await admin.list_topics()] == [TOPIC]

    loop.run(main())
