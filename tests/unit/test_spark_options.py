"""The Spark source's options: Kafka's names, defaults per query kind, and errors that name
the option. No JVM."""

from __future__ import annotations

import re

import pytest

from tidemq.spark.options import (
    Assign,
    ClientOptions,
    OffsetSpec,
    OptionError,
    Subscribe,
    SubscribePattern,
    parse_read_options,
    parse_write_options,
)
from tidemq.spark.trigger_limits import TriggerLimits

BASE = {"bootstrap": "127.0.0.1:9876", "subscribe": "orders"}


def test_defaults_for_batch_and_stream() -> None:
    batch = parse_read_options(BASE, streaming=False)
    assert batch.bootstrap == "127.0.0.1:9876"
    assert batch.subscription == Subscribe(("orders",))
    assert batch.starting == OffsetSpec("earliest")
    assert batch.ending == OffsetSpec("latest")
    assert batch.fail_on_data_loss is True
    assert batch.include_headers is False
    assert batch.max_offsets_per_trigger is None
    assert batch.min_partitions is None
    stream = parse_read_options(BASE, streaming=True)
    assert stream.starting == OffsetSpec("latest")
    assert stream.ending is None


def test_names_are_case_insensitive_and_aliases_work() -> None:
    opts = parse_read_options(
        {
            "KAFKA.BOOTSTRAP.SERVERS": "h:1",
            "SubscribePattern": "ord.*",
            "maxrecordsperbatch": "10",
            "FAILONDATALOSS": "False",
            "includeheaders": "TRUE",
            "minpartitions": "4",
        },
        streaming=True,
    )
    assert opts.bootstrap == "h:1"
    assert opts.subscription == SubscribePattern("ord.*")
    assert opts.subscription.matches("orders")
    assert not opts.subscription.matches("xorders")
    assert opts.max_offsets_per_trigger == 10
    assert opts.fail_on_data_loss is False
    assert opts.include_headers is True
    assert opts.min_partitions == 4
    tidemq_alias = parse_read_options(
        {"tidemq.bootstrap.servers": "h:2", "subscribe": "a"}, streaming=True
    )
    assert tidemq_alias.bootstrap == "h:2"


def test_subscribe_list_and_assign() -> None:
    opts = parse_read_options({**BASE, "subscribe": " b, a ,b"}, streaming=True)
    assert opts.subscription == Subscribe(("a", "b"))
    assigned = parse_read_options(
        {"bootstrap": "h:1", "assign": '{"t": [1, 0, 1], "s": [2]}'}, streaming=False
    )
    assert assigned.subscription == Assign((("s", (2,)), ("t", (0, 1))))


def test_offsets_json() -> None:
    opts = parse_read_options(
        {
            **BASE,
            "startingOffsets": '{"orders": {"1": 23, "0": -2}}',
            "endingOffsets": '{"orders": {"0": -1, "1": 40}}',
        },
        streaming=False,
    )
    assert opts.starting.as_dict() == {("orders", 0): -2, ("orders", 1): 23}
    assert opts.ending is not None
    assert opts.ending.as_dict() == {("orders", 0): -1, ("orders", 1): 40}


def test_starting_timestamp_takes_precedence() -> None:
    opts = parse_read_options(
        {**BASE, "startingOffsets": "earliest", "startingTimestamp": "1700000000000"},
        streaming=True,
    )
    assert opts.starting == OffsetSpec("timestamp", timestamp_ms=1_700_000_000_000)


@pytest.mark.parametrize(
    ("options", "streaming", "named"),
    [
        ({"subscribe": "orders"}, True, "'bootstrap' is required"),
        ({**BASE, "bootstrap": "nohost"}, True, "'bootstrap' must be host:port"),
        ({"bootstrap": "h:1"}, True, "exactly one of the options 'subscribe'"),
        ({**BASE, "assign": '{"t": [0]}'}, True, "got 'subscribe', 'assign'"),
        ({**BASE, "subscribe": " , "}, True, "'subscribe' names no topic"),
        ({**BASE, "subscribe": "bad topic"}, True, "'subscribe': 'bad topic'"),
        ({"bootstrap": "h:1", "subscribePattern": "("}, True, "'subscribePattern' is not"),
        ({"bootstrap": "h:1", "assign": "[0]"}, True, "'assign' must be a JSON object"),
        ({"bootstrap": "h:1", "assign": '{"t": [-1]}'}, True, "'assign': topic 't'"),
        ({"bootstrap": "h:1", "assign": "{nope"}, True, "'assign' is not valid JSON"),
        ({**BASE, "startingOffsets": "soonest"}, True, "'startingOffsets' is not valid JSON"),
        ({**BASE, "startingOffsets": "[1]"}, True, "'startingOffsets' must be 'earliest'"),
        ({**BASE, "startingOffsets": '{"orders": {"x": 1}}'}, True, "queue id 'x'"),
        ({**BASE, "startingOffsets": '{"orders": {"0": -3}}'}, True, "offset -3 of orders/0"),
        ({**BASE, "startingOffsets": '{"other": {"0": 1}}'}, True, "topic 'other', which is"),
        ({**BASE, "startingOffsets": "latest"}, False, "cannot be latest (-1) for a batch"),
        ({**BASE, "endingOffsets": "earliest"}, False, "'endingOffsets' cannot be 'earliest'"),
        ({**BASE, "endingOffsets": '{"orders": {"0": -2}}'}, False, "cannot end at -2"),
        ({**BASE, "endingOffsets": "latest"}, True, "'endingOffsets' is for batch queries"),
        ({**BASE, "startingTimestamp": "yesterday"}, True, "'startingTimestamp' must be an"),
        ({**BASE, "maxOffsetsPerTrigger": "0"}, True, "'maxOffsetsPerTrigger' must be >= 1"),
        (
            {**BASE, "maxOffsetsPerTrigger": "5", "maxRecordsPerBatch": "6"},
            True,
            "aliases and disagree",
        ),
        ({**BASE, "failOnDataLoss": "maybe"}, True, "'failOnDataLoss' must be true or false"),
        ({**BASE, "includeHeaders": "1"}, True, "'includeHeaders' must be true or false"),
        ({**BASE, "minPartitions": "many"}, False, "'minPartitions' must be an integer"),
        ({**BASE, "minOffsetsPerTrigger": "5"}, False, "'minOffsetsPerTrigger' is for streaming"),
        ({**BASE, "minOffsetsPerTrigger": "0"}, True, "'minOffsetsPerTrigger' must be >= 1"),
        ({**BASE, "minOffsetsPerTrigger": "lots"}, True, "'minOffsetsPerTrigger' must be an"),
        (
            {**BASE, "minOffsetsPerTrigger": "5", "maxTriggerDelay": "1m"},
            False,
            "'minOffsetsPerTrigger' is for streaming queries only",
        ),
        ({**BASE, "maxTriggerDelay": "1m"}, True, "'maxTriggerDelay' needs 'minOffsetsPerTrigger'"),
        (
            {**BASE, "minOffsetsPerTrigger": "5", "maxTriggerDelay": "15 minutes"},
            True,
            "'maxTriggerDelay' must be a duration like '15m'",
        ),
        (
            {**BASE, "minOffsetsPerTrigger": "5", "maxTriggerDelay": "-1s"},
            True,
            "'maxTriggerDelay' must not be negative",
        ),
        (
            {**BASE, "minOffsetsPerTrigger": "500", "maxOffsetsPerTrigger": "100"},
            True,
            "'minOffsetsPerTrigger' (500) must be at most 'maxOffsetsPerTrigger' (100)",
        ),
        ({**BASE, "endingTimestamp": "5"}, True, "'endingTimestamp' is for batch queries only"),
        ({**BASE, "endingTimestamp": "soon"}, False, "'endingTimestamp' must be an integer"),
        (
            {**BASE, "startingOffsetsByTimestamp": '{"orders": {"0": -1}}'},
            True,
            "timestamp -1 of orders/0 must be milliseconds",
        ),
        (
            {**BASE, "endingOffsetsByTimestamp": '{"other": {"0": 5}}'},
            False,
            "topic 'other', which is not subscribed",
        ),
        (
            {"bootstrap": "h:1", "kafka.bootstrap.servers": "h:2", "subscribe": "t"},
            True,
            "disagree",
        ),
        (
            {"bootstrap": "h:1", "assign": '{"t": [0]}', "startingOffsets": '{"t": {"1": 0}}'},
            True,
            "queues [1] of 't', which are not assigned",
        ),
    ],
)
def test_bad_options_are_named(options: dict[str, str], streaming: bool, named: str) -> None:
    with pytest.raises(OptionError) as info:
        parse_read_options(options, streaming=streaming)
    assert named in str(info.value)


def test_write_options() -> None:
    opts = parse_write_options({"BOOTSTRAP": "h:1", "Topic": "out"})
    assert (opts.bootstrap, opts.topic) == ("h:1", "out")
    assert parse_write_options({"bootstrap": "h:1"}).topic is None
    with pytest.raises(OptionError, match="'topic': 'a b'"):
        parse_write_options({"bootstrap": "h:1", "topic": "a b"})


def test_create_topic_options() -> None:
    opts = parse_write_options({"bootstrap": "h:1", "topic": "out"})
    assert (opts.create_topic, opts.create_queues) == (False, 8)
    opts = parse_write_options({"bootstrap": "h:1", "createtopic": "TRUE"})
    assert (opts.create_topic, opts.create_queues) == (True, 8)
    opts = parse_write_options(
        {"bootstrap": "h:1", "createTopic": "true", "createTopic.queues": "3"}
    )
    assert (opts.create_topic, opts.create_queues) == (True, 3)
    with pytest.raises(OptionError, match="'createTopic' must be true or false"):
        parse_write_options({"bootstrap": "h:1", "createTopic": "yes"})
    with pytest.raises(OptionError, match=r"'createTopic\.queues' needs the option createTopic"):
        parse_write_options({"bootstrap": "h:1", "createTopic.queues": "3"})
    with pytest.raises(OptionError, match=r"'createTopic\.queues' must be >= 1"):
        parse_write_options({"bootstrap": "h:1", "createTopic": "true", "createTopic.queues": "0"})
    with pytest.raises(OptionError, match=r"'createTopic\.queues' must be <= 4096"):
        parse_write_options(
            {"bootstrap": "h:1", "createTopic": "true", "createTopic.queues": "5000"}
        )


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({**BASE, "maxOffsetPerTrigger": "5"}, "did you mean 'maxOffsetsPerTrigger'"),
        ({**BASE, "startingoffset": "earliest"}, "did you mean 'startingOffsets'"),
        ({**BASE, "colour": "blue"}, "unknown option 'colour' for the tidemq source; known:"),
        ({**BASE, "kafka.security.protocol": "SSL"}, "'kafka.security.protocol' is a Kafka"),
        ({**BASE, "kafka.group.id": "g"}, "not supported by the tidemq source yet"),
        ({**BASE, "kafka.max.poll.records": "5"}, "instead: 'maxOffsetsPerTrigger'"),
        ({**BASE, "kafka.linger.ms": "5"}, "see the options of the tidemq connector"),
    ],
    ids=["typo-trigger", "typo-starting", "unknown", "kafka-tls", "kafka-group", "kafka-poll",
         "kafka-other"],
)  # fmt: skip
def test_unknown_options_are_errors(options: dict[str, str], named: str) -> None:
    """An option the source does not read fails the query, naming it (issue 21: a
    misspelt `maxOffsetPerTrigger` used to be ignored, and the query read everything)."""
    for streaming in (True, False):
        with pytest.raises(OptionError) as info:
            parse_read_options(options, streaming=streaming)
        assert named in str(info.value)


def test_unknown_write_options_are_errors() -> None:
    with pytest.raises(OptionError, match="did you mean 'createTopic'"):
        parse_write_options({"bootstrap": "h:1", "createTopics": "true"})
    with pytest.raises(OptionError, match="unknown option 'sinkid' for the tidemq writer"):
        parse_write_options({"bootstrap": "h:1", "sinkId": "s"})  # the streaming sink's
    with pytest.raises(OptionError, match="Kafka client option"):
        parse_write_options({"bootstrap": "h:1", "kafka.acks": "all"})


def test_connection_options() -> None:
    """TLS and login options (`tidemq.` prefix) for reads and writes, checked together."""
    plain = parse_read_options(BASE, streaming=True).client
    assert plain == ClientOptions()
    assert plain.client_config().ssl_context is None
    login = {"tidemq.username": "etl", "tidemq.password": "pw"}
    read = parse_read_options({**BASE, **login}, streaming=False).client
    assert (read.username, read.password, read.tls) == ("etl", "pw", False)
    assert "pw" not in repr(read)  # never in logs
    write = parse_write_options({"bootstrap": "h:1", **login, "tidemq.tls": "true"}).client
    assert write.tls
    assert write.client_config().ssl_context is not None
    with pytest.raises(
        OptionError, match=re.escape("'tidemq.username' and 'tidemq.password' go together")
    ):
        parse_read_options({**BASE, "tidemq.username": "etl"}, streaming=True)
    with pytest.raises(
        OptionError, match=re.escape("'tidemq.tls.certFile' and 'tidemq.tls.keyFile'")
    ):
        parse_write_options({"bootstrap": "h:1", "tidemq.tls.certFile": "c.pem"})
    with pytest.raises(OptionError, match=re.escape("'tidemq.tls' is false but")):
        parse_write_options({"bootstrap": "h:1", "tidemq.tls": "false", "tidemq.tls.caFile": "x"})
    with pytest.raises(OptionError, match=re.escape("instead: 'tidemq.tls'")):
        parse_read_options({**BASE, "kafka.security.protocol": "SASL_SSL"}, streaming=True)


def test_offsets_by_timestamp() -> None:
    """Kafka's precedence: ...Timestamp, then ...OffsetsByTimestamp, then ...Offsets."""
    by_queue = '{"orders": {"1": 1700000000000}}'
    read = parse_read_options(
        {**BASE, "startingOffsetsByTimestamp": by_queue, "startingOffsets": "earliest"},
        streaming=True,
    )
    assert read.starting == OffsetSpec("timestamps", (("orders", ((1, 1_700_000_000_000),)),))
    read = parse_read_options(
        {**BASE, "startingTimestamp": "5", "startingOffsetsByTimestamp": by_queue},
        streaming=True,
    )
    assert read.starting == OffsetSpec("timestamp", timestamp_ms=5)
    batch = parse_read_options(
        {**BASE, "endingTimestamp": "9", "endingOffsets": "latest"}, streaming=False
    )
    assert batch.ending == OffsetSpec("timestamp", timestamp_ms=9)
    batch = parse_read_options({**BASE, "endingOffsetsByTimestamp": by_queue}, streaming=False)
    assert batch.ending is not None
    assert batch.ending.kind == "timestamps"


def test_min_offsets_per_trigger_with_its_delay() -> None:
    """Kafka's `minOffsetsPerTrigger` with `maxTriggerDelay` (default 15m), durations
    written as Spark writes them, under `maxOffsetsPerTrigger`."""
    plain = parse_read_options(BASE, streaming=True)
    assert plain.trigger_limits() == TriggerLimits()
    opts = parse_read_options(
        {**BASE, "MINOFFSETSPERTRIGGER": "100", "maxOffsetsPerTrigger": "100"}, streaming=True
    )
    assert opts.trigger_limits() == TriggerLimits(100, 100, 15 * 60_000)
    for text, ms in [("2s", 2_000), ("500ms", 500), ("15m", 900_000), ("1min", 60_000),
                     (" 3H ", 10_800_000), ("1d", 86_400_000), ("2500us", 2), ("750", 750),
                     ("0s", 0)]:  # fmt: skip
        given = {**BASE, "minOffsetsPerTrigger": "7", "maxTriggerDelay": text}
        assert parse_read_options(given, streaming=True).max_trigger_delay_ms == ms, text
