"""The `tidemq` command: `tidemq <noun> <verb>`, like Kafka's tools.

Servers: `tidemq server` (name server + broker), `tidemq namesrv`, `tidemq broker`.
Clients: `tidemq topic ...`, `tidemq produce`, `tidemq consume`, `tidemq group ...`,
`tidemq cluster ...`, `tidemq dlq ...`, `tidemq user ...`. Exit codes: 0 ok, 1 error, 2 usage. See
docs/guide/cli.md.
"""

from __future__ import annotations

import typer

from tidemq.cli import (
    commands_acl,
    commands_cluster,
    commands_data,
    commands_dlq,
    commands_group,
    commands_kv,
    commands_message,
    commands_pipeline,
    commands_pipeline_analytics,
    commands_pipeline_dbsync,
    commands_pop,
    commands_schema,
    commands_server,
    commands_special,
    commands_tier,
    commands_topic,
    commands_user,
    pipeline_common,
)
from tidemq.cli.common import DEBUG_ENV, set_debug
from tidemq.core.malloc_tuning import tune_malloc
from tidemq.core.version import __version__

__all__ = ["app"]

app = typer.Typer(
    name="tidemq",
    help="tidemq: a RocketMQ-style stream store. Run a server, manage topics and groups, "
    "produce and consume.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"tidemq {__version__}")
        raise typer.Exit


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    debug: bool = typer.Option(
        False,
        "--debug",
        help=f"On failure, print the traceback too (or set {DEBUG_ENV}=1).",
    ),
) -> None:
    """tidemq: a RocketMQ-style stream store."""
    set_debug(debug)
    tune_malloc()  # every command is a process of ours, and some move large batches


commands_server.register(app)
commands_data.register(app)
app.add_typer(commands_topic.app, name="topic")
app.add_typer(commands_group.app, name="group")
app.add_typer(commands_cluster.app, name="cluster")
app.add_typer(commands_special.timer_app, name="timer")
app.add_typer(commands_special.txn_app, name="txn")
app.add_typer(commands_dlq.app, name="dlq")
app.add_typer(commands_pop.app, name="pop")
app.add_typer(commands_user.app, name="user")
app.add_typer(commands_acl.app, name="acl")
app.add_typer(commands_kv.app, name="kv")
app.add_typer(commands_message.app, name="message")
app.add_typer(commands_schema.app, name="schema")
app.add_typer(commands_tier.app, name="tier")
# the pipeline commands register on pipeline_common.app when their modules are imported
_ = (commands_pipeline, commands_pipeline_analytics, commands_pipeline_dbsync)
app.add_typer(pipeline_common.app, name="pipeline")

if __name__ == "__main__":
    app()
