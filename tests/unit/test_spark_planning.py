"""Input partitions of the Spark source: one per queue range, split for minPartitions. No
JVM."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from tidemq.spark.planning import OffsetRange, plan_partitions, ranges_between


def test_ranges_between_skips_new_and_empty_queues() -> None:
    start = {("t", 0): 5, ("t", 1): 9, ("t", 2): 4}
    end = {("t", 0): 10, ("t", 1): 9, ("t", 2): 2, ("u", 0): 7}
    assert ranges_between(start, end) == [OffsetRange("t", 0, 5, 10)]


def test_one_partition_per_range_by_default() -> None:
    ranges = [OffsetRange("t", q, 0, 150_000 + q * 20_000) for q in range(4)]
    assert plan_partitions(ranges, None) == ranges
    small = [OffsetRange("t", 0, 0, 90_000), OffsetRange("t", 1, 5, 6)]
    assert plan_partitions(small, None) == small  # below the split floor
    skewed = [OffsetRange("t", 0, 0, 1_000_000), OffsetRange("t", 1, 5, 6)]
    assert plan_partitions(skewed, 2) == skewed
    assert plan_partitions(skewed, 1) == skewed


def test_a_queue_holding_most_of_the_data_is_cut_by_default() -> None:
    ranges = [OffsetRange("t", 0, 0, 4_000_000)] + [
        OffsetRange("t", q, 0, 100_000) for q in range(1, 4)
    ]
    planned = plan_partitions(ranges, None)
    # The mean is 1,075,000 offsets: the big range in 4 pieces, the others whole.
    assert [p.size for p in planned if p.queue == 0] == [1_000_000] * 4
    assert [p for p in planned if p.queue != 0] == ranges[1:]
    assert plan_partitions(ranges, None) == planned  # deterministic


def test_min_partitions_splits_large_ranges() -> None:
    ranges = [OffsetRange("t", 0, 0, 900), OffsetRange("t", 1, 0, 100)]
    planned = plan_partitions(ranges, 10)
    assert len(planned) == 10
    assert [p for p in planned if p.queue == 1] == [OffsetRange("t", 1, 0, 100)]
    assert {p.size for p in planned if p.queue == 0} == {100}


@given(
    st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 500_000)), min_size=1, max_size=8),
    st.one_of(st.none(), st.integers(1, 64)),
)
def test_split_covers_each_range_exactly(
    spans: list[tuple[int, int]], min_partitions: int | None
) -> None:
    ranges = [OffsetRange("t", q, s, s + n) for q, (s, n) in enumerate(spans)]
    planned = plan_partitions(ranges, min_partitions)
    assert plan_partitions(ranges, min_partitions) == planned  # deterministic
    assert all(p.size > 0 for p in planned)
    live = [r for r in ranges if r.size > 0]
    total = sum(r.size for r in live)
    if min_partitions is not None:
        assert len(planned) >= min(min_partitions, total)
    elif live:
        mean = max(total / len(live), 100_000)
        assert all(p.size <= 2 * mean for p in planned)  # no task far above the mean
    for r in live:
        pieces = [p for p in planned if p.queue == r.queue]
        assert pieces[0].start == r.start
        assert pieces[-1].end == r.end
        assert all(a.end == b.start for a, b in itertools.pairwise(pieces))
        sizes = [p.size for p in pieces]
        assert max(sizes) - min(sizes) <= 1


SPARK = Path(__file__).resolve().parents[2] / "src" / "tidemq" / "spark"


def _imported(tree: ast.AST) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_only_the_source_and_sink_modules_import_pyspark() -> None:
    # Offsets, planning, options, decoding and I/O are plain Python: their unit tests run
    # without a JVM, and executors import them without Spark's planner classes. The
    # source and the sink are the adapters to Spark's Data Source API.
    for path in sorted(SPARK.glob("*.py")):
        if path.name in ("source.py", "sink.py", "__init__.py"):
            continue
        assert "pyspark" not in _imported(ast.parse(path.read_text())), path.name


def test_importing_the_package_imports_neither_pyspark_nor_pyarrow() -> None:
    tree = ast.parse((SPARK / "__init__.py").read_text())
    top_level = ast.Module(
        body=[n for n in tree.body if not isinstance(n, ast.FunctionDef)], type_ignores=[]
    )
    assert not _imported(top_level) & {"pyspark", "pyarrow"}
