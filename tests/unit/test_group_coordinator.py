"""Group -> coordinator by rendezvous hashing: stable, spread, minimal movement."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

from tidemq.cluster.group_coordinator import coordinator_for, coordinator_name, weight

GROUPS = [f"group-{i}" for i in range(3_000)]
BROKERS = {f"broker-{c}": f"10.0.0.{i}:10911" for i, c in enumerate("abcdef")}


def _assign(names: list[str]) -> dict[str, str | None]:
    return {g: coordinator_name(g, names) for g in GROUPS}


def test_no_broker_no_coordinator() -> None:
    assert coordinator_name("g", []) is None
    assert coordinator_for("g", {}) == ""


def test_one_broker_coordinates_every_group() -> None:
    assert {coordinator_for(g, {"only": "h:1"}) for g in GROUPS} == {"h:1"}


def test_the_answer_is_the_address_of_the_chosen_name() -> None:
    for g in GROUPS[:50]:
        name = coordinator_name(g, BROKERS)
        assert name is not None
        assert coordinator_for(g, BROKERS) == BROKERS[name]


def test_order_of_the_broker_list_does_not_matter() -> None:
    names = list(BROKERS)
    assert _assign(names) == _assign(list(reversed(names)))


def test_weights_are_fixed_across_processes() -> None:
    """BLAKE2b, not the salted hash(): another interpreter (another PYTHONHASHSEED)
    computes the same weights and so the same coordinators."""
    code = (
        "from tidemq.cluster.group_coordinator import weight, coordinator_name;"
        "print(weight('broker-a', 'billing'));"
        "print(coordinator_name('billing', ['broker-a', 'broker-b', 'broker-c']))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={"PYTHONHASHSEED": "12345"},
        timeout=60,
    ).stdout.split()
    assert out == [
        str(weight("broker-a", "billing")),
        str(coordinator_name("billing", ["broker-a", "broker-b", "broker-c"])),
    ]
    # Pinned: a change of the hash would move every group of every cluster on upgrade.
    assert weight("broker-a", "billing") == 5339375287925946555
    assert coordinator_name("billing", ["broker-a", "broker-b", "broker-c"]) == "broker-c"


def test_names_are_separated_in_the_hash() -> None:
    assert weight("ab", "c") != weight("a", "bc")


def test_groups_spread_over_the_brokers() -> None:
    """6 brokers, 3,000 groups: each gets 500 expected; the binomial standard deviation
    is about 20, so 400..600 is five deviations wide."""
    counts = Counter(_assign(list(BROKERS)).values())
    assert set(counts) == set(BROKERS)
    assert all(400 <= n <= 600 for n in counts.values()), counts


def test_a_new_broker_takes_only_the_groups_that_now_hash_to_it() -> None:
    before = _assign(["broker-a", "broker-b", "broker-c"])
    after = _assign(["broker-a", "broker-b", "broker-c", "broker-d"])
    moved = {g for g in GROUPS if before[g] != after[g]}
    assert moved, "the new broker takes some groups"
    assert all(after[g] == "broker-d" for g in moved)
    # About a quarter of the groups (750 expected) move, no more.
    assert 600 <= len(moved) <= 900, len(moved)


def test_a_broker_that_leaves_gives_up_only_its_own_groups() -> None:
    before = _assign(["broker-a", "broker-b", "broker-c", "broker-d"])
    after = _assign(["broker-a", "broker-c", "broker-d"])
    for g in GROUPS:
        if before[g] != "broker-b":
            assert after[g] == before[g]
        else:
            assert after[g] in {"broker-a", "broker-c", "broker-d"}
    # And when it returns, its groups come back to it.
    assert _assign(["broker-a", "broker-b", "broker-c", "broker-d"]) == before


def test_a_group_goes_to_the_next_highest_weight_when_its_broker_leaves() -> None:
    names = list(BROKERS)
    for g in GROUPS[:100]:
        ranked = sorted(names, key=lambda n: weight(n, g), reverse=True)
        assert coordinator_name(g, names) == ranked[0]
        assert coordinator_name(g, ranked[1:]) == ranked[1]
