"""Failed logins per address (issue 16): a burst past the limit is refused until the
oldest failure leaves the window; other addresses are not affected; memory is bounded."""

from __future__ import annotations

import pytest

from tidemq.net.login_limit import LoginLimit
from tidemq.testing.clock import ManualClock


def test_refused_after_the_limit_until_the_window_moves_on() -> None:
    clock = ManualClock()
    limit = LoginLimit(clock, max_failures=3, window_ms=60_000)
    for _ in range(3):
        assert limit.refused_for_s("10.0.0.1") is None
        limit.failed("10.0.0.1")
        clock.advance(1_000)
    # 3 failures at t=0, 1, 2 s; now t=3 s: refused until the first leaves (t=60 s)
    assert limit.refused_for_s("10.0.0.1") == pytest.approx(57.0)
    assert limit.refused_for_s("10.0.0.2") is None
    clock.advance(57_000)
    assert limit.refused_for_s("10.0.0.1") is None
    limit.failed("10.0.0.1")  # failures at 1, 2, 60 s: the limit again, until t=61 s
    assert limit.refused_for_s("10.0.0.1") == pytest.approx(1.0)
    clock.advance(120_000)
    assert limit.refused_for_s("10.0.0.1") is None
    assert limit.tracked() == 0  # expired failures are forgotten


def test_memory_is_bounded_by_forgetting_the_oldest_address() -> None:
    clock = ManualClock()
    limit = LoginLimit(clock, max_failures=1, window_ms=60_000, max_addresses=2)
    for address in ("a", "b", "c"):
        limit.failed(address)
        clock.advance(1)
    assert limit.tracked() == 2
    assert limit.refused_for_s("a") is None  # forgotten
    assert limit.refused_for_s("c") is not None
