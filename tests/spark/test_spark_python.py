"""The data source works from a script run with the virtual environment's Python, not
activated: `.venv/bin/python job.py`, PYSPARK_PYTHON unset, no venv on PATH.

PySpark then runs its Python workers with the first `python3` on PATH, which has no
tidemq ("No module named 'tidemq'"). `tidemq.spark.register` makes local-mode workers run
the driver's interpreter instead. Here the `python3` on PATH is a stand-in for such a
Python (this interpreter's base, without site-packages): a worker started with it could
not import tidemq. The script builds its own local session, registers tidemq and reads a
batch from a `tidemq server` process.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.support.server_process import server_process

from tidemq import Admin, Producer

pytestmark = [pytest.mark.spark, pytest.mark.timeout(300)]

SERVER = [sys.executable, "-m", "tidemq.cli.main", "server"]
_SERVING = re.compile(r"^serving on (\S+:\d+)$", re.MULTILINE)

SCRIPT = textwrap.dedent(
    """
    import os
    import sys

    from pyspark.sql import SparkSession

    import tidemq.spark

    bootstrap, topic = sys.argv[1], sys.argv[2]
    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", "512m")
        .config("spark.sql.shuffle.partitions", "1")
        .config("spark.driver.extraJavaOptions", "-XX:+UseSerialGC -XX:TieredStopAtLevel=1 -Xss16m")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    print("before:", spark.sparkContext.pythonExec)
    tidemq.spark.register(spark)
    print("workers:", spark.sparkContext.pythonExec)
    df = spark.read.format("tidemq").options(bootstrap=bootstrap, subscribe=topic).load()
    values = sorted(bytes(r.value).decode() for r in df.select("value").collect())
    print("values:", ",".join(values))
    spark.stop()
    """
)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[str]:
    """`tidemq server` on a free port."""
    with server_process(tmp_path) as running:
        yield running.address


def _python_without_tidemq(bin_dir: Path) -> Path:
    """A `python3` that stands for a system Python: this interpreter's base, without
    site-packages (so without tidemq, pyarrow, ...)."""
    base = Path(getattr(sys, "_base_executable", sys.executable)).resolve()
    shim = bin_dir / "python3"
    shim.write_text(f'#!/bin/sh\nexec "{base}" -S "$@"\n')
    shim.chmod(0o755)
    return shim


def test_register_runs_local_workers_with_the_drivers_python(server: str, tmp_path: Path) -> None:
    topic = "unactivated-venv"
    with Admin(server) as admin:
        admin.create_topic(topic, 2)
    with Producer(server) as producer:
        for i in range(5):
            producer.send(topic, b"m%d" % i)

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = _python_without_tidemq(bin_dir)
    venv_bin = str(Path(sys.executable).parent)
    path = [p for p in os.environ.get("PATH", "").split(os.pathsep) if p and p != venv_bin]
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in {"PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "VIRTUAL_ENV", "PYTHONPATH"}
    }
    env["PATH"] = os.pathsep.join([str(bin_dir), *path])
    env["SPARK_LOCAL_IP"] = "127.0.0.1"
    # The stand-in is what PySpark would run without the fix: it cannot import tidemq.
    check = subprocess.run(
        ["python3", "-c", "import tidemq"], env=env, capture_output=True, text=True, check=False
    )
    assert check.returncode != 0
    assert "No module named 'tidemq'" in check.stderr

    script = tmp_path / "job.py"
    script.write_text(SCRIPT)
    done = subprocess.run(
        [sys.executable, str(script), server, topic],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    assert "before: python3" in done.stdout  # PySpark's own choice: the first python3
    assert f"workers: {sys.executable}" in done.stdout
    assert "values: m0,m1,m2,m3,m4" in done.stdout
    assert shim.exists()
