"""The client's argument checks (`tidemq.client.checks`) and the name rule
(`tidemq.core.names`): good values come back in the client's form, bad ones raise
TypeError or ValueError whose message names the argument."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta, timezone

import numpy as np
import pytest

from tidemq.client import checks
from tidemq.core import limits, names
from tidemq.core.batch import MessageRecord, check_tags, encode_batch
from tidemq.core.errors import InvalidBatch, InvalidTopicName
from tidemq.core.filters import Sql92, parse_tag_expression

NOW_MS = 1_700_000_000_000


# ------------------------------------------------------------------ values and keys


@pytest.mark.parametrize("check", [checks.check_value, checks.check_key])
def test_binary_arguments_accept_bytes_and_none(check: object) -> None:
    assert callable(check)
    assert check(b"v") == b"v"
    assert check(bytearray(b"v")) == b"v"
    assert check(memoryview(b"v")) == b"v"
    assert check(None) is None
    assert type(check(bytearray(b"v"))) is bytes


@pytest.mark.parametrize("bad", ["text", 5, 1.5, [b"v"], object()])
def test_binary_arguments_refuse_other_types(bad: object) -> None:
    with pytest.raises(TypeError, match=r"^value must be bytes or None"):
        checks.check_value(bad)
    with pytest.raises(TypeError, match=r"^my_key must be bytes"):
        checks.check_key(bad, "my_key")


def test_a_str_value_gets_an_encoding_hint() -> None:
    with pytest.raises(TypeError, match=r"value\.encode\(\)"):
        checks.check_value("text")


# ------------------------------------------------------------------ tags and keys


@pytest.mark.parametrize("tag", ["paid", "TagA", "a.b-c_d", "*", "ünï", "x" * limits.MAX_TAG_BYTES])
def test_good_tags(tag: str) -> None:
    assert checks.check_tag(tag) == tag
    assert checks.check_tag(None) is None


@pytest.mark.parametrize("bad", [b"paid", 5, ["paid"], True])
def test_tags_must_be_str(bad: object) -> None:
    with pytest.raises(TypeError, match=r"^tag must be a str or None"):
        checks.check_tag(bad)


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ("a||b", r"'\|'"),
        ("a|b", r"'\|'"),
        ("has space", "whitespace"),
        ("tab\there", "whitespace"),
        (" lead", "whitespace"),
        ("nul\0", "control character"),
        ("x" * (limits.MAX_TAG_BYTES + 1), "longer than"),
    ],
)
def test_tags_a_subscription_cannot_match_are_refused(bad: str, why: str) -> None:
    with pytest.raises(ValueError, match=rf"^tag .*{why}"):
        checks.check_tag(bad)


def test_every_accepted_tag_can_be_subscribed_to() -> None:
    for tag in ["paid", "*x", "a.b", "ünï", "x" * limits.MAX_TAG_BYTES]:
        assert names.tag_problem(tag) is None
        assert parse_tag_expression(f"{tag} || other").matches(tag)


def test_the_encoder_refuses_unmatchable_tags_too() -> None:
    for bad in ["a||b", "a b", "nul\0"]:
        with pytest.raises(InvalidBatch, match="tag"):
            encode_batch([MessageRecord(b"v", tag=bad)])
    assert encode_batch([MessageRecord(b"v", tag="")])  # the empty tag stays valid


def test_the_broker_checks_the_tags_of_a_batch_it_did_not_encode() -> None:
    good = encode_batch([MessageRecord(b"v", tag="aXYZ"), MessageRecord(b"w")])
    check_tags(good)
    check_tags(encode_batch([MessageRecord(b"v")]))  # no tags: not even decoded
    check_tags(encode_batch([MessageRecord(b"v", tag="\u00e9t\u00e9"), MessageRecord(b"w")]))
    bad_tags = [b"a YZ", b"a||Z", b"aX\x00Z", b"aXY\n", "a\u3000".encode(), b"a\xff\xfeZ"]
    for bad in bad_tags:
        assert len(bad) == 4
        with pytest.raises(InvalidBatch, match=r"^tag "):  # CRC aside: checked on arrival
            check_tags(good.replace(b"aXYZ", bad))


def test_keys() -> None:
    assert checks.check_keys(None) == ()
    assert checks.check_keys(["a", "b"]) == ("a", "b")
    assert checks.check_keys(("a",)) == ("a",)
    with pytest.raises(TypeError, match=r"^keys must be a list of str, not a str"):
        checks.check_keys("order-1")
    with pytest.raises(TypeError, match=r"^keys must be a list of str, not a bytes"):
        checks.check_keys(b"order-1")
    with pytest.raises(TypeError, match=r"^keys\[1\] must be a str, got int"):
        checks.check_keys(["a", 1])
    with pytest.raises(TypeError, match=r"^keys must be a list"):
        checks.check_keys(5)
    with pytest.raises(ValueError, match=r"^keys\[0\] 'a b' must be non-empty, without whitespace"):
        checks.check_keys(["a b"])
    with pytest.raises(ValueError, match=r"^keys\[0\]"):
        checks.check_keys([""])
    with pytest.raises(ValueError, match="more than"):
        checks.check_keys([str(i) for i in range(limits.MAX_KEYS_PER_MESSAGE + 1)])


# ------------------------------------------------------------------ headers


def test_headers() -> None:
    assert checks.check_headers(None) == ()
    assert checks.check_headers({}) == ()
    assert checks.check_headers({"h": b"v", "b": bytearray(b"w")}) == (("h", b"v"), ("b", b"w"))
    with pytest.raises(
        TypeError, match=r"^headers\['h'\] must be bytes, got str 'str'; encode it first"
    ):
        checks.check_headers({"h": "str"})
    with pytest.raises(TypeError, match=r"^headers\['h'\] must be bytes, got NoneType None$"):
        checks.check_headers({"h": None})
    with pytest.raises(TypeError, match=r"^headers names must be str, got bytes"):
        checks.check_headers({b"h": b"v"})
    with pytest.raises(TypeError, match=r"^headers must be a dict of str to bytes, got list"):
        checks.check_headers([("h", b"v")])
    with pytest.raises(ValueError, match=r"^headers name '' must be non-empty"):
        checks.check_headers({"": b"v"})
    with pytest.raises(ValueError, match=r"^headers\['h'\] is .* bytes, more than"):
        checks.check_headers({"h": bytes(limits.MAX_HEADER_VALUE_BYTES + 1)})
    with pytest.raises(ValueError, match="longer than"):
        checks.check_headers({"k" * (limits.MAX_HEADER_KEY_BYTES + 1): b""})
    too_many = {str(i): b"" for i in range(limits.MAX_HEADERS_PER_MESSAGE + 1)}
    with pytest.raises(ValueError, match="more than"):
        checks.check_headers(too_many)


# ------------------------------------------------------------------ times


def test_timestamps_are_seconds_or_aware_datetimes() -> None:
    assert checks.timestamp_ms(None, now_ms=NOW_MS) == NOW_MS
    assert checks.timestamp_ms(1_700_000_000.25) == 1_700_000_000_250
    assert checks.timestamp_ms(1_700_000_000) == NOW_MS
    assert checks.timestamp_ms(0) == 0
    assert checks.timestamp_ms(np.float64(1_700_000_000.0)) == NOW_MS
    assert checks.timestamp_ms(np.int64(1_700_000_000)) == NOW_MS
    assert checks.timestamp_ms(datetime(2023, 11, 14, 22, 13, 20, tzinfo=UTC)) == NOW_MS
    later = datetime(2023, 11, 15, 0, 13, 20, tzinfo=timezone(timedelta(hours=2)))
    assert checks.timestamp_ms(later) == NOW_MS
    assert checks.timestamp_ms(253_402_300_799) == 253_402_300_799_000  # 9999-12-31


def test_a_timestamp_in_milliseconds_is_refused_as_such() -> None:
    with pytest.raises(
        ValueError,
        match=r"^timestamp 1700000000000.0 looks like milliseconds; pass seconds "
        r"\(timestamp=1700000000.0\)",
    ):
        checks.timestamp_ms(1.7e12)
    with pytest.raises(ValueError, match=r"^when 1700000000000 looks like milliseconds"):
        checks.timestamp_ms(NOW_MS, "when")


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (-1, "before 1970"),
        (1e20, "after the year 9999"),
        (10**400, "out of range"),
        (math.nan, "finite"),
        (math.inf, "finite"),
        (-math.inf, "finite"),
        (datetime(2024, 1, 1), "naive datetime"),
    ],
)
def test_bad_timestamps(bad: object, why: str) -> None:
    with pytest.raises(ValueError, match=rf"^timestamp .*{why}"):
        checks.timestamp_ms(bad)


@pytest.mark.parametrize("bad", ["2024-01-01", True, b"1", [1.0]])
def test_timestamps_of_the_wrong_type(bad: object) -> None:
    with pytest.raises(TypeError, match=r"^timestamp must be seconds since the epoch"):
        checks.timestamp_ms(bad)


def test_seconds() -> None:
    assert checks.check_seconds(1, "delay") == 1.0
    assert checks.check_seconds(0.5, "delay") == 0.5
    assert checks.check_seconds(timedelta(minutes=1), "delay") == 60.0
    assert checks.check_seconds(10.0, "delay", minimum=1.0, maximum=10.0) == 10.0
    for bad in (math.inf, math.nan):
        with pytest.raises(ValueError, match=r"^delay must be a finite number of seconds"):
            checks.check_seconds(bad, "delay")
    with pytest.raises(ValueError, match=r"^delay must be 0 or more seconds, got -1"):
        checks.check_seconds(-1, "delay")
    with pytest.raises(ValueError, match=r"^delay must be 1 to 10 seconds, got 11"):
        checks.check_seconds(11, "delay", minimum=1.0, maximum=10.0)
    for wrong in ("5", True, None, [1]):
        with pytest.raises(TypeError, match=r"^delay must be a number of seconds or a timedelta"):
            checks.check_seconds(wrong, "delay")


# ------------------------------------------------------------------ queues and offsets


def test_queues_and_offsets() -> None:
    assert checks.check_queue(None) is None
    assert checks.check_queue(0) == 0
    assert checks.check_queue(np.int64(3)) == 3
    assert checks.check_queue(limits.MAX_QUEUE_ID) == limits.MAX_QUEUE_ID
    assert checks.check_offset(0) == 0
    assert checks.check_offset(limits.MAX_OFFSET) == limits.MAX_OFFSET
    for bad in (True, 1.0, "1", b"1", [0]):
        with pytest.raises(TypeError, match=r"^queue must be an int"):
            checks.check_queue(bad)
        with pytest.raises(TypeError, match=r"^offset must be an int"):
            checks.check_offset(bad)
    for out in (-1, limits.MAX_QUEUE_ID + 1, 2**64):
        with pytest.raises(ValueError, match=rf"^queue must be 0 to {limits.MAX_QUEUE_ID}, got"):
            checks.check_queue(out)
    for out in (-1, 2**64):
        with pytest.raises(ValueError, match=r"^offset must be 0 to"):
            checks.check_offset(out)
    with pytest.raises(TypeError, match=r"^offset must be an int"):
        checks.check_offset(None)


def test_timeouts() -> None:
    assert checks.check_timeout_ms(0) == 0
    assert checks.check_timeout_ms(1000) == 1000
    with pytest.raises(TypeError, match=r"^timeout_ms must be an int, got float"):
        checks.check_timeout_ms(1.5)
    with pytest.raises(ValueError, match=r"^timeout_ms must be 0 to"):
        checks.check_timeout_ms(-1)


def test_topic_queue_pairs() -> None:
    assert checks.check_topic_queues([("t", 0), ["t", 1]]) == [("t", 0), ("t", 1)]
    assert checks.check_topic_queues(iter([("t", 0)])) == [("t", 0)]
    assert checks.check_topic_queues({("t", 0): (0, 5)}) == [("t", 0)]  # its keys
    with pytest.raises(TypeError, match=r"^queues must be a list of \(topic, queue\) pairs: write"):
        checks.check_topic_queues(("t", 0))
    with pytest.raises(TypeError, match=r"^queues must be a list of \(topic, queue\) pairs, not"):
        checks.check_topic_queues("t")
    with pytest.raises(TypeError, match=r"^queues\[0\] must hold \(topic, queue\) pairs"):
        checks.check_topic_queues(["t"])
    with pytest.raises(TypeError, match=r"^queues\[0\]: queue of \('t', '0'\) must be an int"):
        checks.check_topic_queues([("t", "0")])
    with pytest.raises(InvalidTopicName, match=r"^queues\[0\]: topic of \('a b', 0\)"):
        checks.check_topic_queues([("a b", 0)])


# ------------------------------------------------------------------ names


GOOD_NAMES = ["orders", "x" * 127, "A-z_0.9", "_", "a..b", "9", "a-"]
BAD_NAMES = [
    ("", "is empty"),
    (".", "starts with '.'"),
    ("..", "starts with '.'"),
    (".hidden", "starts with '.'"),
    ("-rf", "starts with '-'"),
    ("%RETRY%x", "contains '%'"),
    ("per%cent", "contains '%'"),
    ("my group!", "contains ' '"),
    ("a/b", "contains '/'"),
    ("a:b", "contains ':'"),
    ("ünï", "contains 'ü'"),
    ("a\n", "contains '\\\\n'"),
    ("x" * 128, "longer than 127"),
]


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_good_topic_names(name: str) -> None:
    assert checks.check_topic_name(name) == name
    assert names.is_topic_name(name)
    assert re.match(limits.TOPIC_NAME_PATTERN, name)


@pytest.mark.parametrize(("name", "why"), BAD_NAMES)
def test_bad_topic_names(name: str, why: str) -> None:
    with pytest.raises(InvalidTopicName, match=rf"^topic .* {why}[^;]*; use 1-127") as info:
        checks.check_topic_name(name)
    assert isinstance(info.value, ValueError)
    assert not names.is_user_name(name)


@pytest.mark.parametrize(("name", "why"), BAD_NAMES)
def test_bad_group_names(name: str, why: str) -> None:
    why = why.replace("127", "120")
    with pytest.raises(ValueError, match=rf"^group .* {why}[^;]*; use"):
        checks.check_group_name(name)
    assert not names.is_group_name(name)


def test_group_names_leave_room_for_their_retry_topic() -> None:
    group = "g" * limits.MAX_GROUP_NAME_BYTES
    assert checks.check_group_name(group) == group
    assert names.is_topic_name(f"%RETRY%{group}")
    assert re.match(limits.TOPIC_NAME_PATTERN, f"%RETRY%{group}")
    with pytest.raises(ValueError, match="longer than 120"):
        checks.check_group_name(group + "g")


@pytest.mark.parametrize("bad", [5, None, b"orders", ["orders"]])
def test_names_must_be_str(bad: object) -> None:
    with pytest.raises(TypeError, match=r"^topic must be a str"):
        checks.check_topic_name(bad)
    with pytest.raises(TypeError, match=r"^group must be a str"):
        checks.check_group_name(bad)


def test_internal_names() -> None:
    for topic in ["%RETRY%g", "%DLQ%g-1", "%SYS%TIMER", "%SYS%TXN_HALF"]:
        assert names.is_internal_topic(topic)
        assert names.is_topic_name(topic)
        assert re.match(limits.TOPIC_NAME_PATTERN, topic)
        assert checks.check_readable_topic(topic) == topic
        with pytest.raises(InvalidTopicName, match="contains '%'"):
            checks.check_topic_name(topic)
    assert names.is_internal_topic("%RETRY%-g")  # of a group named before the rule
    for topic in ["%RETRY%", "%RETRY%a/b", "%OTHER%g", "%SYS%lower", "x%RETRY%g", "%DLQ%a b"]:
        assert not names.is_topic_name(topic)
        assert not re.match(limits.TOPIC_NAME_PATTERN, topic)
    for group in ["%REDRIVE%g", "g%BROADCAST%host-7", "g%BROADCAST%a:b"]:
        assert names.is_group_name(group)
        assert not names.is_topic_name(group)
    for group in ["%REDRIVE%", "%BROADCAST%m", "g%BROADCAST%", "%RETRY%g"]:
        assert not names.is_group_name(group)


def test_topic_lists_refuse_a_lone_string() -> None:
    assert checks.check_names(["b", "a", "b"], "topics") == ["b", "a"]
    assert checks.check_names(("a",), "topics") == ["a"]
    assert checks.check_names(["%DLQ%g"], "topics") == ["%DLQ%g"]
    with pytest.raises(TypeError, match=r"^topics must be a list of topic names, not a str"):
        checks.check_names("ts", "topics")
    with pytest.raises(TypeError, match=r"^topics must be a list of topic names"):
        checks.check_names(5, "topics")
    with pytest.raises(TypeError, match=r"^topics must be a list of topic names"):
        checks.check_names({"a": 1}, "topics")
    with pytest.raises(ValueError, match=r"^topics must name at least one topic"):
        checks.check_names([], "topics")
    with pytest.raises(InvalidTopicName, match=r"^topics\[1\] '\.\.' starts with"):
        checks.check_names(["a", ".."], "topics")
    with pytest.raises(TypeError, match=r"^topics\[0\] must be a str"):
        checks.check_names([1], "topics")


def test_filters() -> None:
    assert checks.check_filter("a || b") == ("tag", "a || b")
    assert checks.check_filter(Sql92("a = 1")) == ("sql92", "a = 1")
    for bad in (5, b"a", ["a"]):
        with pytest.raises(TypeError, match=r"^filter must be a tag expression \(str\) or Sql92"):
            checks.check_filter(bad)
