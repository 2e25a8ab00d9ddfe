"""/metrics on a live server: good, invalid and refused requests to the demo `mlp`, then one
scrape parsed with prometheus_client's parser; every family is there with consistent values."""

from __future__ import annotations

import asyncio
import gc
import math
import socket
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from conftest import RunningServer, start_server, stop_server
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from tritonclient.utils import InferenceServerException

from duetime.config import ServerSettings
from duetime.errors import ConfigError
from duetime.server import Addresses, Server

pytestmark = pytest.mark.timeout(60)

GOOD_HTTP = 4
GOOD_GRPC = 2
INVALID = 2
REFUSED = 5
REFUSING_TIMEOUT_US = 140
"""Below half the default 300 µs delivery margin: admission refuses it whenever it arrives
before its due time (else it has expired on the way in); it is never run, not even as a probe
(one predicted to need at most twice its time, on a model that has refused everything for 100
ms, as a slow machine's pause between the good requests and these made it: 290 µs was)."""
MLP = {"model": "mlp", "version": "1", "variant": "default"}
HISTOGRAMS = (
    "duetime_request_duration_seconds",
    "duetime_queue_duration_seconds",
    "duetime_compute_duration_seconds",
    "duetime_batch_size",
)
FAMILIES = {
    "duetime_requests": "counter",
    "duetime_inferences": "counter",
    "duetime_admission_probes": "counter",
    **dict.fromkeys(HISTOGRAMS, "histogram"),
    "duetime_queue_depth": "gauge",
    "duetime_inflight_batches": "gauge",
    "duetime_instances": "gauge",
    "duetime_handoff_overhead_seconds": "gauge",
    "duetime_model_loaded": "gauge",
    "duetime_model_bytes": "gauge",
    "duetime_breaker_state": "gauge",
    "duetime_breaker_openings": "counter",
    "duetime_gc_pause_seconds": "histogram",
    "duetime_shadow_mirrored": "counter",
    "duetime_shadow_compared": "counter",
    "duetime_shadow_skipped": "counter",
    "duetime_shadow_dropped": "counter",
    "duetime_shadow_argmax_disagreements": "counter",
    "duetime_shadow_max_abs_diff": "gauge",
    "duetime_event_loop_utilization": "gauge",
    "duetime_shed_share": "gauge",
    "duetime_requests_shed": "counter",
}


@dataclass(frozen=True)
class Scrape:
    families: dict[str, tuple[str, list[Sample]]]
    """Family name (counters without `_total`) -> its type and samples."""
    text: str = ""

    def samples(self, family: str, suffix: str = "", **labels: str) -> list[Sample]:
        kind, samples = self.families[family]
        name = family + (suffix or ("_total" if kind == "counter" else ""))
        return [
            s
            for s in samples
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
        ]

    def value(self, family: str, suffix: str = "", **labels: str) -> float:
        (sample,) = self.samples(family, suffix, **labels)
        return sample.value


def scrape(port: int) -> Scrape:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    families = {f.name: (f.type, f.samples) for f in text_string_to_metric_families(text)}
    return Scrape(families, text)


def send_traffic(running: RunningServer) -> None:
    x = np.ones((1, 40), np.float32)
    client = httpclient.InferenceServerClient(running.http)
    try:
        good = httpclient.InferInput("x", [1, 40], "FP32")
        good.set_data_from_numpy(x)
        for _ in range(GOOD_HTTP):
            client.infer("mlp", [good])
        bad = httpclient.InferInput("x", [1, 39], "FP32")
        bad.set_data_from_numpy(np.ones((1, 39), np.float32))
        for _ in range(INVALID):
            with pytest.raises(InferenceServerException, match="shape"):
                client.infer("mlp", [bad])
        for _ in range(REFUSED):
            with pytest.raises(InferenceServerException, match="timeout"):
                client.infer("mlp", [good], timeout=REFUSING_TIMEOUT_US)
    finally:
        client.close()
    with grpcclient.InferenceServerClient(running.grpc) as stub:
        tensor = grpcclient.InferInput("x", [1, 40], "FP32")
        tensor.set_data_from_numpy(x)
        for _ in range(GOOD_GRPC):
            stub.infer("mlp", [tensor])


@pytest.fixture(scope="module")
def after_traffic(demo_repo: Path) -> Iterator[Scrape]:
    """One scrape of a fresh server after the traffic above (and a full GC run)."""
    settings = ServerSettings(model_repository=demo_repo, http_port=0, grpc_port=0, metrics_port=0)
    running, thread = start_server(settings)
    try:
        assert running.addresses.metrics_port is not None
        send_traffic(running)
        gc.collect()  # the server shares this process: its GC timing sees this collection
        yield scrape(running.addresses.metrics_port)
    finally:
        stop_server(running, thread)


def test_every_family_is_exposed_with_its_type(after_traffic: Scrape) -> None:
    exposed = {name: kind for name, (kind, _) in after_traffic.families.items()}
    assert {name: exposed.get(name) for name in FAMILIES} == FAMILIES
    assert "process_resident_memory_bytes" in exposed


def test_the_served_triton_families_are_typed_counter_under_their_names(
    after_traffic: Scrape,
) -> None:
    """As Triton writes them; the exporter served them untyped (prometheus_client can only
    write a counter as `<name>_total`)."""
    for name in ("nv_inference_request_success", "nv_inference_count", "nv_inference_exec_count"):
        assert f"# TYPE {name} counter\n" in after_traffic.text
        assert f"\n{name}{{" in after_traffic.text


def test_request_outcomes_count_what_was_sent(after_traffic: Scrape) -> None:
    outcome = {
        s.labels["outcome"]: s.value for s in after_traffic.samples("duetime_requests", **MLP)
    }
    assert outcome["success"] == GOOD_HTTP + GOOD_GRPC
    assert outcome["rejected"] + outcome["expired"] == REFUSED
    # (a 290 µs timeout is refused at admission, or, on a busy machine, found already past
    # its due time there: a request read while the loop is busy counts from the turn before)
    assert outcome["late"] == outcome["failed"] == outcome["cancelled"] == 0
    invalid = after_traffic.samples("duetime_requests", model="mlp", outcome="invalid")
    assert [(s.labels["variant"], s.labels["version"], s.value) for s in invalid] == [
        ("", "1", INVALID)
    ]
    assert after_traffic.value("duetime_inferences", **MLP) == GOOD_HTTP + GOOD_GRPC


def test_triton_metric_names_count_the_same_requests(after_traffic: Scrape) -> None:
    """A dashboard written for Triton finds its series, named exactly as Triton names them."""
    mlp = {"model": "mlp", "version": "1"}
    good = GOOD_HTTP + GOOD_GRPC
    assert after_traffic.value("nv_inference_request_success", **mlp) == good
    assert after_traffic.value("nv_inference_count", **mlp) == good
    assert 1 <= after_traffic.value("nv_inference_exec_count", **mlp) <= good
    reasons = {
        s.labels["reason"]: s.value
        for s in after_traffic.samples("nv_inference_request_failure", **mlp)
    }
    # (the invalid ones are no failure: Triton refuses them before they reach the model)
    assert reasons == {"REJECTED": REFUSED, "CANCELED": 0, "BACKEND": 0, "OTHER": 0}
    duration = {
        family: after_traffic.value(f"nv_inference_{family}_duration_us", **mlp)
        for family in ("request", "queue", "compute_infer")
    }
    # a request started in the same loop turn that admitted it queued 0 µs: all of them may have
    assert duration["request"] > 0
    assert duration["compute_infer"] > 0
    assert 0 <= duration["queue"] < duration["request"]
    assert after_traffic.value("nv_inference_pending_request_count", **mlp) == 0
    assert '\nnv_inference_request_success{model="mlp",version="1"} ' in after_traffic.text


@pytest.mark.parametrize("family", [*HISTOGRAMS, "duetime_gc_pause_seconds"])
def test_histogram_buckets_are_cumulative_and_end_in_the_count(
    after_traffic: Scrape, family: str
) -> None:
    counts = after_traffic.samples(family, "_count")
    assert counts
    for count in counts:
        labels = count.labels
        buckets = [
            s for s in after_traffic.samples(family, "_bucket") if _same_series(s.labels, labels)
        ]
        bounds = [float(s.labels["le"]) for s in buckets]
        values = [s.value for s in buckets]
        assert bounds == sorted(bounds)
        assert bounds[-1] == math.inf
        assert values == sorted(values), f"{family}{labels}: buckets not cumulative"
        assert values[-1] == count.value
        assert after_traffic.value(family, "_sum", **labels) >= 0


def test_latency_histograms_count_requests_and_batches(after_traffic: Scrape) -> None:
    answered = GOOD_HTTP + GOOD_GRPC
    requests = after_traffic.value("duetime_request_duration_seconds", "_count", **MLP)
    queued = after_traffic.value("duetime_queue_duration_seconds", "_count", **MLP)
    batches = after_traffic.value("duetime_compute_duration_seconds", "_count", **MLP)
    sizes = after_traffic.value("duetime_batch_size", "_count", **MLP)
    assert requests == queued == answered, "refused requests never queue nor finish"
    assert 1 <= batches <= answered
    assert sizes == batches
    assert after_traffic.value("duetime_batch_size", "_sum", **MLP) >= answered
    end_to_end = after_traffic.value("duetime_request_duration_seconds", "_sum", **MLP)
    compute = after_traffic.value("duetime_compute_duration_seconds", "_sum", **MLP)
    assert 0 < compute < end_to_end < 10
    assert after_traffic.value("duetime_batch_size", "_bucket", le="1.0", **MLP) == batches


def test_gauges_describe_the_loaded_models(after_traffic: Scrape, demo_repo: Path) -> None:
    loaded = {s.labels["model"]: s.value for s in after_traffic.samples("duetime_model_loaded")}
    assert loaded == {"deeplob": 1, "mlp": 1, "orderbook": 1, "resnet": 1}
    size = (demo_repo / "mlp" / "1" / "model.onnx").stat().st_size
    assert after_traffic.value("duetime_model_bytes", **MLP) == size
    assert after_traffic.value("duetime_instances", **MLP) == 1
    assert after_traffic.value("duetime_queue_depth", **MLP) == 0
    assert after_traffic.value("duetime_inflight_batches", **MLP) == 0
    assert after_traffic.value("duetime_breaker_state", instance="0", **MLP) == 0
    assert after_traffic.value("duetime_breaker_openings", **MLP) == 0
    assert 0 <= after_traffic.value("duetime_event_loop_utilization") <= 1
    assert after_traffic.value("duetime_requests_shed") == 0


def test_gc_pauses_are_timed_per_generation(after_traffic: Scrape) -> None:
    counts = {
        s.labels["generation"]: s.value
        for s in after_traffic.samples("duetime_gc_pause_seconds", "_count")
    }
    assert set(counts) == {"0", "1", "2"}
    assert counts["2"] >= 1, "the full collection before the scrape"


def _same_series(bucket: dict[str, str], labels: dict[str, str]) -> bool:
    return {k: v for k, v in bucket.items() if k != "le"} == labels


# -- the endpoint's settings ---------------------------------------------------------------------


def test_the_endpoint_is_announced_on_the_ready_line() -> None:
    addresses = Addresses("127.0.0.1", 8000, 8001, 8002)
    assert addresses.describe() == (
        "duetime ready: http://127.0.0.1:8000 grpc://127.0.0.1:8001 metrics://127.0.0.1:8002"
    )
    off = Addresses("127.0.0.1", 8000, 8001, None)
    assert off.describe() == "duetime ready: http://127.0.0.1:8000 grpc://127.0.0.1:8001"


def test_no_metrics_serves_no_endpoint(mlp_repo: Path) -> None:
    settings = ServerSettings(model_repository=mlp_repo, http_port=0, grpc_port=0, metrics=False)
    running, thread = start_server(settings)
    try:
        assert running.addresses.metrics_port is None
        assert "metrics://" not in running.addresses.describe()
    finally:
        stop_server(running, thread)


def test_a_metrics_port_asked_for_and_taken_fails_the_start(demo_repo: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        settings = ServerSettings(
            model_repository=demo_repo, http_port=0, grpc_port=0, metrics_port=port,
            tune_runtime=False,
        )  # fmt: skip
        server = Server(settings)
        with pytest.raises(ConfigError, match=f"127.0.0.1:{port}.*--metrics-port"):
            asyncio.run(server.start())
        assert server.engine.repository is None, "it failed before loading any model"
