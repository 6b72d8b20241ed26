"""SQL92 filters on chosen examples: every operator, precedence, literal forms, null
semantics (three-valued logic), coercion of string properties, TAGS, error messages with
their columns, and the limits. tests/property/test_sql92_*.py cover arbitrary filters."""

from __future__ import annotations

import pytest

from tidemq.core.errors import ErrorCode, InvalidRequest
from tidemq.core.filters import (
    MAX_SQL92_DEPTH,
    MAX_SQL92_IN_VALUES,
    MAX_SQL92_LENGTH,
    FilterSyntaxError,
    Sql92Filter,
    compile_sql92,
)

Props = dict[str, str]


def matches(text: str, props: Props | None = None, tag: str | None = None) -> bool:
    return compile_sql92(text).matches(props or {}, tag)


def truth(text: str, props: Props | None = None, tag: str | None = None) -> bool | None:
    """The three-valued result: TRUE if the filter matches, FALSE if its negation does,
    else UNKNOWN (None)."""
    if matches(text, props, tag):
        assert not matches(f"NOT ({text})", props, tag)
        return True
    if matches(f"NOT ({text})", props, tag):
        return False
    return None


# ------------------------------------------------------------------ comparisons


@pytest.mark.parametrize(
    ("text", "value", "expected"),
    [
        ("a = 5", "5", True),
        ("a = 5", "6", False),
        ("a <> 5", "6", True),
        ("a <> 5", "5", False),
        ("a != 5", "6", True),
        ("a != 5", "5", False),
        ("a < 5", "4", True),
        ("a < 5", "5", False),
        ("a <= 5", "5", True),
        ("a <= 5", "6", False),
        ("a > 5", "6", True),
        ("a > 5", "5", False),
        ("a >= 5", "5", True),
        ("a >= 5", "4", False),
        # the constant on the left: the operator is mirrored
        ("5 < a", "6", True),
        ("5 < a", "5", False),
        ("5 >= a", "5", True),
        ("5 > a", "5", False),
        ("5 = a", "5", True),
        ("5 <> a", "5", False),
        # strings
        ("a = 'x'", "x", True),
        ("a = 'x'", "X", False),
        ("a <> 'x'", "y", True),
        ("'x' = a", "x", True),
        ("a = ''", "", True),
        # booleans
        ("a = TRUE", "true", True),
        ("a = TRUE", "TRUE", True),
        ("a = true", "True", True),
        ("a = TRUE", "false", False),
        ("a = FALSE", "false", True),
        ("a <> FALSE", "true", True),
    ],
)
def test_comparison_with_a_literal(text: str, value: str, expected: bool) -> None:
    assert truth(text, {"a": value}) is expected


def test_numbers_compare_as_numbers_not_strings() -> None:
    assert matches("a > 9", {"a": "10"})  # "10" < "9" as strings
    assert matches("a < 10", {"a": "9"})
    assert matches("a = 1", {"a": "1.0"})
    assert matches("a = 1000", {"a": "1e3"})
    assert matches("a = 5", {"a": "+5"})
    assert matches("a = 7", {"a": "007"})
    assert matches("a = -0.5", {"a": "-.5"})
    assert matches("a = 0.1", {"a": "0.1"})
    assert matches("a > 3.1E10", {"a": "31415000000"})
    assert matches("a = 1", {"a": "1."})


@pytest.mark.parametrize("value", ["abc", "", " 1", "1 ", "1_000", "0x10", "NaN", "inf", "1e", "٣"])
def test_a_non_numeric_property_compared_with_a_number_is_unknown(value: str) -> None:
    for text in ("a = 1", "a <> 1", "a > 1", "a < 1", "a BETWEEN 0 AND 9"):
        assert truth(text, {"a": value}) is None, text


@pytest.mark.parametrize("value", ["yes", "1", "", "t"])
def test_a_non_boolean_property_compared_with_a_boolean_is_unknown(value: str) -> None:
    assert truth("a = TRUE", {"a": value}) is None
    assert truth("a = FALSE", {"a": value}) is None


def test_two_properties() -> None:
    # = and <> compare the strings ...
    assert truth("a = b", {"a": "3.14", "b": "3.14"}) is True
    assert truth("a = b", {"a": "1.0", "b": "1"}) is False
    assert truth("a <> b", {"a": "3.14", "b": "3.141"}) is True
    # ... ordering compares the numbers
    assert truth("a > b", {"a": "20", "b": "10"}) is True
    assert truth("a > b", {"a": "10", "b": "20"}) is False
    assert truth("a >= b", {"a": "1.0", "b": "1"}) is True
    assert truth("a > b", {"a": "x", "b": "1"}) is None
    assert truth("a > b", {"a": "1"}) is None
    assert truth("a = b", {"b": "1"}) is None


def test_huge_numbers_do_not_raise() -> None:
    huge = "9" * 5000
    assert matches("a > 1", {"a": huge})
    assert matches("a > 1", {"a": "1e999"})
    assert not matches("a < 1", {"a": huge})
    assert matches("a = " + "1" * 4000, {"a": "1" * 4000})


def test_comparisons_of_two_literals_are_folded() -> None:
    assert matches("1 = 1")
    assert not matches("1 = 2")
    assert matches("'a' <> 'b'")
    assert matches("2.5 > 2")
    assert matches("TRUE = TRUE")
    assert matches("-1 < 0")


# ------------------------------------------------------------------ BETWEEN, IN, IS NULL


@pytest.mark.parametrize(
    ("value", "inside"),
    [("1", False), ("2", True), ("5", True), ("10", True), ("10.5", False), ("-3", False)],
)
def test_between_is_inclusive(value: str, inside: bool) -> None:
    assert truth("a BETWEEN 2 AND 10", {"a": value}) is inside
    assert truth("a NOT BETWEEN 2 AND 10", {"a": value}) is (not inside)


def test_between_with_property_bounds() -> None:
    props = {"a": "5", "lo": "1", "hi": "9"}
    assert matches("a BETWEEN lo AND hi", props)
    assert truth("a BETWEEN lo AND hi", {"a": "5", "hi": "9"}) is None
    assert truth("a BETWEEN lo AND hi", {"a": "10", "hi": "9"}) is False  # FALSE AND UNKNOWN
    assert truth("a NOT BETWEEN lo AND hi", {"a": "10", "hi": "9"}) is True
    assert matches("a between -1.5 and 2.5", {"a": "-1.5"})
    assert matches("a BETWEEN 5 AND 5", {"a": "5"})


def test_in() -> None:
    assert truth("a IN ('3', '4', '5')", {"a": "4"}) is True
    assert truth("a IN ('3', '4', '5')", {"a": "8"}) is False
    assert truth("a NOT IN ('3', '4', '5')", {"a": "8"}) is True
    assert truth("a NOT IN ('3', '4', '5')", {"a": "3"}) is False
    assert truth("a IN ('x')", {}) is None
    assert truth("a NOT IN ('x')", {}) is None
    assert truth("a IN ('3')", {"a": "3.0"}) is False  # strings, no coercion


def test_is_null() -> None:
    assert truth("a IS NULL", {}) is True
    assert truth("a IS NULL", {"a": ""}) is False
    assert truth("a IS NOT NULL", {"a": ""}) is True
    assert truth("a IS NOT NULL", {"b": "1"}) is False
    assert truth("'x' IS NULL") is False
    assert truth("1 IS NOT NULL") is True


# ------------------------------------------------------------------ string tests


@pytest.mark.parametrize(
    ("op", "pattern", "value", "expected"),
    [
        ("CONTAINS", "ell", "hello", True),
        ("CONTAINS", "xyz", "hello", False),
        ("CONTAINS", "hello", "hello", True),
        ("STARTSWITH", "he", "hello", True),
        ("STARTSWITH", "lo", "hello", False),
        ("ENDSWITH", "lo", "hello", True),
        ("ENDSWITH", "he", "hello", False),
        ("CONTAINS", "it's", "so it's fine", True),
        ("contains", "H", "hello", False),  # case-sensitive values, case-insensitive keyword
    ],
)
def test_string_tests(op: str, pattern: str, value: str, expected: bool) -> None:
    literal = "'" + pattern.replace("'", "''") + "'"
    assert truth(f"a {op} {literal}", {"a": value}) is expected
    assert truth(f"a NOT {op} {literal}", {"a": value}) is (not expected)
    assert truth(f"a {op} {literal}", {}) is None
    assert truth(f"a NOT {op} {literal}", {}) is None


@pytest.mark.parametrize("op", ["CONTAINS", "STARTSWITH", "ENDSWITH"])
def test_an_empty_pattern_never_matches_as_in_rocketmq(op: str) -> None:
    assert not matches(f"a {op} ''", {"a": "x"})
    assert not matches(f"a NOT {op} ''", {"a": "x"})


# ------------------------------------------------------------------ logic


def test_three_valued_logic() -> None:
    unknown, true, false = "x = 1", "TRUE", "FALSE"
    table = {
        (true, "AND", unknown): None,
        (false, "AND", unknown): False,
        (unknown, "AND", unknown): None,
        (true, "OR", unknown): True,
        (false, "OR", unknown): None,
        (unknown, "OR", unknown): None,
        (unknown, "AND", false): False,
        (unknown, "OR", true): True,
    }
    for (left, op, right), expected in table.items():
        assert truth(f"({left}) {op} ({right})") is expected, (left, op, right)
    assert truth(f"NOT ({unknown})") is None
    assert truth("NOT NOT TRUE") is True


def test_precedence() -> None:
    # AND binds tighter than OR
    assert matches("a = 1 OR b = 1 AND c = 1", {"a": "1"})
    assert not matches("(a = 1 OR b = 1) AND c = 1", {"a": "1"})
    assert matches("a = 1 AND b = 1 OR c = 1", {"c": "1"})
    # NOT binds tighter than AND, looser than comparisons
    assert matches("NOT a = 1 AND b = 1", {"a": "2", "b": "1"})
    assert not matches("NOT (a = 1 AND b = 1)", {"a": "1", "b": "1"})
    assert matches("NOT a = 1 OR b = 1", {"a": "1", "b": "1"})
    assert matches("NOT a BETWEEN 1 AND 2", {"a": "3"})
    assert matches("NOT a IS NULL", {"a": "3"})
    # BETWEEN's AND is not a logical AND
    assert matches("a BETWEEN 1 AND 3 AND b = 2", {"a": "2", "b": "2"})
    assert matches("((a = 1))", {"a": "1"})


def test_constant_and_bare_conditions() -> None:
    assert matches("TRUE")
    assert not matches("FALSE")
    assert matches("true or x = 1")
    assert not matches("FALSE AND x IS NULL")
    assert truth("flag", {"flag": "true"}) is True
    assert truth("flag", {"flag": "FALSE"}) is False
    assert truth("flag", {"flag": "yes"}) is None
    assert truth("flag", {}) is None
    assert matches("flag AND (NOT other)", {"flag": "True", "other": "false"})


def test_a_long_chain_of_and_or() -> None:
    text = " OR ".join(f"a = {i}" for i in range(300))
    assert len(text) < MAX_SQL92_LENGTH
    assert matches(text, {"a": "299"})
    assert not matches(text, {"a": "300"})


# ------------------------------------------------------------------ literals and names


@pytest.mark.parametrize(
    ("literal", "value"),
    [
        ("5", "5"),
        ("0", "0"),
        ("007", "7"),
        ("5.5", "5.5"),
        (".5", "0.5"),
        ("5.", "5"),
        ("1e2", "100"),
        ("1E2", "100"),
        ("1.5e-1", "0.15"),
        ("2.5E+1", "25"),
        ("-3", "-3"),
        ("- 3", "-3"),
        ("-2.5", "-2.5"),
        ("+4", "4"),
        ("-.5", "-0.5"),
    ],
)
def test_numeric_literals(literal: str, value: str) -> None:
    assert matches(f"a = {literal}", {"a": value})
    assert matches(f"{literal} = a", {"a": value})


@pytest.mark.parametrize(
    ("literal", "value"),
    [
        ("'abc'", "abc"),
        ("''", ""),
        ("'it''s'", "it's"),
        ("''''", "'"),
        ("'''''tag'''''", "''tag''"),
        ("'a b\tc'", "a b\tc"),
        ("'line\nbreak'", "line\nbreak"),
        ("'AND OR -- /* */'", "AND OR -- /* */"),
        ("'caf\u00e9 \U0001f600'", "caf\u00e9 \U0001f600"),
    ],
)
def test_string_literals(literal: str, value: str) -> None:
    assert matches(f"a = {literal}", {"a": value})
    assert matches(f"a IN ('z', {literal})", {"a": value})


def test_keywords_are_case_insensitive_and_names_case_sensitive() -> None:
    props = {"Region": "eu", "n": "5"}
    assert matches("Region = 'eu' and n between 1 And 9 oR FaLsE", props)
    assert matches("n NoT iN ('1') AND n Is NoT nUlL AND Region StartsWith 'e'", props)
    assert not matches("region = 'eu'", props)
    assert matches("region IS NULL", props)


@pytest.mark.parametrize("name", ["a", "_x", "$y", "order.type", "a1.b_2$", "A.", "x__"])
def test_identifiers(name: str) -> None:
    assert matches(f"{name} = 'v'", {name: "v"})


def test_keywords_are_not_property_names() -> None:
    with pytest.raises(FilterSyntaxError):
        compile_sql92("in = 'x'")


def test_whitespace_and_comments() -> None:
    assert matches("\ta\n=\r\n5\f", {"a": "5"})
    assert matches("a=5 AND(b>1)OR(c<>'x')", {"a": "5", "b": "2"})
    assert matches("a = 5 -- trailing comment", {"a": "5"})
    assert matches("a = 5 -- comment\n AND b = 1", {"a": "5", "b": "1"})
    assert matches("a /* inline ' not a string */ = 5", {"a": "5"})
    assert matches("/* multi\nline */ a = 5", {"a": "5"})


# ------------------------------------------------------------------ TAGS


def test_tags_is_the_message_tag() -> None:
    assert matches("TAGS = 'TagA'", {}, "TagA")
    assert not matches("TAGS = 'TagA'", {}, "TagB")
    assert matches("TAGS IN ('TagA', 'TagB')", {}, "TagB")
    assert matches("TAGS IS NULL", {}, None)
    assert matches("TAGS IS NOT NULL AND TAGS = '''''tag'''''", {}, "''tag''")
    assert matches("TAGS STARTSWITH 'Order'", {}, "OrderPaid")
    assert truth("TAGS = 'x'", {}, None) is None
    # TAGS reads the tag argument only, never a property of that name ...
    assert not matches("TAGS = 'x'", {"TAGS": "x"}, None)
    assert matches("TAGS = 'x'", {"TAGS": "y"}, "x")
    # ... and only in upper case: "tags" is an ordinary property
    assert matches("tags = 'x'", {"tags": "x"}, "y")
    assert matches("TAGS > 5", {}, "7")


# ------------------------------------------------------------------ the API


def test_the_filter_object() -> None:
    text = "a = 1"
    f = compile_sql92(text)
    assert isinstance(f, Sql92Filter)
    assert f.text == text
    assert f == compile_sql92(text)
    assert f != compile_sql92("a = 2")
    assert "a = 1" in repr(f)
    assert f.matches({"a": "1"})
    assert f.matches({"a": "1"}, None)
    assert f.matches({"a": "1"}, tag="x")


def test_the_error_is_an_invalid_request() -> None:
    with pytest.raises(FilterSyntaxError) as info:
        compile_sql92("a = ")
    error = info.value
    assert isinstance(error, InvalidRequest)
    assert error.code == ErrorCode.INVALID_REQUEST
    assert not error.retriable
    assert error.column == 5
    assert error.problem == "expected a value after '='"
    assert str(error) == "SQL92 filter: expected a value after '=' at column 5, found end of input"


# ------------------------------------------------------------------ errors and positions

BAD = [
    # (text, column, part of the message)
    ("", 1, "expected a condition"),
    ("   ", 4, "expected a condition"),
    ("a =", 4, "expected a value after '='"),
    ("region = 'eu' AND", 18, "expected a condition"),
    ("a = = 5", 5, "expected a value after '='"),
    ("a == 5", 4, "expected a value after '='"),
    ("a > ", 5, "expected a value after '>'"),
    ("(a = 1", 7, "expected ')' (to match column 1)"),
    ("((a = 1)", 9, "expected ')' (to match column 1)"),
    ("a = 1)", 6, "expected AND, OR or the end of the expression"),
    ("a = 1 b = 2", 7, "expected AND, OR or the end"),
    ("a = 5 = 6", 7, "expected AND, OR or the end"),
    ("()", 2, "expected a condition"),
    ("a > 'x'", 5, "'>' compares numbers, not a string"),
    ("'x' < a", 1, "'<' compares numbers, not a string"),
    ("a >= TRUE", 6, "'>=' compares numbers, not a boolean"),
    ("'x' = 5", 5, "cannot compare a string with a number"),
    ("TRUE <> 'x'", 6, "cannot compare a boolean with a string"),
    ("1 = FALSE", 3, "cannot compare a number with a boolean"),
    ("a BETWEEN 5 AND 1", 11, "BETWEEN bounds are reversed"),
    ("a BETWEEN 'a' AND 'b'", 11, "BETWEEN compares numbers, not a string"),
    ("'x' BETWEEN 1 AND 2", 1, "BETWEEN compares numbers, not a string"),
    ("a BETWEEN 1 OR 2", 13, "expected AND between the bounds"),
    ("a BETWEEN 1 AND", 16, "expected a number after BETWEEN ... AND"),
    ("a BETWEEN", 10, "expected a number after BETWEEN"),
    ("a IN ()", 7, "expected a string literal in the IN list"),
    ("a IN (1, 2)", 7, "expected a string literal in the IN list"),
    ("a IN ('x' 'y')", 11, "expected ',' or ')' in the IN list"),
    ("a IN ('x',)", 11, "expected a string literal in the IN list"),
    ("a IN 'x'", 6, "expected '(' after IN"),
    ("'x' IN ('x')", 1, "IN needs a property on its left, not a string"),
    ("5 CONTAINS 'a'", 1, "CONTAINS needs a property on its left, not a number"),
    ("a CONTAINS 5", 12, "expected a string literal after CONTAINS"),
    ("a STARTSWITH b", 14, "expected a string literal after STARTSWITH"),
    ("a NOT ENDSWITH", 15, "expected a string literal after ENDSWITH"),
    ("a NOT LIKE 'x'", 7, "expected BETWEEN, IN, CONTAINS, STARTSWITH or ENDSWITH after NOT"),
    ("a NOT", 6, "expected BETWEEN, IN"),
    ("a IS 5", 6, "expected NULL or NOT NULL after IS"),
    ("a IS NOT", 9, "expected NULL or NOT NULL after IS"),
    ("a = NULL", 5, "NULL is not a value"),
    ("NULL IS NULL", 1, "NULL is not a value"),
    ("5", 2, "expected a comparison operator after '5'"),
    ("'abc'", 6, "expected a comparison operator after \"'abc'\""),
    ("a b", 3, "expected a comparison operator after 'a'"),
    ("a LIKE 'x%'", 3, "expected a comparison operator after 'a'"),
    ("a - 1", 3, "expected a comparison operator after 'a'"),
    ("a = -b", 6, "expected a number after '-'"),
    ("a = - 'x'", 7, "expected a number after '-'"),
    ("NOT", 4, "expected a condition"),
    ("a = 1 AND OR b = 2", 11, "expected a condition"),
    ("AND a = 1", 1, "expected a condition"),
    ("'abc", 1, "unterminated string literal"),
    ("a = 'it''s", 5 + 4, "unterminated string literal"),  # 'it' then 's
    ("a = 5 /* x", 7, "unterminated comment"),
    ("a # 5", 3, "unexpected character '#'"),
    ('a = "x"', 5, "unexpected character '\"'"),
    ("a & b", 3, "unexpected character '&'"),
    ("a || b", 3, "unexpected character '|'"),
    ("caf\u00e9 = 1", 4, "unexpected character '\u00e9'"),
    ("a > 1e", 5, "malformed number '1e'"),
    ("a > 1.2.3", 5, "malformed number '1.2.3'"),
    ("a > 5L", 5, "malformed number '5L'"),
    ("a > 12abc", 5, "malformed number '12abc'"),
    ("a = 1\nAND b =", 14, "expected a value after '='"),
]


@pytest.mark.parametrize(("text", "column", "message"), BAD)
def test_errors_name_the_problem_and_its_column(text: str, column: int, message: str) -> None:
    with pytest.raises(FilterSyntaxError) as info:
        compile_sql92(text)
    error = info.value
    assert str(error).startswith("SQL92 filter: ")
    assert message in str(error)
    assert error.column == column, str(error)
    assert f"at column {column}" in str(error)


def test_the_error_says_what_was_found() -> None:
    with pytest.raises(FilterSyntaxError, match=r"at column 11, found 'OR'$"):
        compile_sql92("a = 1 AND OR")
    with pytest.raises(FilterSyntaxError, match=r"found string 'xxxxxxxxxxxxxxxxxxx\.\.\.'$"):
        compile_sql92("a = 1 " + "'" + "x" * 50 + "'")


# ------------------------------------------------------------------ limits


def test_length_limit() -> None:
    ok = "a = '" + "x" * (MAX_SQL92_LENGTH - 6) + "'"
    assert len(ok) == MAX_SQL92_LENGTH
    assert matches(ok, {"a": "x" * (MAX_SQL92_LENGTH - 6)})
    with pytest.raises(FilterSyntaxError, match=f"longer than {MAX_SQL92_LENGTH} characters"):
        compile_sql92(ok + " ")


def test_depth_limit_on_parentheses() -> None:
    ok = "(" * MAX_SQL92_DEPTH + "a = 1" + ")" * MAX_SQL92_DEPTH
    assert matches(ok, {"a": "1"})
    deep = "(" + ok + ")"
    with pytest.raises(FilterSyntaxError, match=f"deeper than {MAX_SQL92_DEPTH}") as info:
        compile_sql92(deep)
    assert info.value.column == MAX_SQL92_DEPTH + 1


def test_depth_limit_on_not() -> None:
    ok = "NOT " * MAX_SQL92_DEPTH + "a = 1"
    assert matches(ok, {"a": "1"}) is (MAX_SQL92_DEPTH % 2 == 0)
    with pytest.raises(FilterSyntaxError, match="deeper than") as info:
        compile_sql92("NOT " + ok)
    assert info.value.column == 4 * MAX_SQL92_DEPTH + 1


@pytest.mark.parametrize(
    "text",
    [
        "(" * (MAX_SQL92_LENGTH - 10) + "a = 1",
        "NOT " * (MAX_SQL92_LENGTH // 4 - 2) + "a = 1",
        "(NOT " * (MAX_SQL92_LENGTH // 5 - 1),
        "(" * MAX_SQL92_LENGTH,
    ],
)
def test_hostile_nesting_is_a_syntax_error_not_a_recursion_error(text: str) -> None:
    with pytest.raises(FilterSyntaxError, match="deeper than"):
        compile_sql92(text)


def test_in_list_limit() -> None:
    values = [f"'{i}'" for i in range(10)] + ["''"] * (MAX_SQL92_IN_VALUES - 11) + ["'last'"]
    ok = "a IN (" + ",".join(values) + ")"
    assert len(ok) < MAX_SQL92_LENGTH
    assert matches(ok, {"a": "last"})
    assert matches(ok, {"a": ""})
    assert not matches(ok, {"a": "10"})
    over = "a IN (" + ",".join([*values, "'x'"]) + ")"
    with pytest.raises(
        FilterSyntaxError, match=f"IN list longer than {MAX_SQL92_IN_VALUES}"
    ) as info:
        compile_sql92(over)
    assert info.value.column == len(over) - 3
