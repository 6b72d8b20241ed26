"""Bad input to the registry's REST API gets Confluent's error body and code, never a
500: malformed bodies, unknown subjects and versions, wrong levels and modes, and random
JSON (hypothesis)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.integration.conftest import ThreadedBroker, broker_config

from tidemq.http.listener import HttpListener

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    broker = ThreadedBroker(broker_config(Path(tmp_path_factory.mktemp("registry"))))
    broker.start()
    listener = HttpListener(broker.address, port=0)
    try:
        yield "http://" + broker.call(listener.start())
    finally:
        broker.call(listener.stop())
        broker.stop()


def call(url: str, method: str, path: str, body: bytes | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(
        url + path,
        data=body,
        method=method,
        headers={"Content-Type": "application/vnd.schemaregistry.v1+json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, json.loads(answer.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


CASES = [
    ("POST", "/subjects/s/versions", b"not json", 422, 42201),
    ("POST", "/subjects/s/versions", b"[]", 422, 42201),
    ("POST", "/subjects/s/versions", b"{}", 422, 42201),
    ("POST", "/subjects/s/versions", b'{"schema": "\\"int\\"", "schemaType": "XML"}', 422, 42201),
    ("POST", "/subjects/s/versions", b'{"schema": "\\"int\\"", "references": [{}]}', 422, 42201),
    ("POST", "/subjects/s/versions", b'{"schema": "{\\"type\\": \\"nope\\"}"}', 422, 42201),
    ("GET", "/subjects/nobody/versions", None, 404, 40401),
    ("GET", "/subjects/nobody/versions/abc", None, 404, 40401),
    ("GET", "/schemas/ids/abc", None, 404, 40403),
    ("GET", "/schemas/ids/424242", None, 404, 40403),
    ("PUT", "/config", b'{"compatibility": "SOMETIMES"}', 422, 42203),
    ("PUT", "/mode", b'{"mode": "X"}', 422, 42204),
    ("DELETE", "/subjects/nobody", None, 404, 40401),
    ("GET", "/config/nobody", None, 404, 40408),
    ("POST", "/subjects/s/versions", b" " * (9 << 20), 422, 42201),
]


@pytest.mark.parametrize(("method", "path", "body", "status", "code"), CASES)
def test_bad_requests_get_confluents_errors(  # noqa: PLR0917 - parametrized
    url: str, method: str, path: str, body: bytes | None, status: int, code: int
) -> None:
    got_status, answer = call(url, method, path, body)
    assert (got_status, answer["error_code"]) == (status, code), answer
    assert answer["message"]


def test_a_version_that_is_not_a_number_is_refused(url: str) -> None:
    ok, _ = call(url, "POST", "/subjects/v/versions", b'{"schema": "\\"int\\""}')
    assert ok == 200
    status, answer = call(url, "GET", "/subjects/v/versions/abc")
    assert (status, answer["error_code"]) == (422, 42202)


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=12,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(schema=JSON, schema_type=st.sampled_from(["AVRO", "JSON", None, "avro", 7]))
def test_random_schemas_never_make_the_registry_fail(
    url: str, schema: Any, schema_type: Any
) -> None:
    body: dict[str, Any] = {"schema": json.dumps(schema)}
    if schema_type is not None:
        body["schemaType"] = schema_type
    status, answer = call(url, "POST", "/subjects/fuzz/versions", json.dumps(body).encode())
    assert status in (200, 409, 422), answer
    if status != 200:
        assert isinstance(answer["error_code"], int)
