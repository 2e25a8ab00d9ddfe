"""`--host`: IPv6 literals (bare or in brackets) and `::` serve HTTP, gRPC and metrics; a host
that is not this one's is reported as the host's fault, whichever listener finds it first."""

from __future__ import annotations

import asyncio
import http.client
import socket
import urllib.request
from pathlib import Path

import pytest
import tritonclient.grpc as grpcclient
from conftest import start_server, stop_server
from pydantic import ValidationError

from duetime.config import ServerSettings
from duetime.errors import ConfigError
from duetime.server import Addresses, Server


def _binds(family: socket.AddressFamily, address: str) -> bool:
    try:
        with socket.socket(family) as sock:
            sock.bind((address, 0))
    except OSError:
        return False
    return True


def _dual_stack() -> bool:
    """Whether an IPv6 socket on `::` takes IPv4 clients here (Linux's default)."""
    if not _binds(socket.AF_INET6, "::"):
        return False
    with socket.socket(socket.AF_INET6) as sock:
        return sock.getsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY) == 0


def _served(connect_to: str, addresses: Addresses) -> None:
    """HTTP, gRPC and metrics all answer at `connect_to` (a bare address)."""
    conn = http.client.HTTPConnection(connect_to, addresses.http_port, timeout=30)
    try:
        conn.request("GET", "/v2/health/ready")
        assert conn.getresponse().status == 200
    finally:
        conn.close()
    target = f"[{connect_to}]" if ":" in connect_to else connect_to
    client = grpcclient.InferenceServerClient(f"{target}:{addresses.grpc_port}")
    try:
        assert client.is_server_live()
    finally:
        client.close()
    url = f"http://{target}:{addresses.metrics_port}/metrics"
    with urllib.request.urlopen(url, timeout=30) as answer:
        assert answer.status == 200


@pytest.mark.skipif(not _binds(socket.AF_INET6, "::1"), reason="no IPv6 loopback here")
@pytest.mark.parametrize("host", ["::1", "[::1]"])
def test_an_ipv6_loopback_serves_every_endpoint(mlp_repo: Path, host: str) -> None:
    settings = ServerSettings(model_repository=mlp_repo, host=host, http_port=0, grpc_port=0)
    running, thread = start_server(settings)
    try:
        addresses = running.addresses
        assert addresses.host == "::1"
        assert f"http://[::1]:{addresses.http_port} grpc://[::1]:" in addresses.describe()
        _served("::1", addresses)
    finally:
        stop_server(running, thread)


@pytest.mark.skipif(not _dual_stack(), reason="IPv6 sockets here are not dual stack")
def test_every_interface_over_ipv6_takes_ipv4_clients_too(mlp_repo: Path) -> None:
    settings = ServerSettings(model_repository=mlp_repo, host="::", http_port=0, grpc_port=0)
    running, thread = start_server(settings)
    try:
        _served("127.0.0.1", running.addresses)
    finally:
        stop_server(running, thread)


@pytest.mark.parametrize("metrics_port", [None, 0])
def test_a_host_not_of_this_machine_is_blamed_with_metrics_on(
    demo_repo: Path, metrics_port: int | None
) -> None:
    # (the metrics endpoint listens first; it once called this a --metrics-port problem)
    ports = {} if metrics_port is None else {"metrics_port": metrics_port}
    settings = ServerSettings(
        model_repository=demo_repo, host="999.1.1.1", http_port=0, grpc_port=0,
        tune_runtime=False, **ports,
    )  # fmt: skip
    with pytest.raises(ConfigError, match=r"field 'host'.*999\.1\.1\.1.*pass --host"):
        asyncio.run(Server(settings).start())


def test_an_empty_host_is_refused() -> None:
    with pytest.raises(ValidationError, match="host"):
        ServerSettings(host=" ")


@pytest.mark.parametrize("flag", ["http_port", "grpc_port"])
def test_a_taken_port_is_told_before_the_models_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, flag: str
) -> None:
    """It was told only once every model had loaded (seconds, minutes for big models), where a
    taken metrics port was told at once (found by a tester)."""
    from duetime.engine import Engine

    loads: list[Path] = []

    async def loading(self: Engine, root: Path) -> None:
        loads.append(root)

    monkeypatch.setattr(Engine, "load_repository", loading)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports = {"http_port": 0, "grpc_port": 0, flag: taken.getsockname()[1]}
        settings = ServerSettings(
            model_repository=tmp_path, metrics=False, tune_runtime=False, **ports
        )
        name = "--" + flag.replace("_", "-")
        with pytest.raises(ConfigError, match=rf"field '{flag}': cannot listen on .*pass {name}"):
            asyncio.run(Server(settings).start())
    assert loads == []
