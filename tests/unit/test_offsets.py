"""The one offset-reset rule shared by the broker and the admin client."""

from __future__ import annotations

import pytest

from tidemq.core.errors import InvalidRequest
from tidemq.core.offsets import reset_target


@pytest.mark.parametrize(
    ("to", "value", "committed", "at", "expected"),
    [
        ("earliest", 0, 7, None, 5),
        ("latest", 0, 7, None, 20),
        ("timestamp", 123, None, 12, 12),
        ("timestamp", 123, None, None, 20),  # nothing stored since: the end
        ("offset", 9, None, None, 9),
        ("offset", 99, None, None, 20),  # clamped to the readable range
        ("offset", 1, None, None, 5),
        ("shift", -3, 10, None, 7),
        ("shift", 2, None, None, 7),  # never committed: shifts from the earliest
    ],
)
def test_reset_target_per_rule(
    to: str, value: int, committed: int | None, at: int | None, expected: int
) -> None:
    got = reset_target(
        to, value, min_offset=5, max_offset=20, committed=committed, offset_for_time=at
    )
    assert got == expected


def test_unknown_reset_target_is_refused_by_name() -> None:
    with pytest.raises(InvalidRequest, match="'sideways'"):
        reset_target(
            "sideways", 0, min_offset=0, max_offset=1, committed=None, offset_for_time=None
        )
