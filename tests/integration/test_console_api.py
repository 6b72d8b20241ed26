"""The web console's JSON API (`/api/...`) on a `tidemq server`: answers, clear errors for
bad input, and actions refused unless they come as JSON from the listener's own origin.
The pages themselves are tested in Chromium (test_console_browser.py)."""

from __future__ import annotations

import json
import struct
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from tests.support.server_process import server_process

import tidemq

pytestmark = pytest.mark.timeout(120)


def _call(
    http: str, path: str, body: bytes | None = None, headers: dict[str, str] | None = None
) -> tuple[int, Any]:
    request = urllib.request.Request(f"http://{http}{path}", data=body, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _post(http: str, path: str, body: dict[str, Any], **headers: str) -> tuple[int, Any]:
    sent = {"Content-Type": "application/json", **headers}
    return _call(http, path, json.dumps(body).encode(), sent)


def test_console_api(tmp_path: Path) -> None:
    with server_process(tmp_path, ["--http-port", "0"]) as server:
        b, http = server.address, server.http_address
        with tidemq.Admin(b) as admin:
            admin.create_topic("t", 1)
        start_ms = int(time.time() * 1000)
        with tidemq.Producer(b) as producer:
            producer.send("t", b"plain", key=b"k", headers={"h": b"v"})
            producer.send("t", b"\xff\xfe not utf-8")
            # Framed like Confluent's serializers, with an id no schema has.
            producer.send("t", b"\x00" + struct.pack(">I", 999) + b"payload")
        _reads(http, start_ms)
        _errors(http)
        _actions_need_json_from_this_origin(http)


def _reads(http: str, start_ms: int) -> None:
    status, got = _call(http, "/api/messages?topic=t&queue=0&offset=0&limit=10")
    assert status == 200
    assert [m["offset"] for m in got] == [0, 1, 2]
    plain, binary, framed = got
    assert plain["value"] == {"size": 5, "truncated": False, "text": "plain"}
    assert plain["key"]["text"] == "k"
    assert plain["headers"] == {"h": {"size": 1, "truncated": False, "text": "v"}}
    assert "base64" in binary["value"]
    assert framed["value"]["schema_id"] == 999
    assert "999 is not registered" in framed["value"]["decode_error"]
    # From a time: the first message stored at or after it.
    status, got = _call(http, f"/api/messages?topic=t&at_ms={start_ms}&limit=1")
    assert status == 200
    assert [m["offset"] for m in got] == [0]
    status, one = _call(http, f"/api/message/{plain['id']}")
    assert (status, one["offset"]) == (200, 0)
    status, page = _call(http, "/api/topics?system=1")
    assert {t["name"]: t["system"] for t in page["topics"]} == {"t": False, "_schemas": True}
    assert page["next"] == ""
    assert [t["name"] for t in _call(http, "/api/topics")[1]["topics"]] == ["t"]
    # A page at a time, by name: `next` is where the next page starts after.
    status, first = _call(http, "/api/topics?system=1&limit=1")
    assert [t["name"] for t in first["topics"]] == ["_schemas"]
    assert first["next"] == "_schemas"
    status, second = _call(http, "/api/topics?system=1&limit=1&after=_schemas")
    assert [t["name"] for t in second["topics"]] == ["t"]
    assert second["next"] == ""  # no page after it
    assert _call(http, "/api/topics?prefix=_&system=1")[1]["topics"][0]["name"] == "_schemas"
    assert _call(http, "/api/topics?limit=0")[0] == 400
    status, topic = _call(http, "/api/topics/t")
    assert topic["queue_info"][0]["max_offset"] == 3
    status, cluster = _call(http, "/api/cluster")
    (broker,) = cluster["brokers"]
    assert broker["status"]["messages_in"] >= 3
    assert 0 < broker["status"]["disk_free_bytes"] <= broker["status"]["disk_total_bytes"]


def _errors(http: str) -> None:
    assert _call(http, "/api/topics/nope")[0] == 404
    status, answer = _call(http, "/api/message/00000000000000000000000000FF")
    assert status == 404
    assert "no topic of this cluster has the id" in answer["error"]
    assert _call(http, "/api/message/not-an-id")[0] == 400
    status, answer = _call(http, "/api/messages?queue=0")
    assert (status, answer["error"]) == (400, "query parameter topic is needed")
    status, answer = _call(http, "/api/messages?topic=t&offset=x")
    assert status == 400
    assert "offset must be an integer" in answer["error"]
    status, answer = _call(http, "/api/messages?topic=t&offset=-1")
    assert (status, answer["error"]) == (400, "offset must be >= 0, got -1")
    status, answer = _post(http, "/api/reset/g", {"topic": "t", "to": "sideways"})
    assert status == 400
    assert "sideways" in answer["error"]
    status, answer = _post(http, "/api/reset/g", {"topic": "t", "to": "offset", "value": "3"})
    assert (status, answer["error"]) == (400, "'value' must be an integer, got '3'")
    status, answer = _post(http, "/api/timers/cancel", {})
    assert (status, answer["error"]) == (400, "the body needs 'message_id'")
    assert _post(http, "/api/transactions/rollback", {"txn_id": "nope"})[0] == 404


def _actions_need_json_from_this_origin(http: str) -> None:
    body = json.dumps({"topic": "t", "to": "earliest"}).encode()
    # A cross-site form post: no JSON content type.
    form = {"Content-Type": "application/x-www-form-urlencoded"}
    status, answer = _call(http, "/api/reset/g", body, form)
    assert (status, answer["error"]) == (400, "an action needs Content-Type: application/json")
    status, answer = _post(http, "/api/reset/g", {"topic": "t", "to": "earliest"},
                           Origin="http://evil.example")  # fmt: skip
    assert status == 400
    assert "another origin" in answer["error"]
    # The listener's own origin: a dry run, nothing changed.
    status, planned = _post(http, "/api/reset/g", {"topic": "t", "to": "latest"},
                            Origin=f"http://{http}")  # fmt: skip
    assert (status, planned) == (200, [{"topic": "t", "queue": 0, "offset": 3}])
