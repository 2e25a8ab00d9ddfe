"""Wire-compatibility tests for duetime's generated KServe v2 / Triton gRPC stubs.

Every message is built once with duetime's stubs and once with tritonclient's own
generated code, serialized, and parsed by the other side; the parsed values must be
identical.  The descriptors themselves are also compared field by field, and a small
in-process gRPC server built on the generated servicer is driven by
``tritonclient.grpc.InferenceServerClient``.
"""

from __future__ import annotations

import queue
from collections.abc import Iterator
from concurrent import futures
from types import ModuleType
from typing import Any

import grpc
import numpy as np
import pytest
from google.protobuf import descriptor, json_format
from google.protobuf.message import Message

from duetime.frontend.proto import grpc_service_pb2 as dt_svc
from duetime.frontend.proto import grpc_service_pb2_grpc as dt_grpc
from duetime.frontend.proto import model_config_pb2 as dt_cfg

tc_grpc = pytest.importorskip("tritonclient.grpc")
from tritonclient.grpc import model_config_pb2 as tc_cfg  # noqa: E402
from tritonclient.grpc import service_pb2 as tc_svc  # noqa: E402

SERVICE = "inference.GRPCInferenceService"
RPCS = [
    "ServerLive",
    "ServerReady",
    "ModelReady",
    "ServerMetadata",
    "ModelMetadata",
    "ModelInfer",
    "ModelStreamInfer",
    "ModelConfig",
    "ModelStatistics",
    "RepositoryIndex",
    "RepositoryModelLoad",
    "RepositoryModelUnload",
    "SystemSharedMemoryStatus",
    "SystemSharedMemoryRegister",
    "SystemSharedMemoryUnregister",
    "CudaSharedMemoryStatus",
    "CudaSharedMemoryRegister",
    "CudaSharedMemoryUnregister",
    "TraceSetting",
    "LogSettings",
]
REQUIRED_MESSAGES = [
    "ServerLiveRequest",
    "ServerLiveResponse",
    "ServerReadyRequest",
    "ServerReadyResponse",
    "ModelReadyRequest",
    "ModelReadyResponse",
    "ServerMetadataRequest",
    "ServerMetadataResponse",
    "ModelMetadataRequest",
    "ModelMetadataResponse",
    "InferParameter",
    "InferTensorContents",
    "ModelInferRequest",
    "ModelInferResponse",
    "ModelStreamInferResponse",
    "ModelConfigRequest",
    "ModelConfigResponse",
    "ModelStatisticsRequest",
    "StatisticDuration",
    "InferStatistics",
    "InferBatchStatistics",
    "ModelStatistics",
    "ModelStatisticsResponse",
    "ModelRepositoryParameter",
    "RepositoryIndexRequest",
    "RepositoryIndexResponse",
    "RepositoryModelLoadRequest",
    "RepositoryModelLoadResponse",
    "RepositoryModelUnloadRequest",
    "RepositoryModelUnloadResponse",
    "CudaSharedMemoryStatusRequest",
    "CudaSharedMemoryStatusResponse",
    "CudaSharedMemoryRegisterRequest",
    "CudaSharedMemoryRegisterResponse",
    "CudaSharedMemoryUnregisterRequest",
    "CudaSharedMemoryUnregisterResponse",
]

DIRECTIONS = pytest.mark.parametrize(
    ("src", "dst"),
    [
        pytest.param((dt_svc, dt_cfg), (tc_svc, tc_cfg), id="duetime->triton"),
        pytest.param((tc_svc, tc_cfg), (dt_svc, dt_cfg), id="triton->duetime"),
    ],
)


# ---------------------------------------------------------------------------
# descriptor comparison
# ---------------------------------------------------------------------------


def _messages(file_desc: descriptor.FileDescriptor) -> Iterator[descriptor.Descriptor]:
    stack = list(file_desc.message_types_by_name.values())
    while stack:
        msg = stack.pop()
        yield msg
        stack.extend(msg.nested_types)


def _enums(file_desc: descriptor.FileDescriptor) -> Iterator[descriptor.EnumDescriptor]:
    yield from file_desc.enum_types_by_name.values()
    for msg in _messages(file_desc):
        yield from msg.enum_types


def _field_signature(field: descriptor.FieldDescriptor) -> tuple[Any, ...]:
    return (
        field.name,
        field.number,
        field.type,
        field.is_repeated,
        field.has_presence,
        field.message_type.full_name if field.message_type else None,
        field.enum_type.full_name if field.enum_type else None,
        field.containing_oneof.name if field.containing_oneof else None,
    )


@pytest.mark.parametrize(
    ("ours", "theirs"),
    [(dt_svc.DESCRIPTOR, tc_svc.DESCRIPTOR), (dt_cfg.DESCRIPTOR, tc_cfg.DESCRIPTOR)],
    ids=["grpc_service", "model_config"],
)
def test_descriptors_match_triton(
    ours: descriptor.FileDescriptor, theirs: descriptor.FileDescriptor
) -> None:
    assert ours.package == theirs.package == "inference"
    triton_pool = theirs.pool
    checked = 0
    for msg in _messages(ours):
        ref = triton_pool.FindMessageTypeByName(msg.full_name)
        assert msg.GetOptions().map_entry == ref.GetOptions().map_entry, msg.full_name
        for field in msg.fields:
            assert field.number in ref.fields_by_number, f"{msg.full_name}.{field.name}"
            assert _field_signature(field) == _field_signature(
                ref.fields_by_number[field.number]
            ), f"{msg.full_name}.{field.name}"
            checked += 1
    for enum in _enums(ours):
        ref_enum = triton_pool.FindEnumTypeByName(enum.full_name)
        assert {v.name: v.number for v in enum.values}.items() <= {
            v.name: v.number for v in ref_enum.values
        }.items(), enum.full_name
    assert checked > 50


def test_grpc_service_is_complete() -> None:
    """Every message of grpc_service.proto is complete, not a subset, of Triton's."""
    for msg in _messages(dt_svc.DESCRIPTOR):
        ref = tc_svc.DESCRIPTOR.pool.FindMessageTypeByName(msg.full_name)
        assert sorted(f.number for f in msg.fields) == sorted(f.number for f in ref.fields)
    for name in REQUIRED_MESSAGES:
        assert name in dt_svc.DESCRIPTOR.message_types_by_name, name


def test_service_methods_match_triton() -> None:
    ours = dt_svc.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    theirs = tc_svc.DESCRIPTOR.services_by_name["GRPCInferenceService"]
    assert ours.full_name == theirs.full_name == SERVICE
    assert [m.name for m in ours.methods] == RPCS
    for method in ours.methods:
        ref = theirs.methods_by_name[method.name]
        assert method.input_type.full_name == ref.input_type.full_name
        assert method.output_type.full_name == ref.output_type.full_name
        assert method.client_streaming == ref.client_streaming
        assert method.server_streaming == ref.server_streaming
    stream = ours.methods_by_name["ModelStreamInfer"]
    assert stream.client_streaming
    assert stream.server_streaming


def test_model_config_required_fields() -> None:
    fields = dt_cfg.ModelConfig.DESCRIPTOR.fields_by_name
    for name in [
        "name",
        "platform",
        "backend",
        "version_policy",
        "max_batch_size",
        "input",
        "output",
        "instance_group",
        "dynamic_batching",
        "parameters",
        "default_model_filename",
    ]:
        assert name in fields, name
    assert [(v.name, v.number) for v in dt_cfg.DataType.DESCRIPTOR.values] == [
        (v.name, v.number) for v in tc_cfg.DataType.DESCRIPTOR.values
    ]


def test_private_descriptor_pool() -> None:
    """duetime's stubs must not register ``inference.*`` in protobuf's default pool."""
    pool = dt_cfg.DESCRIPTOR.pool
    assert dt_svc.DESCRIPTOR.pool is pool
    assert pool is not tc_svc.DESCRIPTOR.pool
    assert pool.FindMessageTypeByName("inference.ModelInferRequest") is (
        dt_svc.ModelInferRequest.DESCRIPTOR
    )


# ---------------------------------------------------------------------------
# message round trips
# ---------------------------------------------------------------------------


def _roundtrip(src_msg: Message, dst_cls: type[Message]) -> Message:
    data = src_msg.SerializeToString()
    dst_msg = dst_cls.FromString(data)
    as_dict = {"preserving_proto_field_name": True}
    assert json_format.MessageToDict(dst_msg, **as_dict) == json_format.MessageToDict(
        src_msg, **as_dict
    )
    # Same schema on both sides: canonical re-encoding is byte-identical.
    assert dst_msg.SerializeToString(deterministic=True) == src_msg.SerializeToString(
        deterministic=True
    )
    return dst_msg


def _infer_request(svc: ModuleType) -> Message:
    req = svc.ModelInferRequest(model_name="resnet", model_version="3", id="req-42")
    req.parameters["priority"].int64_param = 2
    req.parameters["sequence_start"].bool_param = True
    req.parameters["tag"].string_param = "batch-A"
    req.parameters["timeout"].uint64_param = 1_000_000
    req.parameters["scale"].double_param = 0.5

    raw = req.inputs.add(name="image", datatype="FP32", shape=[2, 3])
    raw.parameters["binary_data_size"].int64_param = 24
    req.raw_input_contents.append(np.arange(6, dtype="<f4").tobytes())
    req.raw_input_contents.append(np.array([-1, 7], dtype="<i8").tobytes())
    req.inputs.add(name="ids", datatype="INT64", shape=[2])

    typed = req.inputs.add(name="mask", datatype="BOOL", shape=[3])
    typed.contents.bool_contents.extend([True, False, True])
    typed = req.inputs.add(name="text", datatype="BYTES", shape=[2])
    typed.contents.bytes_contents.extend([b"hello", b"\x00\xff"])
    typed = req.inputs.add(name="f", datatype="FP32", shape=[2])
    typed.contents.fp32_contents.extend([1.5, -2.25])
    typed = req.inputs.add(name="d", datatype="FP64", shape=[1])
    typed.contents.fp64_contents.append(3.141592653589793)
    typed = req.inputs.add(name="i", datatype="INT32", shape=[2])
    typed.contents.int_contents.extend([-5, 6])
    typed = req.inputs.add(name="l", datatype="INT64", shape=[1])
    typed.contents.int64_contents.append(-(2**40))
    typed = req.inputs.add(name="u", datatype="UINT32", shape=[1])
    typed.contents.uint_contents.append(2**32 - 1)
    typed = req.inputs.add(name="ul", datatype="UINT64", shape=[1])
    typed.contents.uint64_contents.append(2**64 - 1)

    out = req.outputs.add(name="logits")
    out.parameters["classification"].int64_param = 5
    out.parameters["binary_data"].bool_param = False
    req.outputs.add(name="probs")
    return req


def _infer_response(svc: ModuleType) -> Message:
    resp = svc.ModelInferResponse(model_name="resnet", model_version="3", id="req-42")
    resp.parameters["sequence_end"].bool_param = True
    resp.parameters["triton_final_response"].bool_param = True
    out = resp.outputs.add(name="logits", datatype="FP32", shape=[2, 2])
    out.parameters["binary_data_size"].int64_param = 16
    resp.raw_output_contents.append(np.ones(4, dtype="<f4").tobytes())
    typed = resp.outputs.add(name="labels", datatype="BYTES", shape=[1])
    typed.contents.bytes_contents.append(b"cat")
    return resp


@DIRECTIONS
def test_model_infer_request_roundtrip(
    src: tuple[ModuleType, ModuleType], dst: tuple[ModuleType, ModuleType]
) -> None:
    msg = _roundtrip(_infer_request(src[0]), dst[0].ModelInferRequest)
    assert msg.parameters["priority"].WhichOneof("parameter_choice") == "int64_param"
    assert msg.parameters["sequence_start"].bool_param is True
    assert msg.parameters["tag"].string_param == "batch-A"
    assert msg.parameters["timeout"].uint64_param == 1_000_000
    assert [i.name for i in msg.inputs][:3] == ["image", "ids", "mask"]
    np.testing.assert_array_equal(
        np.frombuffer(msg.raw_input_contents[0], dtype="<f4"), np.arange(6, dtype="f4")
    )
    assert list(msg.inputs[3].contents.bytes_contents) == [b"hello", b"\x00\xff"]
    assert list(msg.inputs[9].contents.uint64_contents) == [2**64 - 1]
    assert msg.outputs[0].parameters["classification"].int64_param == 5


@DIRECTIONS
def test_model_infer_response_roundtrip(
    src: tuple[ModuleType, ModuleType], dst: tuple[ModuleType, ModuleType]
) -> None:
    _roundtrip(_infer_response(src[0]), dst[0].ModelInferResponse)
    stream = src[0].ModelStreamInferResponse(error_message="")
    stream.infer_response.CopyFrom(_infer_response(src[0]))
    _roundtrip(stream, dst[0].ModelStreamInferResponse)
    _roundtrip(
        src[0].ModelStreamInferResponse(error_message="model 'x' is not ready"),
        dst[0].ModelStreamInferResponse,
    )


@DIRECTIONS
def test_model_metadata_response_roundtrip(
    src: tuple[ModuleType, ModuleType], dst: tuple[ModuleType, ModuleType]
) -> None:
    svc = src[0]
    meta = svc.ModelMetadataResponse(name="mlp", versions=["1", "2"], platform="onnxruntime_onnx")
    meta.inputs.add(name="x", datatype="FP32", shape=[-1, 40])
    meta.outputs.add(name="y", datatype="FP32", shape=[-1, 3])
    meta.outputs.add(name="label", datatype="BYTES", shape=[-1, 1])
    msg = _roundtrip(meta, dst[0].ModelMetadataResponse)
    assert list(msg.inputs[0].shape) == [-1, 40]
    assert list(msg.versions) == ["1", "2"]


def _duration(target: Message, count: int, ns: int) -> None:
    target.count = count
    target.ns = ns


@DIRECTIONS
def test_model_statistics_response_roundtrip(
    src: tuple[ModuleType, ModuleType], dst: tuple[ModuleType, ModuleType]
) -> None:
    svc = src[0]
    resp = svc.ModelStatisticsResponse()
    stats = resp.model_stats.add(
        name="mlp",
        version="1",
        last_inference=1_700_000_000_123,
        inference_count=640,
        execution_count=12,
    )
    inf = stats.inference_stats
    for i, name in enumerate(
        [
            "success",
            "fail",
            "queue",
            "compute_input",
            "compute_infer",
            "compute_output",
            "cache_hit",
            "cache_miss",
        ]
    ):
        _duration(getattr(inf, name), i + 1, (i + 1) * 1_000_003)
    for batch_size in (1, 64):
        batch = stats.batch_stats.add(batch_size=batch_size)
        _duration(batch.compute_input, batch_size, 10 * batch_size)
        _duration(batch.compute_infer, batch_size, 20 * batch_size)
        _duration(batch.compute_output, batch_size, 30 * batch_size)
    stats.memory_usage.add(type="CPU", id=0, byte_size=2**33)
    _duration(stats.response_stats["0"].success, 5, 500)
    resp.model_stats.add(name="resnet", version="1")
    msg = _roundtrip(resp, dst[0].ModelStatisticsResponse)
    assert msg.model_stats[0].inference_stats.cache_miss.ns == 8 * 1_000_003
    assert msg.model_stats[0].batch_stats[1].batch_size == 64


def _model_config(svc: ModuleType, cfg: ModuleType) -> Message:
    resp = svc.ModelConfigResponse()
    c = resp.config
    c.name = "resnet"
    c.platform = "onnxruntime_onnx"
    c.backend = "onnxruntime"
    c.runtime = ""
    c.max_batch_size = 32
    c.version_policy.latest.num_versions = 2
    c.default_model_filename = "model.onnx"
    image = c.input.add(name="image", data_type=cfg.TYPE_FP32, dims=[3, 64, 64])
    image.format = cfg.ModelInput.FORMAT_NCHW
    image.reshape.shape.extend([3, 4096])
    image.allow_ragged_batch = True
    c.input.add(name="shape", data_type=cfg.TYPE_INT64, dims=[2], is_shape_tensor=True)
    c.input.add(name="extra", data_type=cfg.TYPE_BF16, dims=[-1], optional=True)
    c.output.add(name="logits", data_type=cfg.TYPE_FP32, dims=[10], label_filename="labels.txt")
    c.output.add(name="names", data_type=cfg.TYPE_STRING, dims=[1], is_shape_tensor=False)
    c.instance_group.add(name="cpu", kind=cfg.ModelInstanceGroup.KIND_CPU, count=4)
    c.instance_group.add(kind=cfg.ModelInstanceGroup.KIND_GPU, count=1, gpus=[0, 1])
    db = c.dynamic_batching
    db.preferred_batch_size.extend([8, 16, 32])
    db.max_queue_delay_microseconds = 2_000
    db.preserve_ordering = True
    db.priority_levels = 3
    db.default_priority_level = 2
    db.default_queue_policy.timeout_action = cfg.ModelQueuePolicy.DELAY
    db.default_queue_policy.default_timeout_microseconds = 50_000
    db.default_queue_policy.allow_timeout_override = True
    db.default_queue_policy.max_queue_size = 1_024
    db.priority_queue_policy[1].max_queue_size = 16
    c.parameters["deadline_ms"].string_value = "25"
    c.parameters["intra_op_thread_count"].string_value = "2"
    c.metric_tags["team"] = "ml"
    c.model_transaction_policy.decoupled = False
    return resp


@DIRECTIONS
def test_model_config_response_roundtrip(
    src: tuple[ModuleType, ModuleType], dst: tuple[ModuleType, ModuleType]
) -> None:
    msg = _roundtrip(_model_config(*src), dst[0].ModelConfigResponse)
    cfg = dst[1]
    c = msg.config
    assert c.WhichOneof("scheduling_choice") == "dynamic_batching"
    assert c.version_policy.WhichOneof("policy_choice") == "latest"
    assert c.input[0].data_type == cfg.TYPE_FP32
    assert c.input[2].data_type == cfg.TYPE_BF16 == 14
    assert c.output[1].data_type == cfg.TYPE_STRING == 13
    assert c.instance_group[0].kind == cfg.ModelInstanceGroup.KIND_CPU
    assert c.dynamic_batching.default_queue_policy.timeout_action == cfg.ModelQueuePolicy.DELAY
    assert c.parameters["deadline_ms"].string_value == "25"


def test_model_config_tolerates_unmodelled_triton_fields() -> None:
    """Triton fields duetime leaves out survive as unknown fields and re-encode intact."""
    theirs = tc_svc.ModelConfigResponse()
    theirs.config.name = "ens"
    theirs.config.optimization.cuda.graphs = True
    theirs.config.response_cache.enable = True
    theirs.config.instance_group.add(count=1).rate_limiter.priority = 3
    ours = dt_svc.ModelConfigResponse.FromString(theirs.SerializeToString())
    assert ours.config.name == "ens"
    assert ours.config.instance_group[0].count == 1
    back = tc_svc.ModelConfigResponse.FromString(ours.SerializeToString())
    assert back == theirs


@DIRECTIONS
def test_repository_messages_roundtrip(
    src: tuple[ModuleType, ModuleType], dst: tuple[ModuleType, ModuleType]
) -> None:
    svc = src[0]
    index = svc.RepositoryIndexResponse()
    index.models.add(name="mlp", version="1", state="READY", reason="")
    index.models.add(name="resnet", version="2", state="UNAVAILABLE", reason="load failed")
    _roundtrip(index, dst[0].RepositoryIndexResponse)
    _roundtrip(
        svc.RepositoryIndexRequest(repository_name="", ready=True), dst[0].RepositoryIndexRequest
    )
    load = svc.RepositoryModelLoadRequest(repository_name="", model_name="mlp")
    load.parameters["config"].string_param = '{"max_batch_size": 8}'
    load.parameters["file:1/model.onnx"].bytes_param = b"\x08\x07onnx"
    load.parameters["force"].bool_param = True
    load.parameters["n"].int64_param = -3
    _roundtrip(load, dst[0].RepositoryModelLoadRequest)
    unload = svc.RepositoryModelUnloadRequest(model_name="mlp")
    unload.parameters["unload_dependents"].bool_param = True
    _roundtrip(unload, dst[0].RepositoryModelUnloadRequest)


@DIRECTIONS
def test_health_and_metadata_messages_roundtrip(
    src: tuple[ModuleType, ModuleType], dst: tuple[ModuleType, ModuleType]
) -> None:
    s, d = src[0], dst[0]
    _roundtrip(s.ServerLiveResponse(live=True), d.ServerLiveResponse)
    _roundtrip(s.ServerReadyResponse(ready=True), d.ServerReadyResponse)
    _roundtrip(s.ModelReadyRequest(name="mlp", version="1"), d.ModelReadyRequest)
    _roundtrip(s.ModelReadyResponse(ready=True), d.ModelReadyResponse)
    _roundtrip(
        s.ServerMetadataResponse(name="duetime", version="0.1.0", extensions=["statistics"]),
        d.ServerMetadataResponse,
    )
    _roundtrip(s.ModelMetadataRequest(name="mlp", version="2"), d.ModelMetadataRequest)
    _roundtrip(s.ModelConfigRequest(name="mlp"), d.ModelConfigRequest)
    _roundtrip(s.ModelStatisticsRequest(name="", version=""), d.ModelStatisticsRequest)


# ---------------------------------------------------------------------------
# end to end: generated servicer <-> tritonclient.grpc
# ---------------------------------------------------------------------------


class _Servicer(dt_grpc.GRPCInferenceServiceServicer):
    """Toy model "double": y = 2 * x (FP32), served through the generated stubs."""

    def ServerLive(self, request: Message, context: grpc.ServicerContext) -> Message:
        return dt_svc.ServerLiveResponse(live=True)

    def ModelMetadata(self, request: Message, context: grpc.ServicerContext) -> Message:
        meta = dt_svc.ModelMetadataResponse(
            name=request.name, versions=["1"], platform="onnxruntime_onnx"
        )
        meta.inputs.add(name="x", datatype="FP32", shape=[-1, 4])
        meta.outputs.add(name="y", datatype="FP32", shape=[-1, 4])
        return meta

    def ModelConfig(self, request: Message, context: grpc.ServicerContext) -> Message:
        return _model_config(dt_svc, dt_cfg)

    def ModelStatistics(self, request: Message, context: grpc.ServicerContext) -> Message:
        resp = dt_svc.ModelStatisticsResponse()
        resp.model_stats.add(name="double", version="1", inference_count=3)
        return resp

    def _infer(self, request: Message) -> Message:
        x = np.frombuffer(request.raw_input_contents[0], dtype="<f4")
        resp = dt_svc.ModelInferResponse(
            model_name=request.model_name, model_version="1", id=request.id
        )
        resp.outputs.add(name="y", datatype="FP32", shape=list(request.inputs[0].shape))
        resp.raw_output_contents.append((2 * x).astype("<f4").tobytes())
        return resp

    def ModelInfer(self, request: Message, context: grpc.ServicerContext) -> Message:
        return self._infer(request)

    def ModelStreamInfer(
        self, request_iterator: Iterator[Message], context: grpc.ServicerContext
    ) -> Iterator[Message]:
        for request in request_iterator:
            yield dt_svc.ModelStreamInferResponse(infer_response=self._infer(request))


@pytest.fixture
def triton_client() -> Iterator[Any]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    dt_grpc.add_GRPCInferenceServiceServicer_to_server(_Servicer(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    client = tc_grpc.InferenceServerClient(url=f"127.0.0.1:{port}")
    try:
        yield client
    finally:
        client.close()
        server.stop(grace=None).wait()


def _double_inputs() -> tuple[list[Any], np.ndarray]:
    x = np.arange(8, dtype=np.float32).reshape(2, 4)
    inp = tc_grpc.InferInput("x", list(x.shape), "FP32")
    inp.set_data_from_numpy(x)
    return [inp], x


@pytest.mark.timeout(30)
def test_tritonclient_against_generated_servicer(triton_client: Any) -> None:
    assert triton_client.is_server_live()
    meta = triton_client.get_model_metadata("double")
    assert meta.name == "double"
    assert list(meta.inputs[0].shape) == [-1, 4]
    config = triton_client.get_model_config("double")
    assert config.config.dynamic_batching.max_queue_delay_microseconds == 2_000
    stats = triton_client.get_inference_statistics("double")
    assert stats.model_stats[0].inference_count == 3

    inputs, x = _double_inputs()
    result = triton_client.infer("double", inputs, request_id="r1")
    np.testing.assert_array_equal(result.as_numpy("y"), 2 * x)
    assert result.get_response().id == "r1"

    with pytest.raises(tc_grpc.InferenceServerException, match=r"UNIMPLEMENTED|not implemented"):
        triton_client.is_model_ready("double")


@pytest.mark.timeout(30)
def test_tritonclient_stream_against_generated_servicer(triton_client: Any) -> None:
    results: queue.Queue[tuple[Any, Any]] = queue.Queue()

    def callback(result: Any, error: Any) -> None:
        results.put((result, error))

    triton_client.start_stream(callback=callback)
    inputs, x = _double_inputs()
    for i in range(3):
        triton_client.async_stream_infer("double", inputs, request_id=f"s{i}")
    got = [results.get(timeout=10) for _ in range(3)]
    triton_client.stop_stream()
    for i, (result, error) in enumerate(got):
        assert error is None
        assert result.get_response().id == f"s{i}"
        np.testing.assert_array_equal(result.as_numpy("y"), 2 * x)
