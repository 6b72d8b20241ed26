"""Tag expressions: parsing, exact matching, errors with their columns, limits, and the
summary mask agreeing with the batch codec's tag summary (a batch the mask skips never
holds a matching message)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tidemq.core import limits
from tidemq.core.batch import MessageRecord, encode_batch, parse_envelope, tag_bit
from tidemq.core.errors import InvalidRequest
from tidemq.core.filters import (
    MAX_TAG_EXPRESSION_LENGTH,
    MAX_TAG_EXPRESSION_TAGS,
    FilterSyntaxError,
    TagExpression,
    parse_tag_expression,
)


@pytest.mark.parametrize("text", ["*", "", " ", " * ", "\t*\n"])
def test_every_message(text: str) -> None:
    expr = parse_tag_expression(text)
    assert expr.tags is None
    assert expr.text == text
    assert expr.matches("anything")
    assert expr.matches("")
    assert expr.matches(None)
    assert expr.summary_mask() == 0  # the store's "do not skip"


@pytest.mark.parametrize(
    "text", ["TagA || TagB", "TagA||TagB", "  TagA ||\tTagB  ", "TagB || TagA || TagA"]
)
def test_alternatives(text: str) -> None:
    expr = parse_tag_expression(text)
    assert isinstance(expr, TagExpression)
    assert expr.tags == frozenset({"TagA", "TagB"})
    assert expr.matches("TagA")
    assert expr.matches("TagB")
    assert not expr.matches("TagC")
    assert not expr.matches("taga")  # case-sensitive
    assert not expr.matches("TagA ")
    assert not expr.matches(None)  # an untagged message matches only "*"
    assert expr.summary_mask() == tag_bit("TagA") | tag_bit("TagB")


@pytest.mark.parametrize(
    "tag", ["a", "Order.Paid", "x-1_2", "caf\u00e9", "\u6d88\u606f", "a*b", "#!"]
)
def test_single_tags(tag: str) -> None:
    expr = parse_tag_expression(tag)
    assert expr.tags == frozenset({tag})
    assert expr.matches(tag)
    assert expr.summary_mask() == tag_bit(tag)


def test_equal_expressions() -> None:
    assert parse_tag_expression("A || B") == parse_tag_expression("A || B")
    assert parse_tag_expression("A") != parse_tag_expression("B")


BAD = [
    # (text, column, part of the message)
    ("A || ", 6, "expected a tag after '||'"),
    ("A ||", 5, "expected a tag after '||'"),
    ("A || || B", 6, "expected a tag after '||'"),
    ("|| A", 1, "expected a tag before '||'"),
    ("  || A", 3, "expected a tag before '||'"),
    ("||", 1, "expected a tag before '||'"),
    ("A | B", 3, "'|' is not allowed in a tag"),
    ("A ||| B", 5, "'|' is not allowed in a tag"),
    ("Tag A", 4, "character ' ' is not allowed in a tag"),
    ("A || B\u00a0C", 7, "character '\\xa0' is not allowed"),
    ("A || B\x00", 7, "character '\\x00' is not allowed"),
    ("A\u200b", 2, "character '\\u200b' is not allowed"),
    ("A\ud800", 2, "character '\\ud800' is not allowed"),
    ("A || *", 6, "'*' (every tag) cannot be combined with other tags"),
    ("* || A", 1, "'*' (every tag) cannot be combined"),
    ("A || " + "x" * 256, 6, "is 256 bytes, over the limit of 255"),
    ("\u00e9" * 128, 1, "is 256 bytes, over the limit of 255"),
]


@pytest.mark.parametrize(("text", "column", "message"), BAD)
def test_errors_name_the_problem_and_its_column(text: str, column: int, message: str) -> None:
    with pytest.raises(FilterSyntaxError) as info:
        parse_tag_expression(text)
    assert isinstance(info.value, InvalidRequest)
    assert str(info.value).startswith("tag filter: ")
    assert message in str(info.value)
    assert info.value.column == column, str(info.value)
    assert f"at column {column}" in str(info.value)


def test_a_tag_of_the_maximum_size() -> None:
    tag = "x" * limits.MAX_TAG_BYTES
    assert parse_tag_expression(tag).matches(tag)


def test_length_limit() -> None:
    ok = "||".join(["t" * 30] * 100)[:MAX_TAG_EXPRESSION_LENGTH].rstrip("|")
    parse_tag_expression(ok)
    with pytest.raises(FilterSyntaxError, match=f"longer than {MAX_TAG_EXPRESSION_LENGTH}"):
        parse_tag_expression("a" + " " * MAX_TAG_EXPRESSION_LENGTH)


def test_alternatives_limit() -> None:
    tags = [f"t{i}" for i in range(MAX_TAG_EXPRESSION_TAGS)]
    assert parse_tag_expression("||".join(tags)).tags == frozenset(tags)
    over = "||".join([*tags, "x"])
    with pytest.raises(
        FilterSyntaxError, match=f"more than {MAX_TAG_EXPRESSION_TAGS} tags"
    ) as info:
        parse_tag_expression(over)
    assert over[info.value.column - 1 :] == "||x"


# ------------------------------------------------------------------ the mask and batches

tag_pool = st.sampled_from(["a", "b", "TagA", "TagB", "Order.Paid", "caf\u00e9", "x" * 40])


@settings(max_examples=150, deadline=None)
@given(
    wanted=st.lists(tag_pool, min_size=1, max_size=4),
    batch_tags=st.lists(st.none() | tag_pool, min_size=1, max_size=8),
)
def test_a_batch_the_mask_skips_holds_no_matching_message(
    wanted: list[str], batch_tags: list[str | None]
) -> None:
    expr = parse_tag_expression(" || ".join(wanted))
    payload = encode_batch([MessageRecord(b"v", tag=t) for t in batch_tags])
    summary = parse_envelope(payload).tag_summary
    if any(expr.matches(t) for t in batch_tags):
        assert summary & expr.summary_mask()
    if not summary & expr.summary_mask():
        assert not any(expr.matches(t) for t in batch_tags)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=60))
def test_any_text_parses_or_raises_filter_syntax_error(text: str) -> None:
    error: FilterSyntaxError | None = None
    try:
        expr = parse_tag_expression(text)
    except FilterSyntaxError as e:
        error = e
    if error is not None:
        assert 1 <= error.column <= len(text) + 1
        return
    assert expr.tags is None or all(expr.matches(t) for t in expr.tags)
    assert isinstance(expr.summary_mask(), int)
