"""The `tidemq pipeline` command group and what its commands share: loading the Spark
modules on demand (pyspark is the `spark` extra, and every other command must work
without it) and the SparkSession a pipeline runs in.

The commands live in `commands_pipeline*.py`, one module per pipeline; each registers on
`app` when imported (`tidemq.cli.main` imports them all)."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from tidemq.cli.common import CliError

__all__ = ["Checkpoint", "Master", "MaxOffsets", "Once", "app", "load", "session"]

app = typer.Typer(help="Spark pipelines (needs the `spark` extra).", no_args_is_help=True)

# Options every pipeline command takes, the same way.
Checkpoint = Annotated[
    Path, typer.Option("--checkpoint", help="Spark checkpoint directory (reuse to resume).")
]
Master = Annotated[str, typer.Option("--master", help="Spark master URL.")]
Once = Annotated[
    bool,
    typer.Option(
        "--once/--continuous",
        help="Process what the topics hold now and exit (AvailableNow), or keep running.",
    ),
]
MaxOffsets = Annotated[
    int | None,
    typer.Option("--max-offsets-per-trigger", min=1, help="Messages per micro-batch at most."),
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


def session(master: str, app_name: str) -> tuple[Any, bool]:
    """The active SparkSession, or a new one (UTC, no UI); True when this created it."""
    from pyspark.sql import SparkSession  # noqa: PLC0415 - pyspark on demand

    active = SparkSession.getActiveSession()
    if active is not None:
        return active, False
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    session = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    return session, True
