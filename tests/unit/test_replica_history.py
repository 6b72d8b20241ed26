"""The replica group history checker (`tests/support/replica_history.py`) finds each kind
of violation it names, and nothing in a clean history: a checker that missed them would
let the partition test pass over lost or duplicated messages."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from tests.support.replica_history import Ack, History, QueueLog, Read, violations


def _clean() -> History:
    log: QueueLog = [(0, b"a"), (1, b"b"), (2, b"c")]
    return History(
        attempted={b"a", b"b", b"c", b"d"},  # d: failed, and not stored: allowed
        acked=[Ack(0, 0, b"a"), Ack(0, 1, b"b"), Ack(0, 2, b"c")],
        reads=[Read(0, 0, b"a"), Read(0, 1, b"b")],
        replicas={"m0": {0: list(log)}, "m1": {0: list(log)}, "m2": {0: list(log)}},
        leaders=[(1, "m0"), (2, "m1"), (3, "m0")],
        committed=[10, 10, 30],
        group_reads=[Read(0, 0, b"a"), Read(0, 1, b"b"), Read(0, 1, b"b")],  # b read again
        group_offsets=[{}, {0: 1}, {0: 1}, {0: 2}],
        reads_complete=False,
    )


def test_a_clean_history_has_no_violation() -> None:
    assert violations(_clean()) == []


def _append_everywhere(h: History, entry: tuple[int, bytes]) -> None:
    for logs in h.replicas.values():
        logs[0].append(entry)


def _swap_acks(h: History) -> None:
    h.acked[1], h.acked[2] = h.acked[2], h.acked[1]


def _complete_reads(h: History) -> None:
    h.reads_complete = True  # c was acknowledged, and read by nobody


#: Each kind of violation, and how to break a clean history with it.
BREAK: dict[str, Callable[[History], None]] = {
    "lost": lambda h: h.acked.append(Ack(0, 3, b"d")),
    "moved": lambda h: h.acked.__setitem__(2, Ack(0, 5, b"c")),
    "out of order": _swap_acks,
    "duplicated": lambda h: _append_everywhere(h, (3, b"c")),
    "never sent": lambda h: _append_everywhere(h, (3, b"zz")),
    "replicas differ": lambda h: h.replicas["m2"][0].__setitem__(1, (1, b"x")),
    "read, later lost": lambda h: h.reads.append(Read(0, 2, b"other")),
    # Read again from the start: the consumer's offset went back.
    "consumer offsets jumped": lambda h: h.reads.append(Read(0, 0, b"a")),
    "two leaders in one epoch": lambda h: h.leaders.append((2, "m2")),
    "committed position went back": lambda h: h.committed.append(20),
    "group member read, later lost": lambda h: h.group_reads.append(Read(0, 2, b"other")),
    "group offsets went back": lambda h: h.group_offsets.append({0: 1}),
    "acknowledged, never read": _complete_reads,
}


@pytest.mark.parametrize("kind", sorted(BREAK))
def test_each_kind_of_violation_is_found(kind: str) -> None:
    history = _clean()
    BREAK[kind](history)
    found = violations(history)
    assert found
    assert any(line.startswith(f"{kind}: ") for line in found), found
