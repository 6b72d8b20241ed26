"""SQL92 property filters with RocketMQ's grammar, compiled once into closures.

``compile_sql92("region = 'eu' AND (amount > 100 OR TAGS IN ('vip'))")`` returns a
`Sql92Filter` whose ``matches(properties, tag)`` tells whether a message is wanted.
Properties are strings; ``TAGS`` is the message tag. Logic is three-valued (TRUE, FALSE,
UNKNOWN) as in SQL and RocketMQ: a predicate on a missing property is UNKNOWN, NOT UNKNOWN
is UNKNOWN, and a message matches only when the whole filter is TRUE.

The parser is a recursive descent over a regex tokenizer; each rule returns the closure
that evaluates it, so a filter is parsed once per subscription and evaluating it is a few
Python calls per message. Constant sub-expressions are folded at compile time.
docs/design/filters.md has the grammar (EBNF), the coercion and null rules, and where
they differ from RocketMQ.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NamedTuple, TypeAlias

from tidemq.core.filters.errors import FilterSyntaxError

__all__ = [
    "MAX_SQL92_DEPTH",
    "MAX_SQL92_IN_VALUES",
    "MAX_SQL92_LENGTH",
    "Sql92Filter",
    "compile_sql92",
]

#: Characters in one expression: a subscription filter is a few predicates, and this bounds
#: what the broker parses and keeps per subscription.
MAX_SQL92_LENGTH: Final = 4096
#: Nesting of parentheses and NOT: bounds the parser's recursion (and the closures'), so a
#: hostile ``((((...`` is refused with a message instead of a RecursionError.
MAX_SQL92_DEPTH: Final = 64
#: Values in one IN list (a set lookup whatever its size; the bound is on memory).
MAX_SQL92_IN_VALUES: Final = 1024

_LANGUAGE: Final = "SQL92"
#: The identifier that names the message tag instead of a property (case-sensitive, as the
#: property name is in RocketMQ).
TAGS: Final = "TAGS"
#: Integers longer than this convert to float: int() refuses more than 4300 digits.
_MAX_INT_DIGITS: Final = 4000

Number: TypeAlias = int | float
Value: TypeAlias = str | int | float | bool
Properties: TypeAlias = Mapping[str, str]
#: A compiled condition: TRUE, FALSE, or None for UNKNOWN.
Pred: TypeAlias = Callable[[Properties, str | None], bool | None]
Getter: TypeAlias = Callable[[Properties, str | None], Value | None]

# ------------------------------------------------------------------ values and coercion

_INTEGER: Final = re.compile(r"[+-]?[0-9]+")
_DECIMAL: Final = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_BOOLEANS: Final = {"true": True, "false": False}


def to_number(text: str | None) -> Number | None:
    """A property value as a number, or None when it is missing or not a plain decimal
    number (optional sign, digits, optional fraction and exponent; ASCII, no spaces)."""
    if text is None:
        return None
    if text.isdigit() and text.isascii() and len(text) <= _MAX_INT_DIGITS:  # the common case
        return int(text)
    if _INTEGER.fullmatch(text) is not None:
        return int(text) if len(text) <= _MAX_INT_DIGITS else float(text)
    if _DECIMAL.fullmatch(text) is not None:
        return float(text)
    return None


def to_boolean(text: str | None) -> bool | None:
    """A property value as a boolean: "true" or "false" in any case, else None."""
    return None if text is None else _BOOLEANS.get(text.lower())


# ------------------------------------------------------------------ tokens

_Kind = Literal["ident", "kw", "str", "num", "op", "eof"]
_KEYWORDS: Final = frozenset(
    {"AND", "OR", "NOT", "BETWEEN", "IN", "IS", "NULL", "TRUE", "FALSE"}
    | {"CONTAINS", "STARTSWITH", "ENDSWITH"}
)
_STRING_OPS: Final = ("CONTAINS", "STARTSWITH", "ENDSWITH")
_NOT_FORMS: Final = ("BETWEEN", "IN", *_STRING_OPS)
_PREDICATE_KEYWORDS: Final = ("NOT", "IS", *_NOT_FORMS)
_TOKEN: Final = re.compile(
    r"""
    (?P<ws>[ \t\n\r\f]+)
    |(?P<comment>--[^\n\r]*|/\*.*?\*/)
    |(?P<num>(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?)
    |(?P<ident>[A-Za-z_$][A-Za-z0-9_$.]*)
    |(?P<str>'(?:[^']|'')*')
    |(?P<op><>|!=|<=|>=|[=<>(),+-])
    """,
    re.VERBOSE | re.DOTALL,
)
_WORD_CHAR: Final = re.compile(r"[A-Za-z0-9_$.]")


class _Token(NamedTuple):
    kind: _Kind
    text: str  # as written; for keywords, upper case
    column: int  # 1-based

    def describe(self) -> str:
        if self.kind == "eof":
            return "end of input"
        if self.kind == "str":
            shown = self.text if len(self.text) <= 24 else self.text[:20] + "...'"
            return f"string {shown}"
        return f"'{self.text}'"


def _tokenize(text: str) -> list[_Token]:
    tokens: list[_Token] = []
    pos, end = 0, len(text)
    while pos < end:
        m = _TOKEN.match(text, pos)
        if m is None:
            char = text[pos]
            if char == "'":
                problem = "unterminated string literal (no closing ')"
            elif text.startswith("/*", pos):
                problem = "unterminated comment (no closing */)"
            else:
                problem = f"unexpected character {char!r}"
            raise FilterSyntaxError(_LANGUAGE, problem, pos + 1)
        kind = m.lastgroup
        word = m.group()
        if kind == "num" and m.end() < end and _WORD_CHAR.match(text, m.end()):
            stop = m.end()
            while stop < end and _WORD_CHAR.match(text, stop):
                stop += 1
            raise FilterSyntaxError(_LANGUAGE, f"malformed number {text[pos:stop]!r}", pos + 1)
        if kind == "ident" and word.upper() in _KEYWORDS:
            tokens.append(_Token("kw", word.upper(), pos + 1))
        elif kind in ("num", "ident", "str", "op"):
            tokens.append(_Token(kind, word, pos + 1))  # type: ignore[arg-type]
        pos = m.end()
    tokens.append(_Token("eof", "", end + 1))
    return tokens


# ------------------------------------------------------------------ compiled conditions


def _true(p: Properties, t: str | None) -> bool | None:
    return True


def _false(p: Properties, t: str | None) -> bool | None:
    return False


def _unknown(p: Properties, t: str | None) -> bool | None:
    return None


_CONSTANTS: Final[dict[bool | None, Pred]] = {True: _true, False: _false, None: _unknown}


def _constant_of(pred: Pred) -> tuple[bool, bool | None]:
    """(is it a folded constant, its value)."""
    if pred is _true:
        return True, True
    if pred is _false:
        return True, False
    if pred is _unknown:
        return True, None
    return False, None


def _and(preds: list[Pred]) -> Pred:
    """Three-valued AND: FALSE if any is FALSE, else UNKNOWN if any is UNKNOWN, else TRUE."""
    rest: list[Pred] = []
    for pred in preds:
        const, value = _constant_of(pred)
        if const and value is False:
            return _false
        if not (const and value is True):
            rest.append(pred)
    if not rest:
        return _true
    if len(rest) == 1:
        return rest[0]
    terms = tuple(rest)

    def all_of(p: Properties, t: str | None) -> bool | None:
        unknown = False
        for term in terms:
            r = term(p, t)
            if r is False:
                return False
            if r is None:
                unknown = True
        return None if unknown else True

    return all_of


def _or(preds: list[Pred]) -> Pred:
    """Three-valued OR: TRUE if any is TRUE, else UNKNOWN if any is UNKNOWN, else FALSE."""
    rest: list[Pred] = []
    for pred in preds:
        const, value = _constant_of(pred)
        if const and value is True:
            return _true
        if not (const and value is False):
            rest.append(pred)
    if not rest:
        return _false
    if len(rest) == 1:
        return rest[0]
    terms = tuple(rest)

    def any_of(p: Properties, t: str | None) -> bool | None:
        unknown = False
        for term in terms:
            r = term(p, t)
            if r is True:
                return True
            if r is None:
                unknown = True
        return None if unknown else False

    return any_of


def _not(pred: Pred) -> Pred:
    const, value = _constant_of(pred)
    if const:
        return _CONSTANTS[None if value is None else not value]

    def negated(p: Properties, t: str | None) -> bool | None:
        r = pred(p, t)
        return None if r is None else not r

    return negated


# ------------------------------------------------------------------ operands

_Type = Literal["prop", "str", "num", "bool"]
_TYPE_NAMES: Final = {
    "prop": "a property",
    "str": "a string",
    "num": "a number",
    "bool": "a boolean",
}


@dataclass(frozen=True, slots=True)
class _Operand:
    type: _Type
    value: Value  # the property name for "prop"
    column: int
    text: str

    @property
    def is_tag(self) -> bool:
        return self.type == "prop" and self.value == TAGS


def _raw_getter(operand: _Operand) -> Callable[[Properties, str | None], str | None]:
    if operand.is_tag:
        return lambda p, t: t
    name = str(operand.value)
    return lambda p, t: p.get(name)


def _getter(operand: _Operand, mode: _Type) -> Getter:
    """The operand's value in a comparison of this mode ("str", "num" or "bool"), None when
    it is missing or does not convert (UNKNOWN)."""
    if operand.type != "prop":
        value = operand.value
        return lambda p, t: value
    raw = _raw_getter(operand)
    if mode == "num":
        return lambda p, t: to_number(raw(p, t))
    if mode == "bool":
        return lambda p, t: to_boolean(raw(p, t))
    return raw


_Op = Callable[[Any, Any], bool]
_COMPARISONS: Final[dict[str, _Op]] = {
    "=": operator.eq,
    "<>": operator.ne,
    "!=": operator.ne,
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_ORDERING: Final = frozenset({"<", "<=", ">", ">="})
_MIRROR: Final = {"=": "=", "<>": "<>", "!=": "!=", "<": ">", "<=": ">=", ">": "<", ">=": "<="}


def _comparison(op: str, left: _Operand, right: _Operand, mode: _Type) -> Pred:
    """``left op right`` with both sides converted to `mode`; UNKNOWN if either is."""
    if left.type != "prop" and right.type == "prop":
        left, right, op = right, left, _MIRROR[op]
    compare = _COMPARISONS[op]
    get_left = _getter(left, mode)
    if left.type != "prop":  # both constant
        return _CONSTANTS[compare(left.value, right.value)]
    if right.type != "prop":
        constant = right.value

        def against_constant(p: Properties, t: str | None) -> bool | None:
            a = get_left(p, t)
            return None if a is None else compare(a, constant)

        return against_constant
    get_right = _getter(right, mode)

    def between_values(p: Properties, t: str | None) -> bool | None:
        a = get_left(p, t)
        if a is None:
            return None
        b = get_right(p, t)
        return None if b is None else compare(a, b)

    return between_values


_STRING_TESTS: Final[dict[str, Callable[[str, str], bool]]] = {
    "CONTAINS": lambda value, pattern: pattern in value,
    "STARTSWITH": str.startswith,
    "ENDSWITH": str.endswith,
}


def _string_test(kind: str, operand: _Operand, pattern: str, negated: bool) -> Pred:
    """CONTAINS, STARTSWITH, ENDSWITH and their NOT forms. An empty pattern is FALSE in both
    forms, as in RocketMQ; a missing property is UNKNOWN."""
    if not pattern:
        return _false
    raw = _raw_getter(operand)
    test = _STRING_TESTS[kind]

    def string_test(p: Properties, t: str | None) -> bool | None:
        v = raw(p, t)
        return None if v is None else test(v, pattern) is not negated

    return string_test


def _membership(operand: _Operand, values: frozenset[str], negated: bool) -> Pred:
    raw = _raw_getter(operand)

    def member(p: Properties, t: str | None) -> bool | None:
        v = raw(p, t)
        return None if v is None else (v in values) is not negated

    return member


def _is_null(operand: _Operand, negated: bool) -> Pred:
    if operand.type != "prop":
        return _CONSTANTS[negated]
    raw = _raw_getter(operand)
    if negated:
        return lambda p, t: raw(p, t) is not None
    return lambda p, t: raw(p, t) is None


def _boolean_cast(operand: _Operand) -> Pred:
    """A property on its own as a condition: "true"/"false" in any case, else UNKNOWN."""
    raw = _raw_getter(operand)
    return lambda p, t: to_boolean(raw(p, t))


# ------------------------------------------------------------------ parser


class _Parser:
    """Recursive descent; every rule returns the compiled closure of what it parsed.

    filter     = or_expr EOF
    or_expr    = and_expr { OR and_expr }
    and_expr   = not_expr { AND not_expr }
    not_expr   = NOT not_expr | "(" or_expr ")" | predicate
    """

    def __init__(self, text: str) -> None:
        self.tokens = _tokenize(text)
        self.pos = 0
        self.depth = 0

    # -------------------------------------------------------------- helpers

    @property
    def token(self) -> _Token:
        return self.tokens[self.pos]

    def advance(self) -> _Token:
        token = self.tokens[self.pos]
        if token.kind != "eof":
            self.pos += 1
        return token

    def at(self, kind: _Kind, text: str | None = None) -> bool:
        token = self.tokens[self.pos]
        return token.kind == kind and (text is None or token.text == text)

    def fail(self, problem: str, token: _Token | None = None) -> FilterSyntaxError:
        token = token or self.token
        return FilterSyntaxError(_LANGUAGE, problem, token.column, token.describe())

    def enter(self, token: _Token) -> None:
        self.depth += 1
        if self.depth > MAX_SQL92_DEPTH:
            raise FilterSyntaxError(
                _LANGUAGE,
                f"nesting deeper than {MAX_SQL92_DEPTH} levels of parentheses and NOT",
                token.column,
            )

    # -------------------------------------------------------------- conditions

    def parse(self) -> Pred:
        pred = self.or_expr()
        if not self.at("eof"):
            raise self.fail("expected AND, OR or the end of the expression")
        return pred

    def or_expr(self) -> Pred:
        terms = [self.and_expr()]
        while self.at("kw", "OR"):
            self.advance()
            terms.append(self.and_expr())
        return _or(terms)

    def and_expr(self) -> Pred:
        terms = [self.not_expr()]
        while self.at("kw", "AND"):
            self.advance()
            terms.append(self.not_expr())
        return _and(terms)

    def not_expr(self) -> Pred:
        token = self.token
        if self.at("kw", "NOT"):
            self.enter(self.advance())
            pred = _not(self.not_expr())
            self.depth -= 1
            return pred
        if self.at("op", "("):
            self.enter(self.advance())
            pred = self.or_expr()
            if not self.at("op", ")"):
                raise self.fail(f"expected ')' (to match column {token.column})")
            self.advance()
            self.depth -= 1
            return pred
        return self.predicate()

    def predicate(self) -> Pred:
        left = self.operand("expected a condition")
        token = self.token
        if token.kind == "op" and token.text in _COMPARISONS:
            self.advance()
            right = self.operand(f"expected a value after '{token.text}'")
            return self.comparison(token, left, right)
        if token.kind == "kw" and token.text in _PREDICATE_KEYWORDS:
            return self.keyword_predicate(left)
        # a value on its own: a property or TRUE/FALSE is a condition, nothing else is
        if left.type == "bool":
            return _CONSTANTS[bool(left.value)]
        if left.type == "prop" and (token.kind == "eof" or token.text in ("AND", "OR", ")")):
            return _boolean_cast(left)
        raise self.fail(f"expected a comparison operator after {left.text!r}")

    def keyword_predicate(self, left: _Operand) -> Pred:
        """[NOT] BETWEEN, [NOT] IN, [NOT] CONTAINS/STARTSWITH/ENDSWITH, IS [NOT] NULL."""
        token = self.advance()
        negated = False
        if token.text == "NOT":
            if not (self.token.kind == "kw" and self.token.text in _NOT_FORMS):
                raise self.fail("expected BETWEEN, IN, CONTAINS, STARTSWITH or ENDSWITH after NOT")
            negated, token = True, self.advance()
        if token.text == "BETWEEN":
            return self.between(left, negated)
        if token.text == "IN":
            return self.in_list(token, left, negated)
        if token.text in _STRING_OPS:
            return self.string_test(token, left, negated)
        # IS
        negated = self.at("kw", "NOT")
        if negated:
            self.advance()
        if not self.at("kw", "NULL"):
            raise self.fail("expected NULL or NOT NULL after IS")
        self.advance()
        return _is_null(left, negated)

    # -------------------------------------------------------------- operands

    def operand(self, expected: str) -> _Operand:
        token = self.token
        if token.kind == "ident":
            self.advance()
            return _Operand("prop", token.text, token.column, token.text)
        if token.kind == "str":
            self.advance()
            return _Operand("str", _unquote(token.text), token.column, token.text)
        if token.kind == "num":
            self.advance()
            return _Operand("num", _number(token.text), token.column, token.text)
        if token.kind == "op" and token.text in "+-":
            self.advance()
            number = self.token
            if number.kind != "num":
                raise self.fail(f"expected a number after '{token.text}'")
            self.advance()
            value = _number(number.text)
            return _Operand(
                "num",
                -value if token.text == "-" else value,
                token.column,
                token.text + number.text,
            )
        if token.kind == "kw" and token.text in ("TRUE", "FALSE"):
            self.advance()
            return _Operand("bool", token.text == "TRUE", token.column, token.text)
        if token.kind == "kw" and token.text == "NULL":
            raise self.fail("NULL is not a value: test it with IS NULL or IS NOT NULL")
        raise self.fail(expected)

    def numeric(self, operand: _Operand, what: str) -> None:
        if operand.type not in ("prop", "num"):
            raise FilterSyntaxError(
                _LANGUAGE,
                f"{what} compares numbers, not {_TYPE_NAMES[operand.type]} ({operand.text})",
                operand.column,
            )

    def property_on_left(self, operand: _Operand, keyword: _Token) -> None:
        if operand.type != "prop":
            raise FilterSyntaxError(
                _LANGUAGE,
                f"{keyword.text} needs a property on its left, not {_TYPE_NAMES[operand.type]}",
                operand.column,
            )

    def string_literal(self, expected: str) -> str:
        token = self.token
        if token.kind != "str":
            raise self.fail(expected)
        self.advance()
        return _unquote(token.text)

    # -------------------------------------------------------------- predicates

    def comparison(self, op: _Token, left: _Operand, right: _Operand) -> Pred:
        if op.text in _ORDERING:
            self.numeric(left, f"'{op.text}'")
            self.numeric(right, f"'{op.text}'")
            return _comparison(op.text, left, right, "num")
        types = {left.type, right.type} - {"prop"}
        if len(types) > 1:
            raise FilterSyntaxError(
                _LANGUAGE,
                f"cannot compare {_TYPE_NAMES[left.type]} with {_TYPE_NAMES[right.type]}",
                op.column,
            )
        mode: _Type = types.pop() if types else "str"
        return _comparison(op.text, left, right, mode)

    def between(self, value: _Operand, negated: bool) -> Pred:
        low = self.operand("expected a number after BETWEEN")
        if not self.at("kw", "AND"):
            raise self.fail("expected AND between the bounds of BETWEEN")
        self.advance()
        high = self.operand("expected a number after BETWEEN ... AND")
        for operand in (value, low, high):
            self.numeric(operand, "BETWEEN")
        if low.type == "num" and high.type == "num" and low.value > high.value:  # type: ignore[operator]
            raise FilterSyntaxError(
                _LANGUAGE,
                f"BETWEEN bounds are reversed ({low.text} is greater than {high.text})",
                low.column,
            )
        if negated:  # x < low OR x > high
            return _or([_comparison("<", value, low, "num"), _comparison(">", value, high, "num")])
        return _and([_comparison(">=", value, low, "num"), _comparison("<=", value, high, "num")])

    def in_list(self, keyword: _Token, operand: _Operand, negated: bool) -> Pred:
        self.property_on_left(operand, keyword)
        if not self.at("op", "("):
            raise self.fail("expected '(' after IN")
        self.advance()
        values = [self.string_literal("expected a string literal in the IN list")]
        while self.at("op", ","):
            self.advance()
            if len(values) == MAX_SQL92_IN_VALUES:
                raise FilterSyntaxError(
                    _LANGUAGE,
                    f"IN list longer than {MAX_SQL92_IN_VALUES} values",
                    self.token.column,
                )
            values.append(self.string_literal("expected a string literal in the IN list"))
        if not self.at("op", ")"):
            raise self.fail("expected ',' or ')' in the IN list")
        self.advance()
        return _membership(operand, frozenset(values), negated)

    def string_test(self, keyword: _Token, operand: _Operand, negated: bool) -> Pred:
        self.property_on_left(operand, keyword)
        pattern = self.string_literal(f"expected a string literal after {keyword.text}")
        return _string_test(keyword.text, operand, pattern, negated)


def _unquote(literal: str) -> str:
    return literal[1:-1].replace("''", "'")


def _number(text: str) -> Number:
    number = to_number(text)
    assert number is not None, text  # the tokenizer matched a number
    return number


# ------------------------------------------------------------------ public API


@dataclass(frozen=True, slots=True)
class Sql92Filter:
    """A compiled SQL92 filter; build it with `compile_sql92`. Equal when the text is."""

    text: str
    _pred: Pred = field(repr=False, compare=False)

    def matches(self, properties: Mapping[str, str], tag: str | None = None) -> bool:
        """Whether the message with these properties and this tag (``TAGS``) is wanted:
        the filter is TRUE (FALSE and UNKNOWN do not match)."""
        return self._pred(properties, tag) is True


def compile_sql92(text: str) -> Sql92Filter:
    """Parse and compile a filter. Raises `FilterSyntaxError` (an `InvalidRequest`) whose
    message names the problem, the 1-based column and what was found; also when the text
    is over `MAX_SQL92_LENGTH` characters, nests deeper than `MAX_SQL92_DEPTH`, or has an
    IN list over `MAX_SQL92_IN_VALUES` values."""
    if len(text) > MAX_SQL92_LENGTH:
        raise FilterSyntaxError(
            _LANGUAGE,
            f"expression is longer than {MAX_SQL92_LENGTH} characters",
            MAX_SQL92_LENGTH + 1,
        )
    return Sql92Filter(text, _Parser(text).parse())
