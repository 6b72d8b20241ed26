"""Garbage in, FilterSyntaxError out: compiling any text (random code points, random bytes
decoded, soups of the grammar's own tokens, one-character mutations of valid filters)
either gives a filter that evaluates to a bool on any properties, or raises
FilterSyntaxError with a column inside the text. Never another exception (IndexError,
ValueError, RecursionError, ...), and never a hang."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.core.filters import MAX_SQL92_LENGTH, FilterSyntaxError, compile_sql92

FUZZ = settings(
    max_examples=250,
    deadline=timedelta(seconds=1),  # generous: a hang still fails, a slow machine does not
    suppress_health_check=[HealthCheck.too_slow],
)

TOKENS = [
    *["a", "b", "TAGS", "x.y", "$z", "_", "AND", "or", "Not", "BETWEEN", "in", "IS", "NULL"],
    *["TRUE", "false", "CONTAINS", "startswith", "ENDSWITH", "=", "<>", "!=", "<", "<=", ">"],
    *[">=", "(", ")", ",", "-", "+", "'s'", "''", "'it''s'", "'", "0", "5", "2.5", ".5", "5."],
    *["1e3", "1e", "--", "/*", "*/", "\n", " ", "\t", "é", "\x00", "||", "!", "==", "LIKE"],
]
VALID = [
    "a = 1",
    "region = 'eu' AND (amount > 100 OR TAGS IN ('vip', 'gold'))",
    "a NOT BETWEEN -1.5 AND 2 OR b IS NOT NULL",
    "NOT (c.d STARTSWITH 'x' AND c.d NOT ENDSWITH 'y') -- done",
    "TAGS IS NULL OR TAGS CONTAINS 'it''s' /* c */",
]

garbage = st.one_of(
    st.text(max_size=120),
    st.binary(max_size=120).map(lambda b: b.decode("latin-1")),
    st.binary(max_size=120).map(lambda b: b.decode("utf-8", "replace")),
    st.lists(st.sampled_from(TOKENS), max_size=40).map(" ".join),
    st.lists(st.sampled_from(TOKENS), max_size=40).map("".join),
)


@st.composite
def mutants(draw: st.DrawFn) -> str:
    """A valid filter with one character deleted, replaced or inserted."""
    text = draw(st.sampled_from(VALID))
    at = draw(st.integers(0, len(text)))
    char = draw(st.sampled_from("'()=<>-,. aN0|/*\n") | st.characters())
    how = draw(st.sampled_from(["delete", "replace", "insert"]))
    if how == "delete":
        return text[:at] + text[at + 1 :]
    if how == "replace":
        return text[:at] + char + text[at + 1 :]
    return text[:at] + char + text[at:]


PROPERTIES = [
    {},
    {"a": "1", "b": "x", "TAGS": "t", "x.y": "2.5", "$z": "", "_": "true"},
    {"a": "abc", "b": "1e999", "x.y": "-0", "$z": "9" * 5000},
]


def check(text: str) -> None:
    error: FilterSyntaxError | None = None
    try:
        compiled = compile_sql92(text)
    except FilterSyntaxError as e:
        error = e
    if error is not None:
        assert 1 <= error.column <= min(len(text), MAX_SQL92_LENGTH) + 1, (text, str(error))
        assert str(error).startswith("SQL92 filter: ")
        assert f"at column {error.column}" in str(error)
        return
    for props in PROPERTIES:
        for tag in (None, "t", ""):
            assert compiled.matches(props, tag) in (True, False)


@FUZZ
@given(garbage)
def test_garbage_compiles_or_raises_filter_syntax_error(text: str) -> None:
    check(text)


@FUZZ
@given(mutants())
def test_mutated_filters_compile_or_raise_filter_syntax_error(text: str) -> None:
    check(text)


@settings(FUZZ, max_examples=40)
@given(
    st.sampled_from(["(", "NOT ", "(NOT ", "NOT (", "a = 1 AND ", "-", "'", "/*"]),
    st.integers(1, 3000),
)
def test_repetition_bombs_raise_filter_syntax_error(unit: str, count: int) -> None:
    check(unit * count)
