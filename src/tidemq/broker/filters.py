"""Subscription filters on the broker: compiled once per expression text, evaluated per
message of a record (the index's tag summary has already skipped whole batches)."""

from __future__ import annotations

from functools import lru_cache
from typing import Final

from tidemq.core.batch import MessageRecord, decode_messages
from tidemq.core.errors import InvalidRequest
from tidemq.core.filters import Sql92Filter, TagExpression, compile_sql92, parse_tag_expression
from tidemq.core.record import parse_header

__all__ = [
    "Filter",
    "compile_filter",
    "filter_mask",
    "matches",
    "matches_messages",
    "summary_mask",
]

Filter = TagExpression | Sql92Filter

#: Compiled subscriptions kept (by kind and text).
_FILTER_CACHE: Final = 1024


@lru_cache(maxsize=_FILTER_CACHE)
def compile_filter(kind: str, expression: str) -> Filter:
    """A tag expression ("tag") or a SQL92 filter ("sql92"); FilterSyntaxError (an
    InvalidRequest) names the column of a mistake."""
    if kind == "tag":
        return parse_tag_expression(expression)
    if kind == "sql92":
        return compile_sql92(expression)
    raise InvalidRequest(f"filter kind must be 'tag' or 'sql92', got {kind[:20]!r}")


def summary_mask(flt: Filter) -> int:
    """The tag-summary bits a batch must share to possibly match (0: no skipping)."""
    return flt.summary_mask() if isinstance(flt, TagExpression) else 0


def matches(record: bytes, flt: Filter) -> list[bool] | None:
    """Per message of the record, whether it passes the filter (None: all do)."""
    if isinstance(flt, TagExpression) and flt.tags is None:
        return None
    header = parse_header(record)
    return matches_messages(decode_messages(memoryview(record)[header.payload_start :]), flt)


def matches_messages(messages: list[MessageRecord], flt: Filter) -> list[bool] | None:
    """`matches` for messages decoded already."""
    if isinstance(flt, TagExpression) and flt.tags is None:
        return None
    if isinstance(flt, TagExpression):
        return [flt.matches(m.tag) for m in messages]
    return [
        flt.matches({k: v.decode(errors="replace") for k, v in m.headers}, m.tag) for m in messages
    ]


def filter_mask(record: bytes, flt: Filter) -> bytes:
    """`matches` as a bitmap, bit i (little-endian within each byte) for message i; b""
    when every message passes."""
    result = matches(record, flt)
    if result is None or all(result):
        return b""
    out = bytearray((len(result) + 7) // 8)
    for i, ok in enumerate(result):
        if ok:
            out[i >> 3] |= 1 << (i & 7)
    return bytes(out)
