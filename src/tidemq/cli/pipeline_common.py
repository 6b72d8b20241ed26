"""The `tidemq pipeline` command group and what its commands share: loading the Spark
modules on demand (pyspark is the `spark` extra, and every other command must work
without it) and the SparkSession a pipeline runs in.

The commands live in `commands_pipeline*.py`, one module per pipeline; each registers on
`app` when imported (`tidemq.cli.main` imports them all)."""

from __future__ import annotations

import contextlib
import importlib
import os
import re
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from tidemq.cli.common import CliError, client_config, client_tls_files, debugging, info
from tidemq.client.sync import Admin

if TYPE_CHECKING:
    from tidemq.spark.options import ClientOptions

__all__ = [
    "Checkpoint",
    "Master",
    "MaxOffsets",
    "MinPartitions",
    "Once",
    "app",
    "load",
    "pipeline_client",
    "require_topics",
    "run_query",
    "session",
    "spark_error_message",
    "spark_failures",
]

app = typer.Typer(help="Spark pipelines (needs the `spark` extra).", no_args_is_help=True)

# Options every pipeline command takes, the same way.
Checkpoint = Annotated[
    Path,
    typer.Option(
        "--checkpoint", metavar="DIR", help="Spark checkpoint directory (reuse to resume)."
    ),
]
Master = Annotated[
    str, typer.Option("--master", metavar="URL", help="Spark master URL, e.g. local[4].")
]
Once = Annotated[
    bool,
    typer.Option(
        "--once/--continuous",
        help="Process what the topics hold now and exit (AvailableNow), or keep running.",
    ),
]
MinPartitions = Annotated[
    int | None,
    typer.Option(
        "--min-partitions",
        min=1,
        metavar="N",
        help=(
            "Read each micro-batch with at least N tasks (queue ranges split). A batch "
            "that failed for its size is replayed over the same offsets: run again with "
            "a larger N to read it in smaller pieces."
        ),
    ),
]
MaxOffsets = Annotated[
    int | None,
    typer.Option(
        "--max-offsets-per-trigger",
        min=1,
        metavar="N",
        help="Messages per micro-batch at most.",
    ),
]


def load(module: str) -> Any:
    """A `tidemq.spark` module, imported when a pipeline runs: pyspark is an extra, and
    every other command must work without it."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise CliError(
            f"the pipelines need pyspark and pyarrow: pip install 'tidemq[spark]' ({exc})"
        ) from None


def pipeline_client() -> ClientOptions:
    """The running command's login (TIDEMQ_USERNAME / TIDEMQ_PASSWORD) and --tls options,
    as the pipelines take them: for the driver's clients and the executors' (which make
    their own TLS context from the file names, the same paths on every node)."""
    # The spark package on demand: its options module brings pyarrow, and every other
    # command must start without it.
    from tidemq.spark.options import ClientOptions  # noqa: PLC0415

    config = client_config()
    tls, ca_file, cert_file, key_file = client_tls_files()
    # A certificate file that holds its key too: the connector names both.
    key_file = key_file or cert_file
    files = [None if f is None else str(f) for f in (ca_file, cert_file, key_file)]
    return ClientOptions(
        username=config.username,
        password=config.password,
        tls=tls or any(f is not None for f in files),
        ca_file=files[0],
        cert_file=files[1],
        key_file=files[2],
    )


def require_topics(address: str, topics: Iterable[str]) -> None:
    """Fail (`TopicNotFound`) before Spark starts when a topic does not exist: a pipeline
    over a missing topic would otherwise read nothing and report success."""
    with Admin(address, client_config=client_config()) as admin:
        for topic in dict.fromkeys(topics):
            admin.describe_topic(topic)


def session(master: str, app_name: str) -> tuple[Any, bool]:
    """The active SparkSession, or a new one (UTC, no UI); True when this created it.

    A new session's JVM writes its logs (and the Python workers' tracebacks) to a file
    in the temporary directory, not to this terminal, unless `--debug`: a failure is
    reported as one `error:` line (see `spark_failures`)."""
    from pyspark.sql import SparkSession  # noqa: PLC0415 - pyspark on demand

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # no "resolves to a loopback"
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
    )
    with _jvm_output(app_name):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR" if debugging() else "OFF")
    return spark, True


@contextlib.contextmanager
def _jvm_output(app_name: str) -> Iterator[None]:
    """While the JVM starts, stderr (fd 2, which it inherits) points at a log file."""
    if debugging():
        yield
        return
    fd, path = tempfile.mkstemp(prefix=f"{app_name}-", suffix=".log")
    _logs.append(path)
    saved = os.dup(2)
    try:
        sys.stderr.flush()
        os.dup2(fd, 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        os.close(fd)


#: Log files of the JVMs this process started (one, in practice).
_logs: list[str] = []

_TRACEBACK = "Traceback (most recent call last):"
#: `module.Error: message` (a Python exception line) or `java.pkg.Error: message`.
_EXCEPTION_LINE = re.compile(r"^(?:Caused by: )?((?:[A-Za-z_$][\w$]*\.)*)([A-Za-z_$][\w$]*): (.*)$")
_SQLSTATE = re.compile(r"(?:\s*SQLSTATE: \w+)+\s*$")
#: Wrappers whose messages only say that something else failed.
_WRAPPERS = ("py4j.Py4JException", "org.apache.spark.SparkException")


def spark_error_message(text: str) -> str:
    """One line out of a Spark or Py4J error's text: the Python exception that failed the
    job when there is one (the last line of the last Python traceback, without its module
    path), else the innermost Java `Caused by:`, else the first line."""
    lines = text.splitlines()
    found: str | None = None
    in_traceback = False
    for line in lines:
        if line.strip() == _TRACEBACK or line.endswith(_TRACEBACK):
            in_traceback = True
        elif in_traceback and line and not line[0].isspace():
            in_traceback = False
            found = line
    if found is None:
        causes = [
            line
            for line in lines
            if line.startswith("Caused by: ") and not line[11:].startswith(_WRAPPERS)
        ]
        found = causes[-1] if causes else next((x for x in lines if x.strip()), "")
    found = _SQLSTATE.sub("", found.strip())
    matched = _EXCEPTION_LINE.match(found)
    if matched is not None and matched.group(1):
        found = f"{matched.group(2)}: {matched.group(3)}"  # no module or package path
    return found or "failed"


@contextlib.contextmanager
def spark_failures(what: str) -> Iterator[None]:
    """Spark's and Py4J's exceptions as one `CliError` line: `<what> failed: <message>`
    (and where the JVM's log is). Without a failure, that log is removed."""
    spark_errors = (load("pyspark.errors").PySparkException, load("py4j.protocol").Py4JError)
    try:
        yield
    except spark_errors as exc:
        where = f" (Spark's log: {_logs[-1]})" if _logs else ""
        raise CliError(f"{what} failed: {spark_error_message(str(exc))}{where}") from exc
    else:
        while _logs:
            with contextlib.suppress(OSError):
                os.unlink(_logs.pop())


def run_query(query: Any, progress: Any, *, once: bool, running: str) -> tuple[int, int]:
    """Wait for a pipeline's streaming query: until it has read what was there (`once`),
    else until Ctrl-C (after printing `running`). Returns (rows, micro-batches that read
    anything), counted by `progress` (a `ProgressTotals` opened before the query started:
    every batch, not the last 100 that the query's recent progress keeps)."""
    if not once:
        info(f"{running}; Ctrl-C to stop")
        try:
            query.awaitTermination()
        except KeyboardInterrupt:
            query.stop()
    totals = progress.totals(query)
    return int(totals.rows), int(totals.batches)
