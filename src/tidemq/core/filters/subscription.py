"""How a client names a filter: a plain string is a tag expression; `Sql92("...")` is a
SQL92 filter. `subscription(flt)` checks it (FilterSyntaxError names the column) and gives
the (kind, expression) pair the wire protocol carries."""

from __future__ import annotations

from dataclasses import dataclass

from tidemq.core.filters.sql92 import compile_sql92
from tidemq.core.filters.tag_expression import parse_tag_expression

__all__ = ["Sql92", "subscription"]


@dataclass(frozen=True, slots=True)
class Sql92:
    """A SQL92 filter for a subscription: `Sql92("region = 'eu' AND amount > 100")`."""

    expression: str


def subscription(flt: str | Sql92) -> tuple[str, str]:
    """("tag" or "sql92", expression), after checking the expression compiles."""
    if isinstance(flt, Sql92):
        compile_sql92(flt.expression)
        return "sql92", flt.expression
    parse_tag_expression(flt)
    return "tag", flt
