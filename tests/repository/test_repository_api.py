"""Triton's model repository extension through `tritonclient`, over HTTP and gRPC: index, load
(with a config override), unload, and the errors a client gets."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from http import client as http_client
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import RunningServer, explicit_serving, on_loop, start_server, stop_server
from repo_models import inputs, scale_model, write_version
from tritonclient.utils import InferenceServerException

from duetime.config import ServerSettings
from duetime.repository import manager as manager_module


@pytest.fixture(scope="module")
def explicit_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    repo = tmp_path_factory.mktemp("repo")
    for name, factor in (("m", 1), ("n", 3), ("k", 3), ("q", 3), ("u", 3)):
        write_version(repo, name, 1, scale_model(factor))
    write_version(repo, "m", 2, scale_model(2))
    write_version(repo, "broken", 1, b"not onnx")
    with explicit_serving(repo, "m") as running:
        yield running


def clients(server: RunningServer) -> list[Any]:
    made = [
        httpclient.InferenceServerClient(server.http),
        grpcclient.InferenceServerClient(server.grpc),
    ]
    _open.extend(made)
    return made


_open: list[Any] = []


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    """Clients are closed after each test (an unclosed socket's warning would fail a later one)."""
    yield
    while _open:
        _open.pop().close()


def index(client: Any) -> list[dict[str, str]]:
    found = client.get_model_repository_index()
    if isinstance(client, grpcclient.InferenceServerClient):
        found = [
            {k: getattr(m, k) for k in ("name", "version", "state", "reason") if getattr(m, k)}
            for m in found.models
        ]
    return [{k: v for k, v in entry.items() if v} for entry in found]


def factor(client: Any, model: str, version: str = "") -> float:
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    tensor = module.InferInput("x", [1, 4], "FP32")
    tensor.set_data_from_numpy(inputs()["x"])
    result = client.infer(model, [tensor], model_version=version)
    return float(result.as_numpy("y")[0, 0])


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_index_load_unload(explicit_server: RunningServer, protocol: str) -> None:
    client = clients(explicit_server)[protocol == "grpc"]
    name = "n" if protocol == "http" else "k"  # one model each: the server is shared
    entries = index(client)
    assert {"name": "m", "version": "2", "state": "READY"} in entries
    assert {"name": name} in entries  # on disk, never loaded
    assert client.is_model_ready("m")
    assert not client.is_model_ready(name)

    client.load_model(name)
    assert client.is_model_ready(name)
    assert factor(client, name) == 3.0
    assert {"name": name, "version": "1", "state": "READY"} in index(client)

    client.unload_model(name)
    assert not client.is_model_ready(name)
    with pytest.raises(InferenceServerException):
        factor(client, name)
    states = {e.get("version"): e.get("state") for e in index(client) if e["name"] == name}
    assert states["1"] in ("UNLOADING", "UNAVAILABLE")


def test_kserve_clients_load_and_unload_with_their_own_messages(
    explicit_server: RunningServer,
) -> None:
    """KServe's v2 proto has these calls on the same service with other messages: the request
    is `model_name = 1` (Triton's field 1 is `repository_name`), the response `model_name = 1`,
    `isLoaded` / `isUnloaded = 2`; over HTTP KServe answers {"name", "load"/"unload": true}."""
    import http.client

    import grpc

    kserve_request = b"\x0a\x01q"  # model_name: "q"
    kserve_response = b"\x0a\x01q\x10\x01"  # model_name: "q", isLoaded / isUnloaded: true
    client = clients(explicit_server)[1]
    with grpc.insecure_channel(explicit_server.grpc) as channel:
        for call in ("RepositoryModelLoad", "RepositoryModelUnload"):
            change = channel.unary_unary(f"/inference.GRPCInferenceService/{call}")
            assert change(kserve_request, timeout=30) == kserve_response
            assert client.is_model_ready("q") == (call == "RepositoryModelLoad")
    host, port = explicit_server.http.split(":")
    connection = http.client.HTTPConnection(host, int(port))
    try:
        for action in ("load", "unload"):
            connection.request("POST", f"/v2/repository/models/q/{action}")
            response = connection.getresponse()
            assert (response.status, json.loads(response.read())) == (
                200, {"name": "q", action: True}
            )  # fmt: skip
    finally:
        connection.close()
    client.load_model("q")  # tritonclient reads both answers as before
    assert client.is_model_ready("q")
    client.unload_model("q")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_unload_dependents_must_be_a_boolean(explicit_server: RunningServer, protocol: str) -> None:
    """As Triton: an `unload_dependents` that is not a boolean is refused (400, INVALID_ARGUMENT)
    and nothing is unloaded; a boolean is taken."""
    import http.client

    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    def refusal(value: str | None) -> str:
        """The refusal of an unload whose `unload_dependents` is `value` (None: JSON's null,
        over gRPC a parameter with no value set)."""
        if protocol == "http":
            host, port = explicit_server.http.split(":")
            connection = http.client.HTTPConnection(host, int(port))
            body = json.dumps({"parameters": {"unload_dependents": value}})
            connection.request("POST", "/v2/repository/models/u/unload", body)
            response = connection.getresponse()
            status, message = response.status, json.loads(response.read())["error"]
            connection.close()
            assert status == 400
            return str(message)
        request = service_pb2.RepositoryModelUnloadRequest(model_name="u")
        if value is None:
            request.parameters["unload_dependents"].SetInParent()
        else:
            request.parameters["unload_dependents"].string_param = value
        with grpc.insecure_channel(explicit_server.grpc) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            with pytest.raises(grpc.RpcError) as refused:
                stub.RepositoryModelUnload(request, timeout=30)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        return str(refused.value.details())

    client = clients(explicit_server)[protocol == "grpc"]
    client.load_model("u")
    try:
        message = refusal("yes")
        assert "'unload_dependents': expected a boolean" in message
        assert 'got "yes"' in message
        # (the value as JSON writes it: it said "got None", Python's word)
        assert "got null" in refusal(None)
        assert client.is_model_ready("u")  # nothing was unloaded
        client.unload_model("u", unload_dependents=True)
        assert not client.is_model_ready("u")
    finally:
        client.unload_model("u")


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_load_with_a_config_override(explicit_server: RunningServer, protocol: str) -> None:
    client = clients(explicit_server)[protocol == "grpc"]
    try:
        client.load_model("m", config=json.dumps({"version_policy": {"all": {}}}))
        assert factor(client, "m", "1") == 1.0
        assert factor(client, "m", "2") == 2.0
        assert factor(client, "m") == 2.0
    finally:
        client.load_model("m", config=json.dumps({"version_policy": {"latest": {}}}))
    with pytest.raises(InferenceServerException, match="'m' version 1 is not found"):
        factor(client, "m", "1")


def model_config(client: Any, model: str) -> dict[str, Any]:
    if isinstance(client, grpcclient.InferenceServerClient):
        return dict(client.get_model_config(model, as_json=True)["config"])
    return dict(client.get_model_config(model))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_the_model_config_as_given_can_be_edited_and_loaded(
    explicit_server: RunningServer, protocol: str
) -> None:
    """Triton's load takes a ModelConfig as JSON: a client gets the config, edits it, loads it."""
    client = clients(explicit_server)[protocol == "grpc"]
    config = model_config(client, "m")
    config["version_policy"] = {"all": {}}
    config["instance_group"] = [{"kind": "KIND_CPU", "count": 2}]
    config["dynamic_batching"]["default_queue_policy"]["max_queue_size"] = 77
    config["parameters"]["scheduling_policy"] = {"string_value": "fifo"}
    try:
        client.load_model("m", config=json.dumps(config))
        assert factor(client, "m", "1") == 1.0
        reloaded = model_config(client, "m")
        assert reloaded["version_policy"] == {"all": {}}
        assert int(reloaded["instance_group"][0]["count"]) == 2
        assert int(reloaded["dynamic_batching"]["default_queue_policy"]["max_queue_size"]) == 77
        assert reloaded["parameters"]["scheduling_policy"] == {"string_value": "fifo"}
        assert [t["name"] for t in reloaded["input"]] == ["x"]
        config["sequence_batching"] = config.pop("dynamic_batching") and {}
        with pytest.raises(InferenceServerException, match="sequence_batching: sequence"):
            client.load_model("m", config=json.dumps(config))
    finally:
        client.load_model("m", config=json.dumps({"version_policy": {"latest": {}}}))


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_load_errors_are_clear(explicit_server: RunningServer, protocol: str) -> None:
    client = clients(explicit_server)[protocol == "grpc"]
    with pytest.raises(InferenceServerException, match="ONNX Runtime cannot load it"):
        client.load_model("broken")
    broken = [e for e in index(client) if e["name"] == "broken"]
    assert broken[0]["state"] == "UNAVAILABLE"
    assert "ONNX Runtime cannot load it" in broken[0]["reason"]
    with pytest.raises(InferenceServerException, match="not in the repository"):
        client.load_model("missing")
    with pytest.raises(InferenceServerException, match="max_batch_size"):
        client.load_model("m", config=json.dumps({"max_batch_size": "many"}))
    with pytest.raises(InferenceServerException, match="uploaded files need a 'config' too"):
        client.load_model("m", files={"file:1/model.onnx": scale_model(5)})
    with pytest.raises(InferenceServerException, match="expected a relative path inside"):
        client.load_model("m", config="{}", files={"file:../1/model.onnx": scale_model(5)})
    with pytest.raises(InferenceServerException, match="expected a relative path inside"):
        client.load_model("m", config="{}", files={"file:1/mo\0del.onnx": scale_model(5)})
    with pytest.raises(InferenceServerException, match="cannot write it into the model folder"):
        client.load_model("m", config="{}", files={f"file:1/{'a' * 300}.onnx": scale_model(5)})
    with pytest.raises(InferenceServerException, match="ONNX Runtime cannot load it") as bad:
        client.load_model("m", config="{}", files={"file:1/model.onnx": b"not onnx"})
    assert str(bad.value.status()) in ("400", "StatusCode.INVALID_ARGUMENT")  # (the client's)
    assert factor(client, "m") == 2.0  # a failed load changed nothing


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_load_failures_start_with_tritons_words(
    explicit_server: RunningServer, protocol: str
) -> None:
    """Triton's clients and QA tests look for "failed to load 'x'" in a failed load's message,
    and "failed to load 'x', failed to poll from model repository" where the model could not be
    read (L0_lifecycle: an unknown model, files uploaded without a config). duetime said "model
    'x' is not in the repository ...", "load parameter 'config': not valid JSON: ...". Its
    detail follows Triton's words now; the statuses are as they were."""
    client = clients(explicit_server)[protocol == "grpc"]
    polled = "failed to load '{}', failed to poll from model repository: "
    refused = "StatusCode.INVALID_ARGUMENT" if protocol == "grpc" else "400"
    for name, call, start, status in [
        ("missing", dict(), polled + "'missing' is not in the repository",
         "StatusCode.NOT_FOUND" if protocol == "grpc" else "404"),
        ("m", dict(config='{"max_batch_size": 16}}'),
         polled + "load parameter 'config': not valid JSON", refused),
        ("m", dict(config=json.dumps({"max_batch_size": "many"})), polled, refused),
        ("m", dict(files={"file:1/model.onnx": scale_model(5)}),
         polled + "uploaded files need a 'config' too", refused),
        ("m", dict(config="{}", files={"file:../1/model.onnx": scale_model(5)}),
         polled + "load parameter 'file:../1/model.onnx'", refused),
        ("broken", dict(), "failed to load 'broken': version 1: ", refused),
    ]:  # fmt: skip
        with pytest.raises(InferenceServerException) as failed:
            client.load_model(name, **call)
        assert failed.value.message().startswith(start.format(name)), failed.value
        assert str(failed.value.status()) == status, failed.value
    assert factor(client, "m") == 2.0  # (the failed loads changed nothing)


def test_a_model_loading_for_the_first_time_is_unavailable_not_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While a model's first load ran (index state LOADING), its requests got 404 / NOT_FOUND
    "unknown model", which clients and load balancers take as final; README's error table and
    Triton say 503 / UNAVAILABLE. Now: 503 with a Retry-After, UNAVAILABLE over gRPC, both with
    Triton's start ("Request for unknown model: 'm' has no available versions")."""
    write_version(tmp_path, "m", 1, scale_model(4))
    entered, gate = threading.Event(), threading.Event()  # (the load waits: no race)
    real = manager_module._load_with_variants

    def held(*args: Any) -> Any:
        entered.set()
        gate.wait(60)
        return real(*args)

    monkeypatch.setattr(manager_module, "_load_with_variants", held)
    settings = ServerSettings(
        model_repository=tmp_path, http_port=0, grpc_port=0, model_control_mode="explicit"
    )
    running, thread = start_server(settings)
    http, grpc_ = clients(running)
    loading_client = clients(running)[1]
    loader = threading.Thread(target=loading_client.load_model, args=("m",))
    try:
        loader.start()
        assert entered.wait(60)
        assert {"name": "m", "version": "1", "state": "LOADING"} in index(http)
        host, port = running.http.split(":")
        connection = http_client.HTTPConnection(host, int(port), timeout=30)
        for method, path in (("POST", "/v2/models/m/infer"), ("GET", "/v2/models/m")):
            connection.request(method, path, b'{"inputs": []}' if method == "POST" else None)
            response = connection.getresponse()
            error = json.loads(response.read())["error"]
            assert response.status == 503, error
            assert response.getheader("Retry-After") == "1"  # (a load takes about 1 s)
            assert error.startswith(
                "Request for unknown model: 'm' has no available versions: it is loading"
            ), error
        connection.close()
        for call in (lambda: factor(grpc_, "m"), lambda: grpc_.get_model_metadata("m")):
            with pytest.raises(InferenceServerException) as loading:
                call()
            assert str(loading.value.status()) == "StatusCode.UNAVAILABLE", loading.value
            assert "'m' has no available versions: it is loading" in loading.value.message()
        assert not http.is_model_ready("m")
        gate.set()
        loader.join(60)
        assert factor(http, "m") == 4.0  # (loaded: served as ever)
        assert factor(grpc_, "m") == 4.0
    finally:
        gate.set()
        loader.join(60)
        stop_server(running, thread)


def test_a_version_loading_beside_served_ones_is_unavailable_not_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While version 2 loaded and version 1 served, a request naming version 2 got 404 /
    NOT_FOUND "Request for unknown model: 'm' version 2 is not found", which clients take as
    final; Triton answers UNAVAILABLE "... version 2 is not at ready state". Now 503 with a
    Retry-After / UNAVAILABLE, saying it is loading; version 1 serves on meanwhile."""
    write_version(tmp_path, "m", 1, scale_model(4))
    entered, gate = threading.Event(), threading.Event()  # (the load waits: no race)
    real = manager_module._load_with_variants

    def held(source: Any, version: int, *rest: Any) -> Any:
        if version == 2:
            entered.set()
            gate.wait(60)
        return real(source, version, *rest)

    monkeypatch.setattr(manager_module, "_load_with_variants", held)
    settings = ServerSettings(
        model_repository=tmp_path, http_port=0, grpc_port=0, model_control_mode="explicit",
        load_model=("m",),
    )  # fmt: skip
    running, thread = start_server(settings)
    http, grpc_ = clients(running)
    write_version(tmp_path, "m", 2, scale_model(5))
    loader = threading.Thread(target=clients(running)[1].load_model, args=("m",))
    try:
        loader.start()
        assert entered.wait(60)
        assert {"name": "m", "version": "2", "state": "LOADING"} in index(http)
        host, port = running.http.split(":")
        connection = http_client.HTTPConnection(host, int(port), timeout=30)
        for method, path, written in (
            ("POST", "/v2/models/m/versions/2/infer", "2"),
            ("GET", "/v2/models/m/versions/02", "02"),  # (version 2 too, as routing reads it)
        ):
            connection.request(method, path, b'{"inputs": []}' if method == "POST" else None)
            response = connection.getresponse()
            error = json.loads(response.read())["error"]
            assert response.status == 503, error
            assert response.getheader("Retry-After") == "1"  # (a load takes about 1 s)
            assert error.startswith(
                f"Request for unknown model: 'm' version {written} is not at ready state: it is "
                "loading"
            ), error
        connection.close()
        for call in (lambda: factor(grpc_, "m", "2"), lambda: grpc_.get_model_metadata("m", "2")):
            with pytest.raises(InferenceServerException) as loading:
                call()
            assert str(loading.value.status()) == "StatusCode.UNAVAILABLE", loading.value
            assert loading.value.message().startswith(
                "Request for unknown model: 'm' version 2 is not at ready state: it is loading"
            ), loading.value
        assert factor(http, "m", "1") == 4.0  # (the served version answers meanwhile)
        assert factor(grpc_, "m") == 4.0
        with pytest.raises(InferenceServerException, match="'m' version 3 is not found"):
            factor(http, "m", "3")  # (a version nothing loads is still unknown)
        gate.set()
        loader.join(60)
        assert factor(http, "m", "2") == 5.0  # (loaded: served as ever)
        assert factor(grpc_, "m", "2") == 5.0
    finally:
        gate.set()
        loader.join(60)
        stop_server(running, thread)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_model_that_failed_to_load_says_so_in_tritons_words(
    explicit_server: RunningServer, protocol: str
) -> None:
    """Triton's QA expects a model that failed to load to answer "Request for unknown model:
    'x' has no available versions"; duetime said "model 'x' is not available: <reason>". Its
    reason follows Triton's words now, with the status as it was (503 / UNAVAILABLE)."""
    client = clients(explicit_server)[protocol == "grpc"]
    with pytest.raises(InferenceServerException):
        client.load_model("broken")
    with pytest.raises(InferenceServerException) as failed:
        factor(client, "broken")
    assert failed.value.message().startswith(
        "Request for unknown model: 'broken' has no available versions: version 1: "
    ), failed.value
    status = "StatusCode.UNAVAILABLE" if protocol == "grpc" else "503"
    assert str(failed.value.status()) == status, failed.value


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_uploaded_files_are_served_until_the_model_is_unloaded(
    explicit_server: RunningServer, protocol: str
) -> None:
    """Triton's model upload: the files given with a load form the model's folder, in place of
    the repository's; unloading forgets them, and the next load reads the repository again."""
    client = clients(explicit_server)[protocol == "grpc"]
    name = f"up-{protocol}"  # not in the repository at all
    files = {"file:1/model.onnx": scale_model(7), "file:3/model.onnx": scale_model(9)}
    client.load_model(name, config=json.dumps({"version_policy": {"all": {}}}), files=files)
    assert (factor(client, name, "1"), factor(client, name, "3")) == (7.0, 9.0)
    assert {"name": name, "version": "3", "state": "READY"} in index(client)
    client.load_model(name, config="{}", files={"file:1/model.onnx": scale_model(11)})
    assert factor(client, name) == 11.0  # a new upload replaces the last one
    client.unload_model(name)
    with pytest.raises(InferenceServerException, match="not in the repository"):
        client.load_model(name)
    try:
        client.load_model("n", config="{}", files={"file:1/model.onnx": scale_model(13)})
        assert factor(client, "n") == 13.0  # over a model in the repository
        client.unload_model("n")
        client.load_model("n")
        assert factor(client, "n") == 3.0  # the repository's again
    finally:
        client.unload_model("n")


def test_http_status_codes(explicit_server: RunningServer) -> None:
    import http.client

    connection = http.client.HTTPConnection(explicit_server.http.split(":")[0],
                                            int(explicit_server.http.split(":")[1]))  # fmt: skip

    def post(path: str, body: bytes = b"") -> tuple[int, bytes]:
        connection.request("POST", path, body)
        response = connection.getresponse()
        return response.status, response.read()

    status, body = post("/v2/repository/index", b'{"ready": true}')
    assert status == 200
    assert all(entry["state"] == "READY" for entry in json.loads(body))
    assert post("/v2/repository/index", b'{"ready": "yes"}')[0] == 400
    assert post("/v2/repository/index", b"[1]")[0] == 400
    assert post("/v2/repository/models/%2E%2E/load")[0] == 400
    assert post("/v2/repository/models/..%2Fetc/load")[0] == 400
    assert post("/v2/repository/models/m/reload")[0] == 404
    assert post("/v2/repository/models/m/load", b"{not json")[0] == 400
    connection.request("GET", "/v2/repository/index")
    response = connection.getresponse()
    response.read()
    assert response.status == 405
    assert post("/v2/repository/models/missing/load")[0] == 404
    connection.close()


def test_server_metadata_lists_the_extension(explicit_server: RunningServer) -> None:
    metadata = httpclient.InferenceServerClient(explicit_server.http).get_server_metadata()
    assert "model_repository" in metadata["extensions"]


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_mode_none_refuses_control(server: RunningServer, protocol: str) -> None:
    """As Triton: UNAVAILABLE (503), its words first (was 400 / FAILED_PRECONDITION)."""
    client = clients(server)[protocol == "grpc"]
    unavailable = "503" if protocol == "http" else "StatusCode.UNAVAILABLE"
    for call in (client.load_model, client.unload_model):
        with pytest.raises(InferenceServerException, match="--model-control-mode none") as off:
            call("mlp")
        assert str(off.value.status()) == unavailable
        assert off.value.message().startswith(
            "explicit model load / unload is not allowed if polling is enabled: "
        )
    assert {"name": "mlp", "version": "1", "state": "READY"} in index(client)


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_responses_name_version_and_variant(server: RunningServer, protocol: str) -> None:
    client = clients(server)[protocol == "grpc"]
    module = httpclient if protocol == "http" else grpcclient
    tensor = module.InferInput("x", [1, 40], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 40), dtype=np.float32))
    result = client.infer("mlp", [tensor])
    response = result.get_response()
    leading_zero = client.infer("mlp", [tensor], model_version="01").get_response()  # (version 1)
    assert client.is_model_ready("mlp", "001")
    huge = "1" + "0" * 30  # (not an int64: no version, as Triton's INVALID_ARG says of it)
    if protocol == "http":
        assert not client.is_model_ready("mlp", huge)  # (400)
    else:
        with pytest.raises(InferenceServerException, match=r"INVALID_ARGUMENT.*model_version"):
            client.is_model_ready("mlp", huge)
    if protocol == "http":
        assert leading_zero["model_version"] == "1"
        assert response["model_version"] == "1"
        assert response["parameters"]["variant"] == "default"
    else:
        assert leading_zero.model_version == "1"
        assert response.model_version == "1"
        assert response.parameters["variant"].string_param == "default"


def test_sticky_key_from_a_header_pins_the_version(tmp_path: Path) -> None:
    for version in (1, 2):
        write_version(tmp_path, "m", version, scale_model(version))
    (tmp_path / "m" / "config.toml").write_text(
        '[version_policy]\nall = {}\n[traffic]\nweights = { "1" = 50, "2" = 50 }\n'
        'sticky_key = "x-routing-key"\n'
    )
    settings = ServerSettings(model_repository=tmp_path, http_port=0, grpc_port=0)
    running, thread = start_server(settings)
    try:
        http, grpc = clients(running)
        for key in ("k1", "k2", "k3", "k4", "k5", "k6"):
            seen = set()
            for client in (http, grpc):
                module = httpclient if client is http else grpcclient
                tensor = module.InferInput("x", [1, 4], "FP32")
                tensor.set_data_from_numpy(inputs()["x"])
                for _ in range(3):
                    result = client.infer("m", [tensor], headers={"x-routing-key": key})
                    seen.add(float(result.as_numpy("y")[0, 0]))
            assert len(seen) == 1, (key, seen)
    finally:
        stop_server(running, thread)


def test_control_token_guards_load_and_unload(tmp_path: Path) -> None:
    write_version(tmp_path, "m", 1, scale_model(1))
    token = "s3cret-token-of-some-length"
    settings = ServerSettings(
        model_repository=tmp_path, http_port=0, grpc_port=0, model_control_mode="explicit",
        control_token=token,
    )  # fmt: skip
    running, thread = start_server(settings)
    try:
        for client in clients(running):
            # gRPC metadata keys are lower case
            for headers in (None, {"authorization": "Bearer wrong"}, {"authorization": token}):
                with pytest.raises(InferenceServerException, match="control token"):
                    client.load_model("m", headers=headers)
                with pytest.raises(InferenceServerException, match="control token") as refused:
                    client.unload_model("m", headers=headers)
            # the hint is one the client can follow: gRPC metadata keys must be lower case
            # (tritonclient refuses `Authorization` itself, with "Invalid metadata")
            hint = (
                "metadata 'authorization: Bearer <token>'"
                if isinstance(client, grpcclient.InferenceServerClient)
                else "header 'Authorization: Bearer <token>'"
            )
            assert hint in refused.value.message()
            assert "m" in [entry["name"] for entry in index(client)]  # the index stays readable
            client.load_model("m", headers={"authorization": f"Bearer {token}"})
            assert factor(client, "m") == 1.0
            client.unload_model("m", headers={"authorization": f"bearer {token}"})
        status = __import__("http.client").client.HTTPConnection(*running.http.split(":"))
        status.request("POST", "/v2/repository/models/m/load", b"")
        response = status.getresponse()
        assert response.status == 401
        assert response.getheader("WWW-Authenticate") == 'Bearer realm="duetime"'  # (RFC 9110)
        response.read()
        status.close()
    finally:
        stop_server(running, thread)


def test_a_short_control_token_is_refused() -> None:
    from duetime.config import server_settings
    from duetime.errors import ConfigError

    with pytest.raises(ConfigError, match="control_token"):
        server_settings({"control_token": "short"}, env={})


def test_an_http_load_request_is_read_off_the_event_loop(
    explicit_server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Found by a tester: a 45 MB model uploaded as base64 JSON was parsed and decoded on the
    event loop, and every other request waited 0.2-0.5 s for it."""
    from duetime.frontend import rest

    readers: list[threading.Thread] = []
    real = rest._load_asked

    def recording(body: bytes, name: str, *coding: Any) -> Any:
        readers.append(threading.current_thread())
        return real(body, name, *coding)

    monkeypatch.setattr(rest, "_load_asked", recording)
    http = clients(explicit_server)[0]
    http.load_model(
        "u", config='{"max_batch_size": 4}', files={"file:1/model.onnx": scale_model(7)}
    )
    host, port = explicit_server.http.rsplit(":", 1)
    connection = http_client.HTTPConnection(host, int(port), timeout=30)
    try:
        body = json.dumps({"parameters": {"file:1/model.onnx": "?"}})
        connection.request("POST", "/v2/repository/models/u/load", body=body)
        answer = connection.getresponse()
        assert answer.status == 400
        assert "expected base64 text" in answer.read().decode()
    finally:
        connection.close()
    assert len(readers) == 2
    loop_thread = on_loop(explicit_server, threading.get_ident)
    assert all(reader.ident != loop_thread for reader in readers)
    http.unload_model("u")


def test_a_model_whose_load_failed_is_not_ready_not_unavailable(
    explicit_server: RunningServer,
) -> None:
    """Found by a tester: HTTP answered its readiness (and the server's client) 503 with the
    load's error, where v2 says "not ready" with a 4xx (Triton: 400) and gRPC said ready=false."""
    http, grpc = clients(explicit_server)
    with pytest.raises(InferenceServerException):
        http.load_model("broken")
    host, port = explicit_server.http.rsplit(":", 1)
    connection = http_client.HTTPConnection(host, int(port), timeout=30)
    try:
        connection.request("GET", "/v2/models/broken/ready")
        answer = connection.getresponse()
        assert (answer.status, json.loads(answer.read())) == (
            400,
            {"name": "broken", "ready": False},
        )
    finally:
        connection.close()
    assert http.is_model_ready("broken") is False
    assert grpc.is_model_ready("broken") is False


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_load_parameter_it_does_not_know_is_refused(
    explicit_server: RunningServer, protocol: str
) -> None:
    """As Triton: a load parameter other than `config` and `file:<path>` is refused, and
    nothing loads. Found by a tester: an upload under a mistyped key ("files:...", or the path
    alone) loaded the repository's model and said it had loaded the upload."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    upload = scale_model(555)
    for key in ("files:1/model.onnx", "1/model.onnx", "foo"):
        if protocol == "http":
            host, port = explicit_server.http.split(":")
            connection = http_client.HTTPConnection(host, int(port), timeout=30)
            try:
                body = json.dumps({"parameters": {key: "AAAA"}})
                connection.request("POST", "/v2/repository/models/u/load", body=body)
                answer = connection.getresponse()
                status, message = answer.status, json.loads(answer.read())["error"]
            finally:
                connection.close()
            assert status == 400
        else:
            request = service_pb2.RepositoryModelLoadRequest(model_name="u")
            request.parameters[key].bytes_param = upload
            with grpc.insecure_channel(explicit_server.grpc) as channel:
                stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
                with pytest.raises(grpc.RpcError) as refused:
                    stub.RepositoryModelLoad(request, timeout=30)
            assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            message = str(refused.value.details())
        assert f"unrecognized load parameter '{key}'" in message
        assert "'config'" in message
        assert "'file:<path>'" in message
        assert not clients(explicit_server)[0].is_model_ready("u")


def test_a_grpc_repository_call_naming_a_repository_is_refused(
    explicit_server: RunningServer,
) -> None:
    """As Triton (UNSUPPORTED): the server has one repository. Found by a tester: an unload
    naming another repository unloaded this one's model. A KServe client's load or unload, whose
    model name rides in field 1 (Triton's `repository_name`), is still taken."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    http = clients(explicit_server)[0]
    http.load_model("u")
    try:
        with grpc.insecure_channel(explicit_server.grpc) as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            calls = [
                (stub.RepositoryIndex, service_pb2.RepositoryIndexRequest(repository_name="r")),
                (stub.RepositoryModelUnload,
                 service_pb2.RepositoryModelUnloadRequest(repository_name="r", model_name="u")),
                (stub.RepositoryModelLoad,
                 service_pb2.RepositoryModelLoadRequest(repository_name="r", model_name="v")),
            ]  # fmt: skip
            for call, request in calls:
                with pytest.raises(grpc.RpcError) as refused:
                    call(request, timeout=30)
                assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
                assert "'repository_name' specification is not supported" in str(
                    refused.value.details()
                )
            assert http.is_model_ready("u"), "nothing was unloaded"
            assert not http.is_model_ready("v"), "nothing was loaded"
            stub.RepositoryModelUnload(
                service_pb2.RepositoryModelUnloadRequest(repository_name="u"), timeout=30
            )  # (KServe's: its model name as field 1)
            assert not http.is_model_ready("u")
    finally:
        http.unload_model("u")
