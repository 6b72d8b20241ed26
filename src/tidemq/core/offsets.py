"""Where a consumer-group offset reset puts a queue. One rule, used by the broker (for the
queues it hosts) and by the admin client (for queues on other brokers)."""

from __future__ import annotations

from typing import Final

from tidemq.core.errors import InvalidRequest

__all__ = ["RESET_TARGETS", "check_reset_target", "reset_target"]

RESET_TARGETS: Final = ("earliest", "latest", "timestamp", "offset", "shift")


def check_reset_target(to: str) -> None:
    if to not in RESET_TARGETS:
        raise InvalidRequest(f"reset target must be one of {', '.join(RESET_TARGETS)}, got {to!r}")


def reset_target(
    to: str,
    value: int,
    *,
    min_offset: int,
    max_offset: int,
    committed: int | None,
    offset_for_time: int | None,
) -> int:
    """The new committed offset of one queue, clamped to its readable range.

    `to`: "earliest", "latest", "timestamp" (the first offset stored at or after `value`
    ms, given as `offset_for_time`), "offset" (`value`) or "shift" (the committed offset,
    or the earliest when none, moved by `value`)."""
    check_reset_target(to)
    if to == "earliest":
        target = min_offset
    elif to == "latest":
        target = max_offset
    elif to == "timestamp":
        target = max_offset if offset_for_time is None else offset_for_time
    elif to == "offset":
        target = value
    else:
        target = (min_offset if committed is None else committed) + value
    return min(max(target, min_offset), max_offset)
