"""Confluent Schema Registry's REST API over a `RegistryService` (conventions.md §6):
the paths, bodies, content type and error codes that Confluent's clients use."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any, Final

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from tidemq.http.registry_service import RegistryService
from tidemq.schema.compatibility import compatibility_problems
from tidemq.schema.model import (
    Compatibility,
    ErrorCode,
    Mode,
    Reference,
    RegistryError,
    SchemaType,
)
from tidemq.schema.protobuf_schema import serialized
from tidemq.schema.registry_state import Record, RegistryState, VersionInfo

__all__ = ["CONTENT_TYPE", "registry_routes"]

CONTENT_TYPE: Final = "application/vnd.schemaregistry.v1+json"
#: Largest request body read (a schema with its references).
_MAX_BODY: Final = 8 << 20

Handler = Callable[[Request], Awaitable[Response]]


def _json(body: Any, status: int = 200) -> Response:
    return JSONResponse(body, status_code=status, media_type=CONTENT_TYPE)


def _error(exc: RegistryError) -> Response:
    return _json(exc.body(), exc.code.http_status)


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if len(raw) > _MAX_BODY:
        raise RegistryError(ErrorCode.INVALID_SCHEMA, f"request body over {_MAX_BODY} bytes")
    try:
        body = json.loads(raw or b"{}")
    except json.JSONDecodeError as exc:
        raise RegistryError(ErrorCode.INVALID_SCHEMA, f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise RegistryError(ErrorCode.INVALID_SCHEMA, "the body must be a JSON object")
    return body


def _flag(request: Request, name: str) -> bool:
    return request.query_params.get(name, "false").lower() == "true"


def _schema_type(body: dict[str, Any]) -> SchemaType:
    raw = body.get("schemaType") or "AVRO"
    try:
        return SchemaType(str(raw).upper())
    except ValueError:
        raise RegistryError(ErrorCode.INVALID_SCHEMA, f"unknown schemaType {raw!r}") from None


def _references(body: dict[str, Any]) -> list[Reference]:
    try:
        return [
            Reference(str(r["name"]), str(r["subject"]), int(r["version"]))
            for r in body.get("references") or []
        ]
    except (KeyError, TypeError, ValueError):
        raise RegistryError(
            ErrorCode.INVALID_SCHEMA, "each reference needs name, subject and version"
        ) from None


def _text(schema: Any, request: Request | None) -> str:
    """The schema as registered; a Protobuf one in its serialized form (base64
    FileDescriptorProto) when the request asks `?format=serialized`, as Confluent's."""
    if (
        request is not None
        and schema.schema_type is SchemaType.PROTOBUF
        and request.query_params.get("format") == "serialized"
    ):
        return serialized(schema.document)
    return str(schema.text)


def _schema_fields(
    info: VersionInfo | None, schema: Any, request: Request | None = None
) -> dict[str, Any]:
    """The schema's fields as Confluent returns them (schemaType only when not AVRO)."""
    out: dict[str, Any] = {"schema": _text(schema, request)}
    if schema.schema_type is not SchemaType.AVRO:
        out["schemaType"] = schema.schema_type.value
    if schema.references:
        out["references"] = [
            {"name": r.name, "subject": r.subject, "version": r.version} for r in schema.references
        ]
    if info is not None:
        out = {"subject": info.subject, "version": info.version, "id": info.schema_id, **out}
    return out


def _level(body: dict[str, Any]) -> Compatibility:
    raw = body.get("compatibility", body.get("compatibilityLevel"))
    try:
        return Compatibility(str(raw).upper())
    except ValueError:
        raise RegistryError(
            ErrorCode.INVALID_COMPATIBILITY_LEVEL, f"Invalid compatibility level {raw!r}"
        ) from None


def _mode(body: dict[str, Any]) -> Mode:
    raw = body.get("mode")
    try:
        return Mode(str(raw).upper())
    except ValueError:
        raise RegistryError(ErrorCode.INVALID_MODE, f"Invalid mode {raw!r}") from None


def _id(request: Request) -> int:
    try:
        return int(request.path_params["id"])
    except ValueError:
        raise RegistryError(ErrorCode.SCHEMA_NOT_FOUND, "Schema not found") from None


class _Api:
    def __init__(self, service: RegistryService) -> None:
        self.s = service

    # ---------------------------------------------------------------- subjects

    async def subjects(self, request: Request) -> Response:
        deleted = _flag(request, "deleted")
        return _json(await self.s.read(lambda st: st.subjects(deleted=deleted)))

    async def lookup(self, request: Request) -> Response:
        subject, body, deleted = (
            request.path_params["subject"],
            await _body(request),
            _flag(request, "deleted"),
        )

        def find(st: RegistryState) -> dict[str, Any]:
            parsed = st.parse(_schema_type(body), str(body.get("schema", "")), _references(body))
            info = st.find(subject, parsed, deleted=deleted)
            return _schema_fields(info, info.schema, request)

        return _json(await self.s.read(find))

    async def delete_subject(self, request: Request) -> Response:
        subject, permanent = request.path_params["subject"], _flag(request, "permanent")

        def plan(st: RegistryState) -> tuple[list[int], list[Record]]:
            return st.plan_delete_subject(subject, permanent=permanent)

        return _json(await self.s.write(plan))

    # ---------------------------------------------------------------- versions

    async def versions(self, request: Request) -> Response:
        subject, deleted = request.path_params["subject"], _flag(request, "deleted")
        return _json(await self.s.read(lambda st: st.versions(subject, deleted=deleted)))

    async def register(self, request: Request) -> Response:
        subject, body = request.path_params["subject"], await _body(request)

        def plan(st: RegistryState) -> tuple[VersionInfo, list[Record]]:
            parsed = st.parse(_schema_type(body), str(body.get("schema", "")), _references(body))
            info, record = st.plan_register(subject, parsed)
            return info, [] if record is None else [record]

        info = await self.s.write(plan)
        return _json({"id": info.schema_id, **_schema_fields(info, info.schema, request)})

    async def version(self, request: Request) -> Response:
        subject, version = request.path_params["subject"], request.path_params["version"]
        deleted = _flag(request, "deleted")
        info = await self.s.read(lambda st: st.version(subject, version, deleted=deleted))
        return _json(_schema_fields(info, info.schema, request))

    async def version_schema(self, request: Request) -> Response:
        subject, version = request.path_params["subject"], request.path_params["version"]
        info = await self.s.read(lambda st: st.version(subject, version))
        return Response(_text(info.schema, request), media_type=CONTENT_TYPE)

    async def referenced_by(self, request: Request) -> Response:
        subject, version = request.path_params["subject"], request.path_params["version"]

        def find(st: RegistryState) -> list[int]:
            return st.referenced_by(subject, st.version(subject, version, deleted=True).version)

        return _json(await self.s.read(find))

    async def delete_version(self, request: Request) -> Response:
        subject, version = request.path_params["subject"], request.path_params["version"]
        permanent = _flag(request, "permanent")

        def plan(st: RegistryState) -> tuple[int, list[Record]]:
            number, record = st.plan_delete_version(subject, version, permanent=permanent)
            return number, [record]

        return _json(await self.s.write(plan))

    # ---------------------------------------------------------------- schemas by id

    async def schema_by_id(self, request: Request) -> Response:
        schema_id = _id(request)
        schema = await self.s.read(lambda st: st.schema(schema_id))
        return _json(_schema_fields(None, schema, request))

    async def schema_subjects(self, request: Request) -> Response:
        schema_id, deleted = _id(request), _flag(request, "deleted")
        uses = await self.s.read(lambda st: st.uses(schema_id, deleted=deleted))
        return _json(sorted({s for s, _ in uses}))

    async def schema_versions(self, request: Request) -> Response:
        schema_id, deleted = _id(request), _flag(request, "deleted")
        uses = await self.s.read(lambda st: st.uses(schema_id, deleted=deleted))
        return _json([{"subject": s, "version": v} for s, v in uses])

    async def schema_types(self, request: Request) -> Response:
        return _json([SchemaType.AVRO.value, SchemaType.JSON.value, SchemaType.PROTOBUF.value])

    # ---------------------------------------------------------------- compatibility

    async def compatibility(self, request: Request) -> Response:
        subject, body = request.path_params["subject"], await _body(request)
        version = request.path_params.get("version")
        verbose = _flag(request, "verbose")

        def check(st: RegistryState) -> list[str]:
            parsed = st.parse(_schema_type(body), str(body.get("schema", "")), _references(body))
            level = st.compatibility(subject)
            try:
                numbers = st.versions(subject)
            except RegistryError:
                return []  # no subject yet: anything is compatible
            if version is not None:
                earlier = [st.version(subject, version).schema]
                level = Compatibility(level.value.replace("_TRANSITIVE", ""))
            else:
                earlier = [st.version(subject, n).schema for n in numbers]
            return compatibility_problems(level, parsed, earlier)

        problems = await self.s.read(check)
        answer: dict[str, Any] = {"is_compatible": not problems}
        if verbose:
            answer["messages"] = problems
        return _json(answer)

    # ---------------------------------------------------------------- config and mode

    async def get_config(self, request: Request) -> Response:
        subject = request.path_params.get("subject")
        default = _flag(request, "defaultToGlobal") or subject is None
        level = await self.s.read(lambda st: st.compatibility(subject, default=default))
        return _json({"compatibilityLevel": level.value})

    async def put_config(self, request: Request) -> Response:
        subject, level = request.path_params.get("subject"), _level(await _body(request))
        await self.s.write(lambda st: (None, [st.config_record(subject, level)]))
        return _json({"compatibility": level.value})

    async def delete_config(self, request: Request) -> Response:
        subject = request.path_params.get("subject")

        def plan(st: RegistryState) -> tuple[Compatibility, list[Record]]:
            return st.compatibility(subject, default=False), [st.config_record(subject, None)]

        level = await self.s.write(plan)
        return _json({"compatibilityLevel": level.value})

    async def get_mode(self, request: Request) -> Response:
        subject = request.path_params.get("subject")
        default = _flag(request, "defaultToGlobal") or subject is None
        mode = await self.s.read(lambda st: st.mode(subject, default=default))
        return _json({"mode": mode.value})

    async def put_mode(self, request: Request) -> Response:
        subject, mode = request.path_params.get("subject"), _mode(await _body(request))
        await self.s.write(lambda st: (None, [st.mode_record(subject, mode)]))
        return _json({"mode": mode.value})

    async def root(self, request: Request) -> Response:
        return _json({})

    async def contexts(self, request: Request) -> Response:
        return _json(["."])


def _guard(handler: Handler) -> Handler:
    async def run(request: Request) -> Response:
        try:
            return await handler(request)
        except RegistryError as exc:
            return _error(exc)

    return run


def registry_routes(service: RegistryService) -> list[Route]:
    api = _Api(service)
    table: list[tuple[str, Handler, list[str]]] = [
        ("/", api.root, ["GET"]),
        ("/contexts", api.contexts, ["GET"]),
        ("/subjects", api.subjects, ["GET"]),
        # Subjects may hold "/" (a Protobuf import's subject is its file name): the
        # longer paths first, since a `path` parameter matches across slashes.
        ("/subjects/{subject:path}/versions/{version}/schema", api.version_schema, ["GET"]),
        (
            "/subjects/{subject:path}/versions/{version}/referencedby",
            api.referenced_by,
            ["GET"],
        ),
        ("/subjects/{subject:path}/versions/{version}", api.version, ["GET"]),
        ("/subjects/{subject:path}/versions/{version}", api.delete_version, ["DELETE"]),
        ("/subjects/{subject:path}/versions", api.versions, ["GET"]),
        ("/subjects/{subject:path}/versions", api.register, ["POST"]),
        ("/subjects/{subject:path}", api.lookup, ["POST"]),
        ("/subjects/{subject:path}", api.delete_subject, ["DELETE"]),
        ("/schemas/ids/{id}", api.schema_by_id, ["GET"]),
        ("/schemas/ids/{id}/subjects", api.schema_subjects, ["GET"]),
        ("/schemas/ids/{id}/versions", api.schema_versions, ["GET"]),
        ("/schemas/types", api.schema_types, ["GET"]),
        (
            "/compatibility/subjects/{subject:path}/versions/{version}",
            api.compatibility,
            ["POST"],
        ),
        ("/compatibility/subjects/{subject:path}/versions", api.compatibility, ["POST"]),
        ("/config", api.get_config, ["GET"]),
        ("/config", api.put_config, ["PUT"]),
        ("/config/{subject:path}", api.get_config, ["GET"]),
        ("/config/{subject:path}", api.put_config, ["PUT"]),
        ("/config/{subject:path}", api.delete_config, ["DELETE"]),
        ("/mode", api.get_mode, ["GET"]),
        ("/mode", api.put_mode, ["PUT"]),
        ("/mode/{subject:path}", api.get_mode, ["GET"]),
        ("/mode/{subject:path}", api.put_mode, ["PUT"]),
    ]
    return [Route(path, _guard(handler), methods=methods) for path, handler, methods in table]
