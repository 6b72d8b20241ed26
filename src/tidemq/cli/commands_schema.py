"""`tidemq schema register / list / versions / get / check / config / delete`: the schema
registry over its REST API (docs/guide/schema-registry.md).

    tidemq schema register orders-value --file order.avsc
    tidemq schema register skus-value --file sku.json --type json
    tidemq schema list
    tidemq schema versions orders-value
    tidemq schema get orders-value [--version 2]       the schema's text
    tidemq schema get --id 7
    tidemq schema check orders-value --file order-v3.avsc   exit 1 when incompatible
    tidemq schema config [orders-value] [--set FULL]
    tidemq schema delete orders-value [--version 2] [--permanent]

`--registry URL` (default http://127.0.0.1:8085, or TIDEMQ_REGISTRY_URL).
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Annotated, Any

import typer

from tidemq.cli.common import (
    CliError,
    CliUsageError,
    Output,
    OutputOpt,
    command,
    emit_json,
    emit_table,
    say,
)
from tidemq.cli.value_formats import DEFAULT_REGISTRY, Registry
from tidemq.client.serde import SchemaRegistry
from tidemq.core.errors import ConfigError, TidemqError

__all__ = ["app"]

app = typer.Typer(help="The schema registry (Confluent's REST API).", no_args_is_help=True)


SchemaFile = Annotated[
    Path, typer.Option("--file", "-f", exists=True, dir_okay=False, help="The schema file.")
]
SchemaTypeOpt = Annotated[str, typer.Option("--type", "-t", help="avro, json (protobuf: not yet).")]


def _call(registry: str, method: str, path: str, body: Any = None) -> Any:
    """One request; the registry's error (with its code) as the command's error."""
    try:
        return SchemaRegistry(registry).request(method, path, body)
    except ConfigError as exc:
        raise CliUsageError(str(exc)) from None
    except TidemqError as exc:
        raise CliError(str(exc)) from None


def _q(name: str) -> str:
    return urllib.parse.quote(name, safe="")


def _schema_body(file: Path, schema_type: str) -> dict[str, Any]:
    kind = schema_type.upper()
    if kind not in ("AVRO", "JSON", "PROTOBUF"):
        raise CliUsageError(f"--type must be avro, json or protobuf, got {schema_type!r}")
    return {"schema": file.read_text(), "schemaType": kind}


@command(app)
def register(
    subject: Annotated[str, typer.Argument(help="The subject, e.g. orders-value.")],
    file: SchemaFile,
    schema_type: SchemaTypeOpt = "avro",
    registry: Registry = DEFAULT_REGISTRY,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Register a schema under a subject (its id: the existing one if it is there)."""
    answer = _call(
        registry, "POST", f"/subjects/{_q(subject)}/versions", _schema_body(file, schema_type)
    )
    if output is Output.JSON:
        emit_json(answer)
    else:
        say(f"Registered under {subject!r}: id {answer['id']}, version {answer.get('version')}.")


@command(app, "list")
def list_(
    deleted: Annotated[bool, typer.Option("--deleted", help="Soft-deleted ones too.")] = False,
    registry: Registry = DEFAULT_REGISTRY,
    output: OutputOpt = Output.TABLE,
) -> None:
    """The subjects."""
    subjects = _call(registry, "GET", "/subjects" + ("?deleted=true" if deleted else ""))
    if output is Output.JSON:
        emit_json(subjects)
    else:
        for subject in subjects:
            say(subject)


@command(app)
def versions(
    subject: Annotated[str, typer.Argument(help="The subject.")],
    registry: Registry = DEFAULT_REGISTRY,
    output: OutputOpt = Output.TABLE,
) -> None:
    """A subject's versions, with their schema ids."""
    numbers = _call(registry, "GET", f"/subjects/{_q(subject)}/versions")
    rows = [_call(registry, "GET", f"/subjects/{_q(subject)}/versions/{n}") for n in numbers]
    if output is Output.JSON:
        emit_json(rows)
    else:
        emit_table(
            ["VERSION", "ID", "TYPE"],
            [(r["version"], r["id"], r.get("schemaType", "AVRO")) for r in rows],
        )


@command(app)
def get(
    subject: Annotated[str | None, typer.Argument(help="The subject.")] = None,
    version: Annotated[str, typer.Option("--version", "-v", help="A version or latest.")] = (
        "latest"
    ),
    schema_id: Annotated[int | None, typer.Option("--id", help="A schema id instead.")] = None,
    registry: Registry = DEFAULT_REGISTRY,
    output: OutputOpt = Output.TABLE,
) -> None:
    """A schema: a subject's version (latest by default), or by id."""
    if (subject is None) == (schema_id is None):
        raise CliUsageError("give a SUBJECT or --id N")
    if schema_id is not None:
        answer = _call(registry, "GET", f"/schemas/ids/{schema_id}")
    else:
        answer = _call(registry, "GET", f"/subjects/{_q(subject or '')}/versions/{_q(version)}")
    if output is Output.JSON:
        emit_json(answer)
    else:
        say(answer["schema"])


@command(app)
def check(
    subject: Annotated[str, typer.Argument(help="The subject.")],
    file: SchemaFile,
    schema_type: SchemaTypeOpt = "avro",
    registry: Registry = DEFAULT_REGISTRY,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Whether a schema could be registered under a subject (exit 1 when not)."""
    answer = _call(
        registry,
        "POST",
        f"/compatibility/subjects/{_q(subject)}/versions?verbose=true",
        _schema_body(file, schema_type),
    )
    if output is Output.JSON:
        emit_json(answer)
    elif answer["is_compatible"]:
        say(f"Compatible with {subject!r}.")
    if not answer["is_compatible"]:
        raise CliError(f"incompatible with {subject!r}: {'; '.join(answer.get('messages', []))}")


@command(app)
def config(
    subject: Annotated[str | None, typer.Argument(help="A subject (default: global).")] = None,
    level: Annotated[
        str | None,
        typer.Option("--set", help="BACKWARD, FORWARD, FULL (and _TRANSITIVE), or NONE."),
    ] = None,
    registry: Registry = DEFAULT_REGISTRY,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Show or set the compatibility level (of a subject, or the global default)."""
    path = "/config" + (f"/{_q(subject)}" if subject else "")
    if level is not None:
        _call(registry, "PUT", path, {"compatibility": level.upper()})
    answer = _call(registry, "GET", path + ("?defaultToGlobal=true" if subject else ""))
    if output is Output.JSON:
        emit_json(answer)
    else:
        say(answer["compatibilityLevel"])


@command(app)
def delete(
    subject: Annotated[str, typer.Argument(help="The subject.")],
    version: Annotated[str | None, typer.Option("--version", "-v", help="One version.")] = None,
    permanent: Annotated[
        bool, typer.Option("--permanent", help="After a soft delete: remove for good.")
    ] = False,
    registry: Registry = DEFAULT_REGISTRY,
    output: OutputOpt = Output.TABLE,
) -> None:
    """Delete a subject or one version (soft first; then --permanent)."""
    path = f"/subjects/{_q(subject)}" + (f"/versions/{_q(version)}" if version else "")
    answer = _call(registry, "DELETE", path + ("?permanent=true" if permanent else ""))
    if output is Output.JSON:
        emit_json(answer)
    else:
        kind = "permanently" if permanent else "(soft)"
        say(f"Deleted {kind}: {subject!r} version(s) {answer}.")
