"""Random filters, printed to text and compiled, evaluate as a direct reference evaluator
of the same tree says, on random properties and tags.

The tree is this file's own; the printer varies keyword case, whitespace, comments and
redundant parentheses (and omits the ones precedence makes unnecessary). The reference
evaluator is written from docs/design/filters.md, with exact decimals: three-valued logic,
a property compared with a number converted to a number (UNKNOWN if it is not one), etc.
Comparing both ``F`` and ``NOT (F)`` checks the full three-valued result, not just TRUE.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from decimal import Decimal
from typing import TypeAlias

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tidemq.core.filters import compile_sql92

# ------------------------------------------------------------------ the tree


@dataclass(frozen=True)
class Prop:
    name: str


@dataclass(frozen=True)
class Lit:
    kind: str  # "str" | "num" | "bool"
    text: str  # as printed: a numeric literal, TRUE/FALSE, or the string's value


Operand: TypeAlias = Prop | Lit


@dataclass(frozen=True)
class Cmp:
    op: str
    left: Operand
    right: Operand


@dataclass(frozen=True)
class Between:
    value: Operand
    low: Operand
    high: Operand
    negated: bool


@dataclass(frozen=True)
class In:
    prop: Prop
    values: tuple[str, ...]
    negated: bool


@dataclass(frozen=True)
class IsNull:
    operand: Operand
    negated: bool


@dataclass(frozen=True)
class StrTest:
    kind: str
    prop: Prop
    pattern: str
    negated: bool


@dataclass(frozen=True)
class Bare:
    operand: Prop | Lit  # a property, or a TRUE/FALSE literal


@dataclass(frozen=True)
class Not:
    term: Node


@dataclass(frozen=True)
class And:
    terms: tuple[Node, ...]


@dataclass(frozen=True)
class Or:
    terms: tuple[Node, ...]


Node: TypeAlias = Cmp | Between | In | IsNull | StrTest | Bare | Not | And | Or

# ------------------------------------------------------------------ strategies

NAMES = ["a", "b", "c.d", "_x", "$y", "TAGS"]
# values are exact in binary floating point, so the compiled filter's floats and the
# reference's decimals agree
NUMBERS = ["0", "1", "2", "7", "2.5", ".5", "5.", "1e2", "1.5E1", "007", "100", "0.25"]
STRINGS = ["", "x", "it's", "1", "2.5", "abc", "true", "a b", "O''Neil", "TagA", "b"]
VALUES = [
    *["1", "2", "-3", "2.5", "100", "1e2", "0.5", ".5", "5.", "+4", "007", "-0", "15"],
    *["abc", "", "true", "FALSE", "yes", " 1", "1 ", "0x10", "NaN", "Infinity", "x"],
    *["it's", "a b", "TagA", "abcx", "xabc", "b"],
]

props = st.sampled_from(NAMES).map(Prop)
numbers = st.builds(
    lambda sign, text: Lit("num", sign + text),
    st.sampled_from(["", "-", "- ", "+"]),
    st.sampled_from(NUMBERS),
)
strings = st.sampled_from(STRINGS).map(lambda s: Lit("str", s))
booleans = st.sampled_from(["TRUE", "FALSE", "true", "False"]).map(lambda s: Lit("bool", s))
literals = numbers | strings | booleans
numeric_operands = props | numbers


@st.composite
def comparisons(draw: st.DrawFn) -> Cmp:
    op = draw(st.sampled_from(["=", "<>", "!=", "<", "<=", ">", ">="]))
    if op in ("<", "<=", ">", ">="):
        return Cmp(op, draw(numeric_operands), draw(numeric_operands))
    kind = draw(st.sampled_from(["prop-prop", "prop-lit", "lit-prop", "lit-lit"]))
    if kind == "prop-prop":
        return Cmp(op, draw(props), draw(props))
    if kind == "lit-lit":
        literal = draw(st.sampled_from([numbers, strings, booleans]))
        return Cmp(op, draw(literal), draw(literal))
    prop, lit = draw(props), draw(literals)
    return Cmp(op, prop, lit) if kind == "prop-lit" else Cmp(op, lit, prop)


@st.composite
def betweens(draw: st.DrawFn) -> Between:
    low, high = draw(numeric_operands), draw(numeric_operands)
    if isinstance(low, Lit) and isinstance(high, Lit) and number(low.text) > number(high.text):
        low, high = high, low  # reversed constant bounds are a syntax error
    return Between(draw(numeric_operands), low, high, draw(st.booleans()))


predicates = st.one_of(
    comparisons(),
    betweens(),
    st.builds(
        In,
        props,
        st.lists(st.sampled_from(STRINGS), min_size=1, max_size=4).map(tuple),
        st.booleans(),
    ),
    st.builds(IsNull, props | literals, st.booleans()),
    st.builds(
        StrTest,
        st.sampled_from(["CONTAINS", "STARTSWITH", "ENDSWITH"]),
        props,
        st.sampled_from(STRINGS),
        st.booleans(),
    ),
    st.builds(Bare, props | booleans),
)


def _extend(children: st.SearchStrategy[Node]) -> st.SearchStrategy[Node]:
    many = st.lists(children, min_size=2, max_size=3).map(tuple)
    return st.one_of(st.builds(Not, children), many.map(And), many.map(Or))


filters = st.recursive(predicates, _extend, max_leaves=10)
properties = st.dictionaries(st.sampled_from(NAMES), st.sampled_from(VALUES), max_size=6)
tags = st.none() | st.sampled_from(VALUES)

# ------------------------------------------------------------------ the printer

PRECEDENCE = {Or: 1, And: 2, Not: 3}  # predicates: 4


class Printer:
    def __init__(self, rng: random.Random) -> None:
        self.rng = rng

    def kw(self, word: str) -> str:
        choice = self.rng.randrange(3)
        return word if choice == 0 else word.lower() if choice == 1 else word.capitalize()

    def space(self) -> str:
        choice = self.rng.randrange(12)
        if choice < 8:
            return " "
        return ["  ", "\t", "\n", " /* c */ "][choice - 8]

    def join(self, *parts: str) -> str:
        return self.space().join(parts)

    def operand(self, operand: Operand) -> str:
        if isinstance(operand, Prop):
            return operand.name
        if operand.kind == "str":
            return "'" + operand.text.replace("'", "''") + "'"
        if operand.kind == "bool":
            return self.kw(operand.text.upper())
        return operand.text

    def node(self, node: Node, parent: int = 0) -> str:
        precedence = PRECEDENCE.get(type(node), 4)
        text = self.bare(node)
        if precedence < parent or self.rng.randrange(8) == 0:
            text = "(" + self.space() + text + self.space() + ")"
        return text

    def bare(self, node: Node) -> str:  # noqa: PLR0911
        match node:
            case Or(terms):
                return self.join(*_between(self.kw("OR"), [self.node(t, 2) for t in terms]))
            case And(terms):
                return self.join(*_between(self.kw("AND"), [self.node(t, 3) for t in terms]))
            case Not(term):
                return self.join(self.kw("NOT"), self.node(term, 3))
            case Cmp(op, left, right):
                return self.join(self.operand(left), op, self.operand(right))
            case Between(value, low, high, negated):
                words = [self.kw("NOT")] if negated else []
                return self.join(
                    self.operand(value),
                    *words,
                    self.kw("BETWEEN"),
                    self.operand(low),
                    self.kw("AND"),
                    self.operand(high),
                )
            case In(prop, values, negated):
                words = [self.kw("NOT")] if negated else []
                items = ("," + self.space()).join(self.operand(Lit("str", v)) for v in values)
                return self.join(prop.name, *words, self.kw("IN"), "(" + items + ")")
            case IsNull(operand, negated):
                words = [self.kw("NOT")] if negated else []
                return self.join(self.operand(operand), self.kw("IS"), *words, self.kw("NULL"))
            case StrTest(kind, prop, pattern, negated):
                words = [self.kw("NOT")] if negated else []
                literal = self.operand(Lit("str", pattern))
                return self.join(prop.name, *words, self.kw(kind), literal)
            case Bare(operand):
                return self.operand(operand)
        raise AssertionError(node)


def _between(separator: str, items: list[str]) -> list[str]:
    out = [items[0]]
    for item in items[1:]:
        out += [separator, item]
    return out


# ------------------------------------------------------------------ the reference evaluator

NUMERIC = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)
Value: TypeAlias = str | Decimal | bool


def number(text: str) -> Decimal:
    return Decimal(text.replace(" ", ""))


Context: TypeAlias = tuple[dict[str, str], str | None]  # (properties, tag)


def raw(operand: Operand, ctx: Context) -> str | None:
    assert isinstance(operand, Prop)
    props, tag = ctx
    return tag if operand.name == "TAGS" else props.get(operand.name)


def literal(operand: Lit) -> Value:
    if operand.kind == "num":
        return number(operand.text)
    if operand.kind == "bool":
        return operand.text.upper() == "TRUE"
    return operand.text


def value(operand: Operand, mode: str, ctx: Context) -> Value | None:
    if isinstance(operand, Lit):
        return literal(operand)
    text = raw(operand, ctx)
    if text is None or mode == "str":
        return text
    if mode == "num":
        return Decimal(text) if NUMERIC.fullmatch(text) else None
    return {"true": True, "false": False}.get(text.lower())


def compare(op: str, a: Value, b: Value) -> bool:
    if op == "=":
        return a == b
    if op in ("<>", "!="):
        return a != b
    assert isinstance(a, Decimal)
    assert isinstance(b, Decimal)
    return {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]


def cmp3(op: str, left: Operand, right: Operand, mode: str, ctx: Context) -> bool | None:
    a, b = value(left, mode, ctx), value(right, mode, ctx)
    return None if a is None or b is None else compare(op, a, b)


def and3(results: list[bool | None]) -> bool | None:
    if False in results:
        return False
    return None if None in results else True


def or3(results: list[bool | None]) -> bool | None:
    if True in results:
        return True
    return None if None in results else False


def evaluate(node: Node, ctx: Context) -> bool | None:  # noqa: PLR0911
    match node:
        case Or(terms):
            return or3([evaluate(x, ctx) for x in terms])
        case And(terms):
            return and3([evaluate(x, ctx) for x in terms])
        case Not(term):
            r = evaluate(term, ctx)
            return None if r is None else not r
        case Cmp(op, left, right):
            kinds = {o.kind for o in (left, right) if isinstance(o, Lit)}
            mode = "num" if op in ("<", "<=", ">", ">=") else kinds.pop() if kinds else "str"
            return cmp3(op, left, right, mode, ctx)
        case Between(v, low, high, negated):
            if negated:
                return or3([cmp3("<", v, low, "num", ctx), cmp3(">", v, high, "num", ctx)])
            return and3([cmp3(">=", v, low, "num", ctx), cmp3("<=", v, high, "num", ctx)])
        case In(prop, values, negated):
            s = raw(prop, ctx)
            return None if s is None else (s in values) != negated
        case IsNull(operand, negated):
            missing = isinstance(operand, Prop) and raw(operand, ctx) is None
            return missing != negated
        case StrTest(kind, prop, pattern, negated):
            if not pattern:
                return False
            s = raw(prop, ctx)
            if s is None:
                return None
            found = {
                "CONTAINS": pattern in s,
                "STARTSWITH": s.startswith(pattern),
                "ENDSWITH": s.endswith(pattern),
            }[kind]
            return found != negated
        case Bare(operand):
            result = value(operand, "bool", ctx)
            assert result is None or isinstance(result, bool)
            return result
    raise AssertionError(node)


# ------------------------------------------------------------------ the property


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tree=filters,
    style=st.randoms(use_true_random=False),
    cases=st.lists(st.tuples(properties, tags), min_size=1, max_size=5),
)
def test_printed_filters_evaluate_as_the_reference_does(
    tree: Node, style: random.Random, cases: list[tuple[dict[str, str], str | None]]
) -> None:
    text = Printer(style).node(tree)
    compiled = compile_sql92(text)
    negation = compile_sql92(f"NOT ({text})")
    assert compiled.text == text
    for props, tag in cases:
        expected = evaluate(tree, (props, tag))
        assert compiled.matches(props, tag) is (expected is True), (text, props, tag, expected)
        assert negation.matches(props, tag) is (expected is False), (text, props, tag, expected)
