"""A JSON value nested as deep as orjson reads (1,024 levels) where a request takes a name, a
number or a flag is refused 400, naming the field, and logs no error; anything else that goes
through such a value recursively is refused 400 too (`rest._too_deep`), not answered 500.

NOTE: 995 nested lists as an input's name, a shared-memory key, offset or byte_size, or an
unload's 'unload_dependents' raised RecursionError (or orjson's "Recursion limit reached")
while the error message quoted them: a 500, and a traceback in the log each time (found by a
tester)."""

from __future__ import annotations

import http.client
import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import RunningServer, serving
from repo_models import scale_model, write_version

from duetime.config import ServerSettings
from duetime.frontend import rest

pytestmark = pytest.mark.timeout(120)

DEPTH = 995
DEEP_LIST = "[" * DEPTH + "1" + "]" * DEPTH
DEEP_OBJECT = '{"a":' * DEPTH + "1" + "}" * DEPTH
X = '"datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]'


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    """Model 'm' (y = 2x, FP32 [-1, 4]), in explicit control mode."""
    repo: Path = tmp_path_factory.mktemp("repo")
    write_version(repo, "m", 1, scale_model(2.0))
    settings = ServerSettings(
        model_repository=repo, http_port=0, grpc_port=0, model_control_mode="explicit",
        load_model=["m"],
    )  # fmt: skip
    with serving(settings) as running:
        yield running


def post(server: RunningServer, path: str, body: str) -> tuple[int, Any]:
    host, port = server.http.rsplit(":", 1)
    connection = http.client.HTTPConnection(host, int(port), timeout=60)
    try:
        connection.request("POST", path, body.encode())
        answer = connection.getresponse()
        return answer.status, json.loads(answer.read())
    finally:
        connection.close()


REGISTER = "/v2/systemsharedmemory/region/r/register"
CASES = [
    pytest.param("/v2/models/m/infer", '{"inputs": [{"name": %s, ' + X + "}]}", "inputs[0]",
                 id="input-name"),
    pytest.param("/v2/models/m/infer",
                 '{"inputs": [{"name": %s, "parameters": {"p": 1}, ' + X + "}]}", "inputs[0]",
                 id="input-name-with-parameters"),
    pytest.param("/v2/models/m/infer",
                 '{"inputs": [{"name": "x", ' + X + '}], "outputs": [{"name": %s, '
                 '"parameters": {}}]}', "outputs[0]", id="output-name"),
    pytest.param(REGISTER, '{"key": %s, "byte_size": 1}', "key", id="key"),
    pytest.param(REGISTER, '{"key": "/x", "offset": %s, "byte_size": 1}', "'offset'",
                 id="offset"),
    pytest.param(REGISTER, '{"key": "/x", "byte_size": %s}', "'byte_size'", id="byte_size"),
    pytest.param("/v2/repository/models/m/unload", '{"parameters": {"unload_dependents": %s}}',
                 "'unload_dependents'", id="unload_dependents"),
]  # fmt: skip


@pytest.mark.parametrize("deep", [DEEP_LIST, DEEP_OBJECT], ids=["list", "object"])
@pytest.mark.parametrize(("path", "body", "field"), CASES)
def test_a_deeply_nested_value_is_refused_naming_its_field(
    server: RunningServer, caplog: pytest.LogCaptureFixture, path: str, body: str, field: str,
    deep: str,
) -> None:  # fmt: skip
    with caplog.at_level(logging.ERROR):
        status, doc = post(server, path, body % deep)
    assert status == 400, doc
    assert field in doc["error"]
    assert "internal" not in doc["error"]
    assert len(doc["error"]) < 500  # (the value quoted cut short)
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    status, doc = post(server, "/v2/models/m/infer", '{"inputs": [{"name": "x", ' + X + "}]}")
    assert status == 200, doc  # (and 'm' is still served)


@pytest.mark.parametrize(
    ("path", "body", "patched"),
    [
        pytest.param("/v2/models/m/infer", '{"inputs": []}', "_check_parameter_types", id="infer"),
        pytest.param("/v2/logging", "{}", "_json_object", id="logging"),
    ],
)
def test_any_recursion_on_a_request_value_is_refused_400(
    server: RunningServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
    path: str, body: str, patched: str,
) -> None:  # fmt: skip
    """The guard for fields not named: whatever goes through a client's value recursively and
    runs out of stack (a RecursionError) is the client's nesting, refused 400."""

    def too_deep(*_: Any) -> Any:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(rest, patched, too_deep)
    with caplog.at_level(logging.ERROR):
        status, doc = post(server, path, body)
    assert status == 400, doc
    assert "nests a value too deeply" in doc["error"]
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
