"""The statistics extension: Triton's shape over HTTP and gRPC, and duetime's latency profile."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import RunningServer
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.timeout(60)


def _infer_mlp(client: httpclient.InferenceServerClient, rows: int) -> None:
    x = np.ones((rows, 40), np.float32)
    tensor = httpclient.InferInput("x", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    client.infer("mlp", [tensor])


def test_http_statistics_count_inferences_and_show_the_profile(server: RunningServer) -> None:
    client = httpclient.InferenceServerClient(server.http)
    try:
        before = client.get_inference_statistics("mlp")["model_stats"][0]
        _infer_mlp(client, 3)
        after = client.get_inference_statistics("mlp")["model_stats"][0]
        everything = client.get_inference_statistics()
    finally:
        client.close()
    assert after["name"] == "mlp"
    assert after["version"] == "1"
    assert after["inference_count"] - before["inference_count"] == 3
    assert after["execution_count"] - before["execution_count"] == 1
    success = after["inference_stats"]["success"]
    assert success["count"] >= 1
    assert success["ns"] > 0
    assert any(b["batch_size"] == 3 for b in after["batch_stats"])
    profile = after["duetime"]["variants"][0]["latency_profile"]
    assert profile[0]["batch_size"] == 1
    assert profile[-1]["batch_size"] == 64
    assert all(p["measured_median_us"] > 0 for p in profile)
    # each instance's profile: the variant's at the instance's pace (one instance: its own)
    variant = after["duetime"]["variants"][0]
    assert variant["instance_speeds"] == [1.0] * variant["instances"]
    assert variant["instance_latency_profiles"] == [profile] * variant["instances"]
    assert sum(variant["instance_runs"]) >= 1
    runs, means = variant["instance_runs"], variant["instance_mean_compute_us"]
    assert len(runs) == len(means) == variant["instances"]
    assert all((mean is None) == (count == 0) for count, mean in zip(runs, means, strict=True))
    assert all(mean > 0 for mean in means if mean is not None)
    assert {m["name"] for m in everything["model_stats"]} >= {"mlp", "resnet"}


def test_grpc_statistics(server: RunningServer) -> None:
    with grpcclient.InferenceServerClient(server.grpc) as client:
        stats = client.get_inference_statistics("resnet", as_json=True)
    (entry,) = stats["model_stats"]
    assert entry["name"] == "resnet"
    assert "inference_stats" in entry


@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_statistics_of_an_unknown_model_is_not_found(server: RunningServer, protocol: str) -> None:
    module = httpclient if protocol == "http" else grpcclient
    client = module.InferenceServerClient(server.http if protocol == "http" else server.grpc)
    try:
        with pytest.raises(
            InferenceServerException, match="Request for unknown model: 'nope' is not found"
        ):
            client.get_inference_statistics("nope")
    finally:
        client.close()


def test_requests_their_clients_cancelled_count_as_failed(tmp_path: Path) -> None:
    """Triton's `fail` and nv_inference_request_failure{reason="CANCELED"} are one count: six
    cancelled requests showed in the metric and not in the statistics."""
    import asyncio

    from repo_models import scale_model, write_version

    from duetime import Engine
    from duetime.statistics import statistics_json

    write_version(tmp_path, "m", 1, scale_model(2.0))
    (tmp_path / "m" / "config.toml").write_text(
        "max_batch_size = 8\n[scheduling]\nmax_queue_delay_us = 5000000\n"
    )

    async def main() -> dict[str, object]:
        engine = await Engine.start(tmp_path)
        try:
            x = np.ones((1, 4), np.float32)
            calls = [asyncio.ensure_future(engine.infer_async("m", {"x": x})) for _ in range(3)]
            await asyncio.sleep(0.05)  # queued, waiting for the batch to fill
            for call in calls:
                call.cancel()
            await asyncio.gather(*calls, return_exceptions=True)
            await asyncio.sleep(0)
            return statistics_json(engine.registry.snapshot, "m", None)
        finally:
            await engine.aclose()

    (entry,) = asyncio.run(main())["model_stats"]  # type: ignore[index]
    assert entry["inference_stats"]["fail"]["count"] == 3
    assert entry["execution_count"] == 0
