"""The web console: its JSON API under `/api/` and its page under `/ui/`
(docs/guide/operations.md "Web console").

The page is a few static files (`console/`: HTML, one script, one style sheet; no build
step, nothing fetched from the internet) that call the API. Reads are GETs; the three
actions (reset a group's offsets, redrive dead letters, cancel a delayed message or roll
back a transaction) are POSTs with a JSON body. A POST must say
`Content-Type: application/json` and, when the browser sends an Origin, come from this
listener's own origin: a page on another site cannot make a logged-in operator's browser
act on the cluster (a cross-site form cannot send JSON without the browser asking first).

Errors answer `{"error": "..."}`: 400 for bad input, 404 for what does not exist, 502 when
the cluster failed the call.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Final

import msgspec
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

from tidemq.core.errors import (
    AuthorizationFailed,
    ConfigError,
    InvalidRequest,
    TidemqError,
    TopicNotFound,
    UnknownMessage,
    UnknownTransaction,
)
from tidemq.http.console_data import ConsoleData

__all__ = ["console_routes"]

#: Largest action body read.
_MAX_BODY: Final = 64 * 1024
#: Most messages one browse shows.
MAX_BROWSE: Final = 200
#: Topics per page of the topics page (by default, and at most).
TOPICS_PAGE: Final = 500
MAX_TOPICS_PAGE: Final = 5_000
_STATIC: Final = Path(__file__).parent / "console"
_KINDS: Final = {int: "an integer", str: "a string", bool: "true or false"}

Handler = Callable[[Request, ConsoleData], Awaitable[Response]]
DataFor = Callable[[Request], Awaitable[ConsoleData]]


class BadInput(ValueError):
    """A request the console's API cannot take, with what was wrong."""


def _json(body: Any, status: int = 200) -> Response:
    return Response(msgspec.json.encode(body), status_code=status, media_type="application/json")


def _guarded(handler: Handler, data_for: DataFor) -> Callable[[Request], Awaitable[Response]]:
    async def run(request: Request) -> Response:
        try:
            return await handler(request, await data_for(request))
        except (BadInput, InvalidRequest, ConfigError, ValueError, TypeError) as exc:
            return _json({"error": str(exc)}, 400)
        except (TopicNotFound, UnknownMessage, UnknownTransaction) as exc:
            return _json({"error": str(exc)}, 404)
        except (PermissionError, AuthorizationFailed) as exc:
            return _json({"error": str(exc)}, 403)
        except TidemqError as exc:
            return _json({"error": f"{type(exc).__name__}: {exc}"}, 502)

    return run


def _int(request: Request, name: str, default: int | None = None) -> int:
    raw = request.query_params.get(name)
    if raw is None or raw == "":
        if default is None:
            raise BadInput(f"query parameter {name} is needed")
        return default
    try:
        return int(raw)
    except ValueError:
        raise BadInput(f"query parameter {name} must be an integer, got {raw!r}") from None


async def _topics(request: Request, data: ConsoleData) -> Response:
    """A page of the topic list: ?prefix=&after=&limit=&system=1."""
    limit = _int(request, "limit", TOPICS_PAGE)
    if not 1 <= limit <= MAX_TOPICS_PAGE:
        raise BadInput(f"limit must be 1-{MAX_TOPICS_PAGE}, got {limit}")
    q = request.query_params
    page = await data.topics(
        q.get("prefix") or "", q.get("after") or "", limit, system=q.get("system") == "1"
    )
    return _json(page)


async def _action_body(request: Request) -> dict[str, Any]:
    """The JSON body of an action, once the request is known to come from this origin."""
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        raise BadInput("an action needs Content-Type: application/json")
    origin = request.headers.get("origin")
    if origin is not None and origin.split("://", 1)[-1] != request.headers.get("host"):
        raise BadInput(f"an action from another origin ({origin}) is refused")
    raw = await request.body()
    if len(raw) > _MAX_BODY:
        raise BadInput(f"the body is over {_MAX_BODY} bytes")
    try:
        body = json.loads(raw or b"{}")
    except json.JSONDecodeError as exc:
        raise BadInput(f"the body is not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise BadInput("the body must be a JSON object")
    return body


def _field(body: dict[str, Any], name: str, kind: type, default: Any = None) -> Any:
    value = body.get(name, default)
    if value is None and default is None:
        raise BadInput(f"the body needs {name!r}")
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise BadInput(f"{name!r} must be {_KINDS[kind]}, got {value!r}")
    return value


def console_routes(data_for: DataFor, name_servers: str) -> list[BaseRoute]:
    """`data_for(request)`: the console's clients for this request (its user's, on a
    listener with logins: `console_clients.py`)."""

    async def cluster(request: Request, data: ConsoleData) -> Response:
        return _json(await data.cluster(name_servers))

    async def topic(request: Request, data: ConsoleData) -> Response:
        return _json(await data.topic(request.path_params["name"]))

    async def groups(request: Request, data: ConsoleData) -> Response:
        return _json(await data.groups())

    async def group(request: Request, data: ConsoleData) -> Response:
        return _json(await data.group(request.path_params["group"]))

    async def reset(request: Request, data: ConsoleData) -> Response:
        body = await _action_body(request)
        planned = await data.reset(
            request.path_params["group"],
            _field(body, "topic", str),
            to=_field(body, "to", str),
            value=_field(body, "value", int, 0),
            execute=_field(body, "execute", bool, False),
        )
        return _json(planned)

    async def messages(request: Request, data: ConsoleData) -> Response:
        topic = request.query_params.get("topic") or ""
        if not topic:
            raise BadInput("query parameter topic is needed")
        at_ms = request.query_params.get("at_ms")
        found = await data.browse(
            topic,
            _int(request, "queue", 0),
            offset=None if at_ms else _int(request, "offset", 0),
            at=_int(request, "at_ms") / 1000 if at_ms else None,
            limit=min(_int(request, "limit", 20), MAX_BROWSE),
        )
        return _json(found)

    async def by_key(request: Request, data: ConsoleData) -> Response:
        topic = request.query_params.get("topic") or ""
        key = request.query_params.get("key") or ""
        if not topic or not key:
            raise BadInput("query parameters topic and key are needed")
        start, end = request.query_params.get("start_ms"), request.query_params.get("end_ms")
        found = await data.by_key(
            topic,
            key,
            start=_int(request, "start_ms") / 1000 if start else None,
            end=_int(request, "end_ms") / 1000 if end else None,
            limit=min(_int(request, "limit", 20), MAX_BROWSE),
        )
        return _json(found)

    async def message(request: Request, data: ConsoleData) -> Response:
        found = await data.message(request.path_params["id"])
        if found is None:
            return _json({"error": "no message with this id is stored now"}, 404)
        return _json(found)

    async def dlq_groups(request: Request, data: ConsoleData) -> Response:
        return _json(await data.dead_letter_groups())

    async def dlq(request: Request, data: ConsoleData) -> Response:
        return _json(
            await data.dead_letters(request.path_params["group"], _int(request, "limit", 100))
        )

    async def redrive(request: Request, data: ConsoleData) -> Response:
        body = await _action_body(request)
        limit = body.get("limit")
        if limit is not None:
            limit = _field(body, "limit", int)
        return _json({"redriven": await data.redrive(request.path_params["group"], limit)})

    async def timers(request: Request, data: ConsoleData) -> Response:
        return _json(await data.timers())

    async def cancel(request: Request, data: ConsoleData) -> Response:
        body = await _action_body(request)
        return _json(await data.cancel_timer(_field(body, "message_id", str)))

    async def transactions(request: Request, data: ConsoleData) -> Response:
        return _json(await data.transactions())

    async def rollback(request: Request, data: ConsoleData) -> Response:
        body = await _action_body(request)
        await data.rollback(_field(body, "txn_id", str))
        return _json({"rolled_back": True})

    async def schemas(request: Request, data: ConsoleData) -> Response:
        return _json(await data.schemas())

    async def home(request: Request) -> Response:
        return RedirectResponse("/ui/")

    get: list[tuple[str, Handler]] = [
        ("/api/cluster", cluster),
        ("/api/topics", _topics),
        ("/api/topics/{name:path}", topic),
        ("/api/groups", groups),
        ("/api/groups/{group:path}", group),
        ("/api/messages", messages),
        ("/api/message/{id}", message),
        ("/api/messages-by-key", by_key),
        ("/api/dlq", dlq_groups),
        ("/api/dlq/{group:path}", dlq),
        ("/api/timers", timers),
        ("/api/transactions", transactions),
        ("/api/schemas", schemas),
    ]
    post: list[tuple[str, Handler]] = [
        ("/api/reset/{group:path}", reset),
        ("/api/redrive/{group:path}", redrive),
        ("/api/timers/cancel", cancel),
        ("/api/transactions/rollback", rollback),
    ]
    routes: list[BaseRoute] = [Route(p, _guarded(h, data_for), methods=["GET"]) for p, h in get]
    routes += [Route(p, _guarded(h, data_for), methods=["POST"]) for p, h in post]
    routes += [
        Route("/", home, methods=["GET"]),
        Mount("/ui", app=StaticFiles(directory=_STATIC, html=True), name="console"),
    ]
    return routes
