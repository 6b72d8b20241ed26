"""Shared test options: `--seed N` replays one simulation seed; TIDEMQ_SOAK=1 runs longer."""

from __future__ import annotations

import os

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


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Under pytest-xdist (`make test` runs two workers) every Spark test goes to the same
    # worker: one JVM and one SparkSession for all of them, not one per worker.
    for item in items:
        if item.get_closest_marker("spark") is not None:
            item.add_marker(pytest.mark.xdist_group("spark"))
