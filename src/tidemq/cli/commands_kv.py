"""`tidemq kv get`: the latest value of a key in a compact topic (docs/guide/compact-topics.md).

tidemq kv get prices AAPL            the value, as text (exit 1: no such key)
tidemq kv get prices AAPL -o json    {"key", "queue", "offset", "timestamp_ms",
                                      "value" (UTF-8 text or null), "value_base64"}
"""

from __future__ import annotations

import base64
from typing import Annotated

import typer

from tidemq.cli.common import (
    DEFAULT_BOOTSTRAP,
    Bootstrap,
    CliError,
    Output,
    OutputOpt,
    check_bootstrap,
    client_config,
    command,
    emit_json,
    say,
)
from tidemq.client.sync import Admin

__all__ = ["app"]

app = typer.Typer(help="Key-value access to compact topics.", no_args_is_help=True)


@command(app)
def get(
    topic: Annotated[str, typer.Argument(metavar="TOPIC", help="A compact topic.")],
    key: Annotated[str, typer.Argument(metavar="KEY", help="The key (UTF-8 text).")],
    *,
    bootstrap: Bootstrap = DEFAULT_BOOTSTRAP,
    output: OutputOpt = Output.TABLE,
) -> None:
    """The latest value of KEY in TOPIC (exit 1 when it has none: never written, or
    deleted with a tombstone)."""
    with Admin(check_bootstrap(bootstrap), client_config=client_config()) as admin:
        found = admin.lookup(topic, key.encode())
    if found is None or found.value is None:
        raise CliError(f"key {key!r} has no value in topic {topic!r} (never written, or deleted)")
    if output is Output.JSON:
        try:
            text: str | None = found.value.decode()
        except UnicodeDecodeError:
            text = None
        emit_json(
            {
                "key": key,
                "queue": found.queue,
                "offset": found.offset,
                "timestamp_ms": found.timestamp_ms,
                "value": text,
                "value_base64": base64.b64encode(found.value).decode(),
            }
        )
    else:
        say(found.value.decode(errors="backslashreplace"))
