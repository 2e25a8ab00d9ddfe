"""BF16 traffic is recorded like any other: `serve --record` over gRPC, `bench --record` (and its
replay), `capture convert`; and `bench --record` keeps a run's results whatever becomes of its
capture.

The capture format had no code for BF16: `bench --record` against a BF16 model ran the whole
load, then died with KeyError: 'BF16' (no table, no --json, a capture of its header alone left
behind, which a rerun refused to overwrite); `capture convert` died the same way, and
`serve --record` dropped every gRPC BF16 request (found by a tester).
"""

from __future__ import annotations

import errno
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from conftest import RunningServer, recording_server, serving
from onnx import TensorProto, helper

from duetime.cli import main as cli_main
from duetime.config import ServerSettings
from duetime.repository.layout import MODEL_FILENAME
from duetime.tools import loadgen
from duetime.tools.capture import CaptureWriter, read_capture

pytestmark = pytest.mark.timeout(120)

BF16 = ml_dtypes.bfloat16


def identity_model() -> bytes:
    """y = x, both bfloat16[N, 4] (opset 18, whose Identity takes bfloat16)."""
    info = helper.make_tensor_value_info
    graph = helper.make_graph(
        [helper.make_node("Identity", ["x"], ["y"])], "ident",
        [info("x", TensorProto.BFLOAT16, ["N", 4])], [info("y", TensorProto.BFLOAT16, ["N", 4])],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("bf16-repo")
    (root / "ident" / "1").mkdir(parents=True)
    (root / "ident" / "1" / MODEL_FILENAME).write_bytes(identity_model())
    (root / "ident" / "config.toml").write_text("max_batch_size = 8\n")
    return root


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[RunningServer]:
    with serving(ServerSettings(model_repository=repo, http_port=0, grpc_port=0)) as running:
        yield running


def test_serve_records_bf16_requests_over_grpc(repo: Path, tmp_path: Path) -> None:
    """gRPC requests are recorded field by field (HTTP ones as their bodies): every one of them
    was dropped, with one warning for them all."""
    capture = tmp_path / "served.cap"
    x = np.array([[1.5, -2.0, 0.25, 3.0]], dtype=BF16)
    with recording_server(repo, capture) as running:
        client = grpcclient.InferenceServerClient(running.grpc)
        try:
            for index in range(3):
                tensor = grpcclient.InferInput("x", list(x.shape), "BF16")
                tensor.set_data_from_numpy(x)
                client.infer("ident", [tensor], request_id=f"g{index}")
        finally:
            client.close()
    records = sorted(read_capture(capture), key=lambda r: r.request_id)
    assert [r.request_id for r in records] == ["g0", "g1", "g2"]
    for record in records:
        assert (record.protocol, record.status) == ("grpc", 200)
        assert record.inputs[0].datatype == "BF16"
        np.testing.assert_array_equal(record.inputs[0].array(), x)
        assert record.outputs is not None
        np.testing.assert_array_equal(record.outputs[0].array(), x)


def test_bench_record_of_a_bf16_model_replays(
    server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    capture, result = tmp_path / "bench.cap", tmp_path / "bench.json"
    argv = ["bench", "--grpc", server.grpc, "--model", "ident", "--rate", "100", "--duration",
            "0.3", "--warmup", "0", "--arrival", "constant", "-q", "--record", str(capture),
            "--json", str(result)]  # fmt: skip
    assert cli_main(argv) == 0, capsys.readouterr().err
    assert f"wrote {capture}" in capsys.readouterr().out
    records = list(read_capture(capture))
    sent = json.loads(result.read_text())["sent"]
    assert len(records) == sent > 0
    assert {r.inputs[0].datatype for r in records} == {"BF16"}
    argv = ["replay", str(capture), "--target", f"grpc://{server.grpc}", "-q", "--json",
            str(tmp_path / "replay.json")]  # fmt: skip
    assert cli_main(argv) == 0, capsys.readouterr().err
    replayed = json.loads((tmp_path / "replay.json").read_text())
    assert replayed["ok"] == len(records)


def test_capture_convert_takes_bf16(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Its own validation named BF16 a v2 datatype, then it died writing it."""
    source = tmp_path / "bf.jsonl"
    line = {
        "t_ms": 0,
        "model": "ident",
        "inputs": {"x": {"datatype": "BF16", "shape": [1, 4], "data": [1, 2.5, -3, 257]}},
    }
    source.write_text(json.dumps(line) + "\n")  # fmt: skip
    target = tmp_path / "bf.cap"
    assert cli_main(["capture", "convert", str(source), str(target)]) == 0
    (record,) = read_capture(target)
    assert record.inputs[0].datatype == "BF16"
    np.testing.assert_array_equal(record.inputs[0].array(), np.array([[1, 2.5, -3, 256]], BF16))
    capsys.readouterr()


# -- a capture that fails keeps the run's results ------------------------------------------------


def _failing_capture(error: Exception) -> Any:
    """A `write_bench_capture` that creates the file, writes its header, then fails."""

    def write(path: Path, *args: object) -> int:
        with CaptureWriter(path, meta={"written_by": "duetime bench"}):
            pass
        path.unlink()  # (as write_bench_capture leaves nothing of a capture that failed)
        raise error

    return write


@pytest.mark.parametrize(
    ("error", "says"),
    [
        (OSError(errno.ENOSPC, "No space left on device"), "cannot write it: No space left"),
        (KeyError("FP99"), "the capture could not be written (KeyError: 'FP99')"),
    ],
    ids=["disk-full", "a-bug"],
)
def test_bench_keeps_its_results_when_the_capture_fails(
    server: RunningServer,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    error: Exception,
    says: str,
) -> None:
    """The table is printed and --json written, then a one-line error names --record (exit 1);
    nothing is left at the capture's path, so a rerun is not refused."""
    monkeypatch.setattr(loadgen, "write_bench_capture", _failing_capture(error))
    capture, result = tmp_path / "run.cap", tmp_path / "run.json"
    argv = ["bench", "--grpc", server.grpc, "--model", "ident", "--rate", "100", "--duration",
            "0.2", "--warmup", "0", "-q", "--record", str(capture), "--json",
            str(result)]  # fmt: skip
    assert cli_main(argv) == 1
    out, err = capsys.readouterr()
    assert "p99 ms" in out  # the table
    assert f"wrote {result}" in out
    assert f"wrote {capture}" not in out
    assert json.loads(result.read_text())["sent"] > 0
    assert f"--record {capture}" in err
    assert says in err
    assert "the run's results are kept" in err
    assert "Traceback" not in err
    assert not capture.exists()
