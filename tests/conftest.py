"""Shared test options: `--seed N` replays one simulation seed; TIDEMQ_SOAK=1 runs longer."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pytest

# Servers that the tests start as processes (`tidemq server`, `tidemq broker`) inherit
# this: their HTTP listener takes any free port, not 8085, so that parallel tests never
# collide on it. A test that wants a fixed one passes --http-port.
os.environ.setdefault("TIDEMQ_HTTP__PORT", "0")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--seed",
        action="store",
        type=int,
        default=None,
        help="replay a simulation with this seed (printed when a simulation fails)",
    )


@pytest.fixture
def replay_seed(request: pytest.FixtureRequest) -> int | None:
    seed = request.config.getoption("--seed")
    return None if seed is None else int(seed)


@pytest.fixture
def soak() -> bool:
    """True under `make soak`: simulations and kill loops run many more cycles."""
    return os.environ.get("TIDEMQ_SOAK") == "1"


@pytest.hookimpl(tryfirst=True)  # before xdist's own, which reads the group marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Under pytest-xdist (`make test` runs two workers) every Spark test goes to the same
    # worker: one JVM and one SparkSession for all of them, not one per worker.
    for item in items:
        if item.get_closest_marker("spark") is not None:
            item.add_marker(pytest.mark.xdist_group("spark"))


def pytest_xdist_node_collection_finished(node: Any, ids: Sequence[str]) -> None:
    """Under `--dist loadgroup`, xdist marks a grouped test's id with `@group`; without it
    (a pytest that this pytest-xdist does not follow) the Spark tests would run on both
    workers, two JVMs at once on two cores, far past make test's budget."""
    if node.config.getvalue("dist") != "loadgroup":
        return
    loose = [i for i in ids if i.startswith("tests/spark/test_") and not i.endswith("@spark")]
    if loose:
        raise pytest.UsageError(
            f"pytest-xdist's loadgroup did not group {loose[0]} ({len(loose)} in all): this "
            "pytest and pytest-xdist do not work together (see pyproject.toml's pin)"
        )
