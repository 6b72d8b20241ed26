"""`RetryPolicy`: the push consumer's backoff between delivery attempts."""

from __future__ import annotations

import math

import pytest

from tidemq import RetryPolicy, aio


def test_default_is_rocketmqs_schedule_then_two_hours() -> None:
    p = RetryPolicy.default()
    minutes = [p.delay(a) / 60 for a in range(1, 17)]
    assert minutes == [1 / 6, 1 / 2, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 20, 30, 60, 120]
    assert p.delay(17) == p.delay(1000) == 7200.0
    assert repr(p) == "RetryPolicy.default()"
    assert p == RetryPolicy.default()
    assert aio.RetryPolicy is RetryPolicy


def test_exponential() -> None:
    p = RetryPolicy.exponential()
    assert [p.delay(a) for a in range(1, 6)] == [5.0, 10.0, 20.0, 40.0, 80.0]
    assert p.delay(11) == 5.0 * 2**10
    assert p.delay(12) == 7200.0  # 10240 capped
    assert p.delay(10**6) == 7200.0  # no overflow for huge attempts
    q = RetryPolicy.exponential(initial=0.5, multiplier=3.0, maximum=10.0)
    assert [q.delay(a) for a in range(1, 5)] == [0.5, 1.5, 4.5, 10.0]
    flat = RetryPolicy.exponential(initial=2.0, multiplier=1.0, maximum=2.0)
    assert flat.delay(1) == flat.delay(50) == 2.0
    assert repr(q) == "RetryPolicy.exponential(initial=0.5, multiplier=3, maximum=10)"


def test_fixed_and_schedule() -> None:
    f = RetryPolicy.fixed(1.5)
    assert f.delay(1) == f.delay(99) == 1.5
    assert RetryPolicy.fixed(0).delay(3) == 0.0
    s = RetryPolicy.schedule([1, 2.5, 4])
    assert [s.delay(a) for a in range(1, 6)] == [1.0, 2.5, 4.0, 4.0, 4.0]
    assert RetryPolicy.schedule(x for x in (3.0,)).delay(2) == 3.0  # any iterable
    assert repr(f) == "RetryPolicy.fixed(1.5)"
    assert repr(s) == "RetryPolicy.schedule([1, 2.5, 4])"
    assert s == RetryPolicy.schedule((1.0, 2.5, 4.0))
    assert hash(s) == hash(RetryPolicy.schedule([1.0, 2.5, 4.0]))


@pytest.mark.parametrize(
    ("make", "argument"),
    [
        (lambda: RetryPolicy.fixed(-1), "seconds"),
        (lambda: RetryPolicy.fixed(math.nan), "seconds"),
        (lambda: RetryPolicy.fixed(43_201), "seconds"),  # beyond the broker's 12 h
        (lambda: RetryPolicy.schedule([]), "delays"),
        (lambda: RetryPolicy.schedule([1, -2]), r"delays\[1\]"),
        (lambda: RetryPolicy.exponential(initial=0), "initial"),
        (lambda: RetryPolicy.exponential(initial=-1), "initial"),
        (lambda: RetryPolicy.exponential(multiplier=0.5), "multiplier"),
        (lambda: RetryPolicy.exponential(multiplier=math.inf), "multiplier"),
        (lambda: RetryPolicy.exponential(initial=10, maximum=5), "maximum"),
        (lambda: RetryPolicy.exponential(maximum=10**6), "maximum"),
        (lambda: RetryPolicy.default().delay(0), "attempt"),
        (lambda: RetryPolicy.exponential().delay(-3), "attempt"),
    ],
)
def test_bad_arguments_raise_value_error_naming_them(make: object, argument: str) -> None:
    assert callable(make)
    with pytest.raises(ValueError, match=argument):
        make()


def test_wrong_types_raise_type_error() -> None:
    with pytest.raises(TypeError, match="seconds"):
        RetryPolicy.fixed("5")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="delays"):
        RetryPolicy.schedule("123")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="delays"):
        RetryPolicy.schedule(5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="attempt"):
        RetryPolicy.default().delay(1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="seconds"):
        RetryPolicy.fixed(True)


def test_policies_are_immutable() -> None:
    p = RetryPolicy.fixed(1.0)
    with pytest.raises(AttributeError):
        p.delays = (2.0,)  # type: ignore[misc]
