"""Build the built-in demo model repository (an MLP and a small ResNet) with onnx.

Weights come from fixed numpy seeds, so the written files are byte-identical across runs.
"""

from __future__ import annotations

import itertools
import os
import pathlib
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import numpy.typing as npt
import onnx
from onnx import TensorProto, helper, numpy_helper

from duetime.errors import ConfigError

OPSET = 17
IR_VERSION = 8  # lowest IR version that supports opset 17; widely loadable
PRODUCER = "duetime.demo"
BATCH_DIM = "batch"

MLP_SEED = 1234
RESNET_SEED = 5678
MLP_LAYERS = (40, 256, 256, 3)
RESNET_STEM = 32
RESNET_WIDE = 64
RESNET_CLASSES = 10
RESNET_IMAGE = 64
ORDERBOOK_SEED = 91011
ORDERBOOK_FEATURES = 21
"""Width of the order-book feature vector (`duetime.feeds.itch.features.FEATURE_NAMES`; a test
keeps the two equal, so the core never imports the feed handler)."""
ORDERBOOK_HIDDEN = 64
DEEPLOB_SEED = 121314
DEEPLOB_EVENTS = 100
DEEPLOB_COLUMNS = 40
"""DeepLOB's input: the last 100 book events x (price, size) x 10 levels x both sides."""
DEEPLOB_CHANNELS = 16
ORDERBOOK_CLASSES = 3
"""Mid-price move classes: down, unchanged, up."""

FloatArray = npt.NDArray[np.float32]


@dataclass
class _GraphBuilder:
    """Accumulates nodes and initializers with deterministic unique names."""

    rng: np.random.Generator
    nodes: list[onnx.NodeProto] = field(default_factory=list)
    inits: list[onnx.TensorProto] = field(default_factory=list)
    counter: int = 0

    def fresh(self, prefix: str) -> str:
        self.counter += 1
        return f"{prefix}_{self.counter}"

    def const(self, prefix: str, value: FloatArray) -> str:
        name = self.fresh(prefix)
        self.inits.append(numpy_helper.from_array(value.astype(np.float32), name))
        return name

    def node(self, op: str, inputs: list[str], output: str | None = None, **attrs: object) -> str:
        out = output if output is not None else self.fresh(op.lower())
        node = helper.make_node(op, inputs, [out], name=f"{out}_node")
        node.attribute.extend(helper.make_attribute(k, v) for k, v in sorted(attrs.items()))
        self.nodes.append(node)
        return out

    def he_normal(self, shape: tuple[int, ...], fan_in: int) -> FloatArray:
        weights: FloatArray = self.rng.standard_normal(shape, dtype=np.float32)
        return weights * np.float32(np.sqrt(2.0 / fan_in))


def _finish_model(
    b: _GraphBuilder, name: str, doc: str, inp: onnx.ValueInfoProto, out: onnx.ValueInfoProto
) -> onnx.ModelProto:
    """Wrap the builder's nodes into a checked ModelProto."""
    graph = helper.make_graph(b.nodes, name, [inp], [out], initializer=b.inits, doc_string=doc)
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET)],
        producer_name=PRODUCER,
        producer_version="1",
        doc_string=doc,
    )
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


def _tensor_info(name: str, dims: list[int]) -> onnx.ValueInfoProto:
    """FP32 value info with a symbolic leading batch dimension."""
    shape: list[int | str] = [BATCH_DIM, *dims]
    return helper.make_tensor_value_info(name, TensorProto.FLOAT, shape)


def build_mlp(seed: int = MLP_SEED) -> onnx.ModelProto:
    """MLP 40 -> 256 -> 256 -> 3 with ReLU after the hidden layers: x [N,40] -> y [N,3]."""
    b = _GraphBuilder(np.random.default_rng(seed))
    h = "x"
    last = len(MLP_LAYERS) - 2
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(MLP_LAYERS)):
        w = b.const("w", b.he_normal((fan_in, fan_out), fan_in))
        bias = b.const("b", (b.rng.standard_normal(fan_out) * 0.01).astype(np.float32))
        h = b.node("Gemm", [h, w, bias], output="y" if i == last else None)
        if i < last:
            h = b.node("Relu", [h])
    doc = "Demo MLP: 40 -> 256 -> 256 -> 3, ReLU activations, FP32, dynamic batch."
    inp, out = _tensor_info("x", [MLP_LAYERS[0]]), _tensor_info("y", [MLP_LAYERS[-1]])
    return _finish_model(b, "mlp", doc, inp, out)


def build_orderbook_mlp(seed: int = ORDERBOOK_SEED) -> onnx.ModelProto:
    """MLP over one book event's features: features [N,F] -> logits [N,3] (down, flat, up)."""
    b = _GraphBuilder(np.random.default_rng(seed))
    h = "features"
    widths = (ORDERBOOK_FEATURES, ORDERBOOK_HIDDEN, ORDERBOOK_HIDDEN, ORDERBOOK_CLASSES)
    last = len(widths) - 2
    for i, (fan_in, fan_out) in enumerate(itertools.pairwise(widths)):
        w = b.const("w", b.he_normal((fan_in, fan_out), fan_in))
        bias = b.const("b", np.zeros(fan_out, dtype=np.float32))
        h = b.node("Gemm", [h, w, bias], output="logits" if i == last else None)
        if i < last:
            h = b.node("Relu", [h])
    doc = (
        f"Demo order-book MLP: {ORDERBOOK_FEATURES} order-flow features -> {ORDERBOOK_HIDDEN} -> "
        f"{ORDERBOOK_HIDDEN} -> 3 logits (mid down, unchanged, up); random weights."
    )
    inp = _tensor_info("features", [ORDERBOOK_FEATURES])
    return _finish_model(b, "orderbook", doc, inp, _tensor_info("logits", [ORDERBOOK_CLASSES]))


def build_deeplob(seed: int = DEEPLOB_SEED) -> onnx.ModelProto:
    """A small DeepLOB-like CNN (Zhang, Zohren & Roberts 2019, without the inception and LSTM
    stages): lob [N,100,40] -> logits [N,3].

    As in DeepLOB, 1x2 stride-2 convolutions pair price with size, then the two sides of each
    level, then a 1x10 convolution spans the levels; 4x1 convolutions mix neighbouring events;
    average pooling over time stands in for the LSTM.
    """
    b = _GraphBuilder(np.random.default_rng(seed))
    c = DEEPLOB_CHANNELS
    image = np.array([-1, 1, DEEPLOB_EVENTS, DEEPLOB_COLUMNS], dtype=np.int64)
    b.inits.append(numpy_helper.from_array(image, "lob_shape"))
    h = b.node("Reshape", ["lob", "lob_shape"])
    layers = ((1, c, (1, 2), (1, 2)), (c, c, (4, 1), (1, 1)), (c, c, (1, 2), (1, 2)),
              (c, c, (4, 1), (1, 1)), (c, c, (1, 10), (1, 1)), (c, c, (4, 1), (1, 1)))  # fmt: skip
    for cin, cout, kernel, stride in layers:
        w = b.const("conv_w", b.he_normal((cout, cin, *kernel), cin * kernel[0] * kernel[1]))
        bias = b.const("conv_b", np.zeros(cout, dtype=np.float32))
        # NOTE: causal padding in time (3 events before, none after) keeps the 100 events
        pads = [kernel[0] - 1, 0, 0, 0]
        h = b.node("Conv", [h, w, bias], kernel_shape=list(kernel), strides=list(stride), pads=pads)
        h = b.node("LeakyRelu", [h], alpha=0.01)
    h = b.node("Flatten", [b.node("GlobalAveragePool", [h])], axis=1)
    w = b.const("fc_w", b.he_normal((c, ORDERBOOK_CLASSES), c))
    bias = b.const("fc_b", np.zeros(ORDERBOOK_CLASSES, dtype=np.float32))
    b.node("Gemm", [h, w, bias], output="logits")
    doc = (
        "Demo DeepLOB-like CNN: the last 100 book events x 10 levels x (price, size) x both sides "
        "-> 3 logits (mid down, unchanged, up); random weights."
    )
    inp = _tensor_info("lob", [DEEPLOB_EVENTS, DEEPLOB_COLUMNS])
    return _finish_model(b, "deeplob", doc, inp, _tensor_info("logits", [ORDERBOOK_CLASSES]))


def _conv_bn(b: _GraphBuilder, x: str, cin: int, cout: int, kernel: int, stride: int) -> str:
    """Bias-free Conv followed by an inference-mode BatchNormalization."""
    w = b.const("conv_w", b.he_normal((cout, cin, kernel, kernel), cin * kernel * kernel))
    pads = [kernel // 2] * 4
    y = b.node("Conv", [x, w], kernel_shape=[kernel] * 2, strides=[stride] * 2, pads=pads)
    scale = b.const("bn_scale", b.rng.uniform(0.5, 1.5, cout).astype(np.float32))
    bias = b.const("bn_bias", (b.rng.standard_normal(cout) * 0.1).astype(np.float32))
    mean = b.const("bn_mean", (b.rng.standard_normal(cout) * 0.1).astype(np.float32))
    var = b.const("bn_var", b.rng.uniform(0.5, 1.5, cout).astype(np.float32))
    return b.node("BatchNormalization", [y, scale, bias, mean, var], epsilon=1e-5)


def _residual_block(b: _GraphBuilder, x: str, cin: int, cout: int, stride: int) -> str:
    """Basic ResNet block: two 3x3 Conv-BN layers plus a (projected) shortcut."""
    h = b.node("Relu", [_conv_bn(b, x, cin, cout, 3, stride)])
    h = _conv_bn(b, h, cout, cout, 3, 1)
    shortcut = x if (cin == cout and stride == 1) else _conv_bn(b, x, cin, cout, 1, stride)
    return b.node("Relu", [b.node("Add", [h, shortcut])])


def build_resnet(seed: int = RESNET_SEED) -> onnx.ModelProto:
    """Small residual CNN: image [N,3,64,64] -> logits [N,10]."""
    b = _GraphBuilder(np.random.default_rng(seed))
    h = b.node("Relu", [_conv_bn(b, "image", 3, RESNET_STEM, 3, 2)])
    h = _residual_block(b, h, RESNET_STEM, RESNET_STEM, 1)
    h = _residual_block(b, h, RESNET_STEM, RESNET_WIDE, 2)
    h = _residual_block(b, h, RESNET_WIDE, RESNET_WIDE, 1)
    h = b.node("Flatten", [b.node("GlobalAveragePool", [h])], axis=1)
    w = b.const("fc_w", b.he_normal((RESNET_WIDE, RESNET_CLASSES), RESNET_WIDE) * np.float32(0.5))
    bias = b.const("fc_b", np.zeros(RESNET_CLASSES, dtype=np.float32))
    b.node("Gemm", [h, w, bias], output="logits")
    doc = (
        "Demo ResNet: Conv-BN-Relu stem 3->32 stride 2, a 32-ch residual block, "
        "a stride-2 block to 64 ch, a 64-ch block, GlobalAveragePool, Gemm -> 10 logits."
    )
    image = _tensor_info("image", [3, RESNET_IMAGE, RESNET_IMAGE])
    return _finish_model(b, "resnet", doc, image, _tensor_info("logits", [RESNET_CLASSES]))


def demo_files() -> dict[pathlib.PurePosixPath, bytes]:
    """Each file of the demo repository (its path in the repository) -> its content."""
    files: dict[pathlib.PurePosixPath, bytes] = {}
    for name, model, max_batch in (
        ("mlp", build_mlp(), 64),
        ("resnet", build_resnet(), 32),
        ("orderbook", build_orderbook_mlp(), 64),
        ("deeplob", build_deeplob(), 32),
    ):
        config = f"# {model.graph.doc_string}\nmax_batch_size = {max_batch}\n"
        files[pathlib.PurePosixPath(name, "config.toml")] = config.encode()
        data = model.SerializeToString(deterministic=True)
        files[pathlib.PurePosixPath(name, "1", "model.onnx")] = data
    return files


OnChange = Literal["refuse", "keep", "overwrite"]
"""What `write_demo_repository` does with a file there that differs from the demo's."""


class DemoFilesChanged(ConfigError):
    """Files of the repository differ from the demo's and were not overwritten (`changed`)."""

    def __init__(self, message: str, changed: list[pathlib.Path]) -> None:
        super().__init__(message)
        self.changed = changed


def write_demo_repository(
    path: str | os.PathLike[str], *, on_change: OnChange = "keep"
) -> pathlib.Path:
    """Write the demo repository to `path` (created if missing); returns the path.

    A demo file already there as the demo writes it is left alone; one that differs (a model
    of the user's of the same name, or a config `duetime optimize` added variants to) is, by
    `on_change`: "keep" (the default): kept as it is (`write_demo_files` says which);
    "refuse": DemoFilesChanged naming them, before anything is written; "overwrite": rewritten.

    NOTE: it rewrote every file: `duetime demo PATH` replaced a user's own `PATH/mlp` without a
    word, and each `serve --demo` undid what `duetime optimize` had made of the demo's models."""
    root = pathlib.Path(path)
    write_demo_files(root, on_change)
    return root


def write_demo_files(root: pathlib.Path, on_change: OnChange = "keep") -> list[pathlib.Path]:
    """`write_demo_repository`; returns the files that differ from the demo's and were kept
    (with `on_change` "keep"; none otherwise)."""
    files = {root / relative: content for relative, content in demo_files().items()}
    changed = [file for file, content in files.items() if _differs(file, content)]
    if changed and on_change == "refuse":
        names = ", ".join(str(file) for file in changed)
        verb = "differs" if len(changed) == 1 else "differ"
        raise DemoFilesChanged(
            f"{names} {verb} from the demo's (not written by it, or changed since); nothing "
            "was written",
            changed,
        )
    kept = changed if on_change == "keep" else []
    for file, content in files.items():
        if file in kept or (file.is_file() and file not in changed):
            continue
        file.parent.mkdir(parents=True, exist_ok=True)
        file.write_bytes(content)
    return kept


def _differs(file: pathlib.Path, content: bytes) -> bool:
    """Whether `file` is there with other content than `content` (a folder in its place
    differs)."""
    if not file.exists():
        return False
    if not file.is_file() or file.stat().st_size != len(content):
        return True
    return file.read_bytes() != content
