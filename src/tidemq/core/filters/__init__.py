"""Subscription filters, evaluated by the broker: tag expressions (``"TagA || TagB"``, whose
summary mask skips whole batches) and SQL92 property filters with RocketMQ's grammar.
Pure functions of their input: no I/O. docs/design/filters.md has the grammar and
semantics."""

from __future__ import annotations

from tidemq.core.filters.errors import FilterSyntaxError
from tidemq.core.filters.sql92 import (
    MAX_SQL92_DEPTH,
    MAX_SQL92_IN_VALUES,
    MAX_SQL92_LENGTH,
    Sql92Filter,
    compile_sql92,
)
from tidemq.core.filters.subscription import Sql92, subscription
from tidemq.core.filters.tag_expression import (
    MAX_TAG_EXPRESSION_LENGTH,
    MAX_TAG_EXPRESSION_TAGS,
    TagExpression,
    parse_tag_expression,
)

__all__ = [
    "MAX_SQL92_DEPTH",
    "MAX_SQL92_IN_VALUES",
    "MAX_SQL92_LENGTH",
    "MAX_TAG_EXPRESSION_LENGTH",
    "MAX_TAG_EXPRESSION_TAGS",
    "FilterSyntaxError",
    "Sql92",
    "Sql92Filter",
    "TagExpression",
    "compile_sql92",
    "parse_tag_expression",
    "subscription",
]
