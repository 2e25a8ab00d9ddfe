"""A JSON body holding a NaN (read again by Python's `json`, as Triton's non-finite numbers
need) and a lone surrogate escape (`"\\ud800"`, which `json` reads and orjson refuses): a 400
saying so, and the connection goes on to the next request.

The surrogate reached the error message that named it, which no encoder could write: the
request hung unanswered and its connection stayed open, never idle, holding a place of
`max_connections` (found by a tester). Also: a body nested deeper than `json` reads, with a
`priority` out of range, got a 500 (RecursionError) for its re-read of the parameters; and a
bug that escapes the API is answered, not left hanging.
"""

from __future__ import annotations

import http.client
import json

import pytest
from conftest import RunningServer

from duetime.errors import InvalidInput
from duetime.frontend import rest
from duetime.frontend.rest import RestApi, error_reply

pytestmark = pytest.mark.timeout(60)

ROW = ",".join(["1.0"] * 39)
GOOD = json.dumps(
    {"inputs": [{"name": "x", "shape": [1, 40], "datatype": "FP32", "data": [1.0] * 40}]}
)


def infer_body(name: str = "x", extra: str = "") -> str:
    tensor = f'{{"name":"{name}","shape":[1,40],"datatype":"FP32","data":[NaN,{ROW}]}}'
    return "{" + extra + f'"inputs":[{tensor}]' + "}"


def post(connection: http.client.HTTPConnection, path: str, body: str) -> tuple[int, str]:
    connection.request("POST", path, body.encode(), {"Content-Type": "application/json"})
    response = connection.getresponse()
    return response.status, response.read().decode()


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v2/models/mlp/infer", infer_body(name="\\ud800")),
        ("/v2/models/mlp/infer", infer_body(extra='"id":"\\ud800",')),
        ("/v2/models/mlp/infer", infer_body(extra='"id":"a\\udc00b",')),
        ("/v2/models/mlp/infer", infer_body(extra='"outputs":[{"name":"\\ud800"}],')),
        ("/v2/models/mlp/infer", infer_body(extra='"parameters":{"\\udc00":"\\ud800"},')),
        ("/v1/models/mlp:predict", '{"instances":[{"x":[' + ROW + ',1.0],"\\ud800":1,"q":NaN}]}'),
        ("/v2/systemsharedmemory/region/r/register",
         '{"x":NaN,"key":"\\ud800","offset":0,"byte_size":10}'),
    ],
)  # fmt: skip
def test_a_lone_surrogate_beside_a_nan_is_refused_and_the_connection_goes_on(
    server: RunningServer, path: str, body: str
) -> None:
    connection = http.client.HTTPConnection(*server.http.split(":"), timeout=10)
    try:
        status, text = post(connection, path, body)
        assert status == 400, text
        assert "lone surrogate" in text
        status, text = post(connection, "/v2/models/mlp/infer", GOOD)  # (the same connection)
        assert status == 200, text
    finally:
        connection.close()


def test_a_surrogate_pair_beside_a_nan_is_read_as_its_character(server: RunningServer) -> None:
    connection = http.client.HTTPConnection(*server.http.split(":"), timeout=10)
    try:
        status, text = post(connection, "/v2/models/mlp/infer",
                            infer_body(extra='"id":"\\ud83d\\ude00",'))  # fmt: skip
    finally:
        connection.close()
    assert status == 200, text
    assert json.loads(text.replace("NaN", "null"))["id"] == "\U0001f600"


def test_a_body_nested_deeper_than_json_reads_still_names_a_bad_priority(
    server: RunningServer,
) -> None:
    """orjson reads 1,024 levels, Python's `json` fewer: the exact re-read of the parameters
    gives up, and the parameter is named as orjson read it (was: 500, RecursionError)."""
    junk = "[" * 1010 + "]" * 1010
    tensor = f'{{"name":"x","shape":[1,40],"datatype":"FP32","data":[{ROW},1.0]}}'
    body = f'{{"parameters":{{"priority":18446744073709551616}},"junk":{junk},"inputs":[{tensor}]}}'
    connection = http.client.HTTPConnection(*server.http.split(":"), timeout=10)
    try:
        status, text = post(connection, "/v2/models/mlp/infer", body)
    finally:
        connection.close()
    assert status == 400, text
    assert "'priority'" in text
    assert "uint64" in text


def test_an_error_message_with_a_lone_surrogate_is_written_escaped() -> None:
    reply = error_reply(InvalidInput("input '\ud800' is not an input"), "0" * 32)
    assert reply.status == 400
    assert json.loads(reply.body)["error"].startswith("input '\\ud800' is not an input")


def test_a_bug_that_escapes_the_api_is_answered_500_and_the_connection_goes_on(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    handle = RestApi.handle

    def failing(self: RestApi, method: str, url: bytes, *args: object) -> object:
        if url.endswith(b"/boom"):
            raise TypeError("a bug")
        return handle(self, method, url, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(rest.RestApi, "handle", failing)
    connection = http.client.HTTPConnection(*server.http.split(":"), timeout=10)
    try:
        connection.request("GET", "/boom")
        response = connection.getresponse()
        assert response.status == 500
        assert "internal error: TypeError" in response.read().decode()
        if not response.will_close:
            status, _ = post(connection, "/v2/models/mlp/infer", GOOD)
            assert status == 200
    finally:
        connection.close()
    connection = http.client.HTTPConnection(*server.http.split(":"), timeout=10)
    try:
        assert post(connection, "/v2/models/mlp/infer", GOOD)[0] == 200
    finally:
        connection.close()
