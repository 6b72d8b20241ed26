"""The `analytics` pipeline end to end: this tree against an earlier revision, in the same
run (ADR 16: one read per micro-batch; ADR 18: outputs written by Spark's tasks).

Usage: ``python benchmarks/bench_pipeline_analytics.py [--events N] [--runs R]
[--old-rev REV] [--json PATH]``

One `tidemq server` (a separate process, async flush, 127.0.0.1) holds N generated events
(default 300,000; `events.generate_events`, seed 1) on 4 queues. The old code is the code
of `--old-rev` (default: the commit before `analytics_tasks.py` was added, whose driver
collected every result and rejected row and wrote them; `--old-rev` of the commit before
`analytics_frames.py` was added measures the four-query shape of ADR 16), exported with
`git archive` to a temporary directory and put first on the `PYTHONPATH` of its driver
and of Spark's Python workers; the new code is this tree's. Each run is a fresh driver
process (`local[2]`, 2 GiB) that first runs the pipeline untimed over 20,000 events of
another topic (JIT and Python workers warm), then times `run_analytics` over the N events
with a new checkpoint, output and results topic (AvailableNow, micro-batches of 100,000:
the default). Old and new alternate, R runs each (default 3); figures are medians in
input rows/s (N / wall seconds), the ratio the median of per-run ratios new / old. Also
printed: the rows Spark counted as read (four times N for four queries), the CPU seconds
of the timed run (medians): the driver's whole process tree (its Python process, the JVM
that runs the driver and, in local mode, the executors, and Spark's Python workers,
summed over /proc) and the server's, which a busy machine disturbs less than the rates;
the driver's Python process's peak RSS (VmHWM: where collected rows went), CPU steal over
the whole run and the load average.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import peers

REPO = Path(__file__).resolve().parent.parent
TOPIC = "bench-analytics"
WARM_TOPIC = "bench-analytics-warm"
QUEUES = 4
WARM_EVENTS = 20_000
CHILD_TIMEOUT_S = 1800.0


def _old_rev() -> str:
    tasks = "src/tidemq/spark/pipelines/analytics_tasks.py"
    added = subprocess.run(
        ["git", "log", "--diff-filter=A", "--format=%H", "--", tasks],
        cwd=REPO, check=True, capture_output=True, text=True,
    ).stdout.split()  # fmt: skip
    if not added:
        raise SystemExit("analytics_tasks.py is not in the history: give --old-rev")
    return added[-1] + "^"


def _tree_cpu_s(root: int) -> float:
    """CPU seconds of `root` and its descendants, those reaped included (utime, stime,
    cutime, cstime of every live process of the tree, from /proc)."""
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # gone meanwhile
        fields = stat[stat.rindex(")") + 2 :].split()
        pid = int(entry.name)
        parents[pid] = int(fields[1])
        times[pid] = sum(int(f) for f in fields[11:15])
    tree = {root}
    grown = True
    while grown:
        more = {pid for pid, parent in parents.items() if parent in tree} - tree
        tree |= more
        grown = bool(more)
    return sum(times.get(pid, 0) for pid in tree) / os.sysconf("SC_CLK_TCK")


def _peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _export(rev: str, into: Path) -> Path:
    """The `src` tree of `rev` under `into` (git archive: no worktree, no git state)."""
    archive = into / "src.tar"
    with open(archive, "wb") as out:
        subprocess.run(["git", "archive", rev, "src"], cwd=REPO, check=True, stdout=out)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def _child(args: argparse.Namespace) -> None:
    """One driver: a warm-up run, then the timed run; prints a JSON line."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession  # noqa: PLC0415 - in the child only

    import tidemq.spark.pipelines.analytics as pipeline  # noqa: PLC0415

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("bench-analytics")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "2g")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    work = Path(args.work)
    config = pipeline.AnalyticsConfig(
        tumbling_s=60, sliding_s=600, slide_s=60, session_gap_s=300, watermark_s=120
    )

    def run(topic: str, tag: str) -> tuple[float, int]:
        cpu[0], cpu[1] = _tree_cpu_s(os.getpid()), sum(peers.process_cpu(args.server_pid))
        started = time.perf_counter()
        done = pipeline.run_analytics(
            spark,
            bootstrap=args.bootstrap,
            topics=[topic],
            output=work / f"out-{tag}",
            checkpoint=work / f"cp-{tag}",
            results_topic=f"{topic}-{tag}-out",
            name=f"bench-{tag}",
            config=config,
        )
        seconds = time.perf_counter() - started
        cpu[0] = _tree_cpu_s(os.getpid()) - cpu[0]
        cpu[1] = sum(peers.process_cpu(args.server_pid)) - cpu[1]
        queries = getattr(done, "queries", None) or {"all": done.query}
        read = sum(p["numInputRows"] for q in queries.values() for p in q.recentProgress)
        return seconds, read

    cpu = [0.0, 0.0]  # the driver's process tree, the server: of the last run
    try:
        run(WARM_TOPIC, f"warm-{args.shape}")
        seconds, read = run(TOPIC, args.shape)
    finally:
        spark.stop()
    result = {"seconds": seconds, "read": read, "module": pipeline.__file__}
    result.update({"driver_cpu_s": cpu[0], "server_cpu_s": cpu[1]})
    print(json.dumps({**result, "driver_python_peak_rss_mib": _peak_rss_mib()}))


def _run_child(
    shape: str, server: peers.Server, work: Path, old_src: Path | None
) -> dict[str, Any]:
    env = dict(os.environ)
    if old_src is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(old_src), env.get("PYTHONPATH")]))
    argv = [sys.executable, __file__, "--child", "--shape", shape]
    argv += ["--bootstrap", server.address, "--server-pid", str(server.pid), "--work", str(work)]
    out = subprocess.run(
        argv, env=env, check=True, capture_output=True, text=True, timeout=CHILD_TIMEOUT_S
    )
    result: dict[str, Any] = json.loads(out.stdout.strip().splitlines()[-1])
    expected = str(old_src) if old_src is not None else str(REPO / "src")
    assert result["module"].startswith(expected), (shape, result["module"])
    return result


def _rates(values: list[float]) -> str:
    return " / ".join(f"{v:,.0f}" for v in values)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--events", type=int, default=300_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--old-rev")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--shape", help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--server-pid", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--work", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        _child(args)
        return
    from tidemq.spark.pipelines.events import generate_events, produce_events  # noqa: PLC0415

    rev = args.old_rev or _old_rev()
    work = Path(tempfile.mkdtemp(prefix="bench-analytics-"))
    j0 = peers.machine_jiffies()
    runs: dict[str, list[float]] = {"old": [], "new": []}
    read: dict[str, int] = {}
    rss: dict[str, list[float]] = {"old": [], "new": []}
    cpu_driver: dict[str, list[float]] = {"old": [], "new": []}
    cpu_server: dict[str, list[float]] = {"old": [], "new": []}
    try:
        old_src = _export(rev, work)
        with peers.start_tidemq("async") as server:
            events = generate_events(args.events, users=5000, items=2000, seed=1)
            produce_events(server.address, TOPIC, events, queues=QUEUES)
            warm = generate_events(WARM_EVENTS, users=500, items=200, seed=2)
            produce_events(server.address, WARM_TOPIC, warm, queues=QUEUES)
            for i in range(args.runs):
                for shape in ("old", "new"):
                    run_dir = work / f"{shape}-{i}"
                    src = old_src if shape == "old" else None
                    result = _run_child(f"{shape}{i}", server, run_dir, src)
                    runs[shape].append(args.events / result["seconds"])
                    read[shape] = result["read"]
                    rss[shape].append(result["driver_python_peak_rss_mib"])
                    cpu_driver[shape].append(result["driver_cpu_s"])
                    cpu_server[shape].append(result["server_cpu_s"])
                    shutil.rmtree(run_dir, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    j = peers.machine_jiffies() - j0
    steal = 100 * j.steal / j.total if j.total else 0.0
    ratios = [new / old for old, new in zip(runs["old"], runs["new"], strict=True)]
    results: dict[str, Any] = {
        "events": args.events,
        "old_rev": rev,
        "old_rows_s": statistics.median(runs["old"]),
        "new_rows_s": statistics.median(runs["new"]),
        "old_rows_s_all": runs["old"],
        "new_rows_s_all": runs["new"],
        "ratio": statistics.median(ratios),
        "rows_read_old": read["old"],
        "rows_read_new": read["new"],
        "driver_cpu_s_old": statistics.median(cpu_driver["old"]),
        "driver_cpu_s_new": statistics.median(cpu_driver["new"]),
        "server_cpu_s_old": statistics.median(cpu_server["old"]),
        "server_cpu_s_new": statistics.median(cpu_server["new"]),
        "driver_cpu_s_old_all": cpu_driver["old"],
        "driver_cpu_s_new_all": cpu_driver["new"],
        "driver_python_peak_rss_mib_old": statistics.median(rss["old"]),
        "driver_python_peak_rss_mib_new": statistics.median(rss["new"]),
        "steal_pct": steal,
    }
    print(
        f"analytics over {args.events:,} events: old ({rev}) {results['old_rows_s']:,.0f} "
        f"rows/s ({read['old']:,} rows read, driver Python peak "
        f"{results['driver_python_peak_rss_mib_old']:.0f} MiB), new "
        f"{results['new_rows_s']:,.0f} rows/s ({read['new']:,} read, "
        f"{results['driver_python_peak_rss_mib_new']:.0f} MiB), {results['ratio']:.2f}x; "
        f"median of {args.runs}; runs old {_rates(runs['old'])}, new {_rates(runs['new'])}; "
        f"CPU-s of the driver's processes old {results['driver_cpu_s_old']:.1f}, new "
        f"{results['driver_cpu_s_new']:.1f}, of the server old "
        f"{results['server_cpu_s_old']:.1f}, new {results['server_cpu_s_new']:.1f}; "
        f"CPU steal {steal:.1f}%, load average {os.getloadavg()[0]:.2f}"
    )
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
