"""`duetime replay --compare-outputs`: how one answer is compared with the recorded one.

Floats (BF16 too) match within the tolerances; integer, BOOL and BYTES outputs must be equal;
another datatype or shape is a difference; gRPC answers in typed `contents` keep their datatype.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from duetime.frontend.proto import grpc_service_pb2 as pb
from duetime.tools.capture import CapturedTensor
from duetime.tools.replay_payloads import Difference, compare_outputs, grpc_outputs


def compare(
    recorded: np.ndarray, answered: np.ndarray, rtol: float = 1e-5, atol: float = 1e-6
) -> Difference | None:
    return compare_outputs([CapturedTensor.of("y", recorded)], {"y": answered}, rtol, atol)


@pytest.mark.parametrize(
    ("recorded", "answered"),
    [
        ([[100001]], [[100002]]),  # within rtol 1e-5 as float64
        ([[2**62 + 1]], [[2**62 + 2]]),  # equal once rounded to float64
        ([[-(2**63)]], [[2**63 - 1]]),  # an int64 difference would overflow
    ],
)
def test_int64_outputs_that_moved_by_one_differ(
    recorded: list[list[int]], answered: list[list[int]]
) -> None:
    difference = compare(np.array(recorded, np.int64), np.array(answered, np.int64))
    assert difference is not None
    assert difference.output == "y"
    assert difference.max_abs_error == float(abs(answered[0][0] - recorded[0][0]))
    assert difference.problem.startswith("1 of 1 values differ, the first at [0, 0]")
    assert repr(recorded[0][0]) in difference.problem


@pytest.mark.parametrize("dtype", [np.int8, np.int32, np.uint8, np.uint64])
def test_every_integer_datatype_is_compared_exactly(dtype: type[np.generic]) -> None:
    want = np.array([1, 2, 100], dtype)
    assert compare(want, want.copy()) is None
    got = want.copy()
    got[2] = 101
    difference = compare(want, got, rtol=1.0, atol=1.0)  # tolerances are for floats only
    assert difference is not None
    assert difference.max_abs_error == 1.0
    assert "1 of 3 values differ, the first at [2]: 101, recorded 100" in difference.problem


def test_bool_and_bytes_outputs_are_compared_exactly() -> None:
    assert compare(np.array([True, False]), np.array([True, False])) is None
    flipped = compare(np.array([True, False]), np.array([True, True]))
    assert flipped is not None
    assert flipped.max_abs_error == 1.0
    words = np.array([b"cat", b"dog"], dtype=object)
    assert compare(words, words.copy()) is None
    changed = compare(words, np.array([b"cat", b"dot"], dtype=object))
    assert changed is not None
    assert math.isinf(changed.max_abs_error)
    assert "BYTES: 1 of 2 values differ, the first at [1]: b'dot', recorded b'dog'" in (
        changed.problem
    )


def test_another_datatype_or_shape_is_a_difference() -> None:
    want = np.array([1, 2], np.int64)
    other_type = compare(want, want.astype(np.int32))
    assert other_type is not None
    assert other_type.problem == "datatype INT32, recorded INT64"
    as_float = compare(want, want.astype(np.float32))
    assert as_float is not None
    assert as_float.problem == "datatype FP32, recorded INT64"
    other_shape = compare(want, want.reshape(1, 2))
    assert other_shape is not None
    assert other_shape.problem == "shape [1, 2], recorded [2]"


def test_floats_keep_their_tolerances_and_nan_matches_nan() -> None:
    want = np.array([1.0, np.nan, np.inf, -2.0], np.float32)
    assert compare(want, want.copy()) is None
    assert compare(want, want + np.float32(1e-7)) is None
    moved = compare(want, np.array([1.5, np.nan, np.inf, -2.0], np.float32))
    assert moved is not None
    assert moved.max_abs_error == pytest.approx(0.5)
    assert compare(want, np.array([1.5, np.nan, np.inf, -2.0], np.float32), rtol=1.0) is None
    # a NaN where a number was recorded (or the reverse) is a difference of unknown size
    nan = compare(want, np.array([np.nan, np.nan, np.inf, -2.0], np.float32))
    assert nan is not None
    assert math.isinf(nan.max_abs_error)
    flipped = compare(want, np.array([1.0, np.nan, -np.inf, -2.0], np.float32))
    assert flipped is not None
    assert math.isinf(flipped.max_abs_error)


def test_bf16_outputs_are_floats_within_the_tolerances() -> None:
    """BF16's dtype is no numpy float (its kind is "V"): now that BF16 answers are recorded,
    they were compared exactly, as integers, and any rounding was a difference."""
    want = np.array([1.0, 2.0, np.nan], ml_dtypes.bfloat16)
    step = np.array([1.0, 2.015625, np.nan], ml_dtypes.bfloat16)  # one bfloat16 step at 2
    assert compare(want, want.copy()) is None
    assert compare(want, step, rtol=1e-2) is None
    moved = compare(want, step)
    assert moved is not None
    assert moved.max_abs_error == pytest.approx(0.015625)
    assert moved.problem == "max abs error 0.0156"


def test_grpc_typed_contents_keep_their_datatype() -> None:
    response = pb.ModelInferResponse(model_name="m")
    small = response.outputs.add(name="small", datatype="INT8", shape=[2])
    small.contents.int_contents.extend([1, -2])
    real = response.outputs.add(name="real", datatype="FP32", shape=[1, 2])
    real.contents.fp32_contents.extend([0.5, 1.5])
    outputs = grpc_outputs(response.SerializeToString())
    assert outputs["small"].dtype == np.int8
    assert outputs["real"].dtype == np.float32
    recorded = [
        CapturedTensor.of("small", np.array([1, -2], np.int8)),
        CapturedTensor.of("real", np.array([[0.5, 1.5]], np.float32)),
    ]
    assert compare_outputs(recorded, outputs, 1e-5, 1e-6) is None


def test_the_first_mismatches_are_the_captures_first_whatever_order_answers_came_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Kept as answers came, answers out of order under load made "the first mismatches" 5, 6,
    9, 7, 8, or left a lower one out once MAX_MISMATCHES were kept (a full run's flaky test)."""
    from types import SimpleNamespace

    from duetime.tools import replay as replay_module
    from duetime.tools.replay_results import MAX_MISMATCHES, Tally

    monkeypatch.setattr(replay_module, "http_outputs", lambda body, head: {})
    monkeypatch.setattr(
        replay_module, "compare_outputs", lambda *args: Difference("y", 1.0, "differs")
    )
    count = 20
    plan = SimpleNamespace(
        offsets_ns=[0] * count, recorded=[()] * count, request_ids=[f"q{i}" for i in range(count)]
    )
    replay = SimpleNamespace(
        tally=Tally(), plan=plan, config=SimpleNamespace(rtol=1e-5, atol=1e-8), _grpc=False
    )
    came = [19, 9, 7, 5, 18, 6, 8, 20 + 1, 3, 12]  # (21: request 1 of the second loop)
    for rid in came:
        replay_module.Replay._compare(replay, rid, b"", None)  # type: ignore[arg-type]
    kept = replay.tally.mismatches
    assert replay.tally.mismatched == len(came)
    assert [(m.loop, m.index) for m in kept] == [(0, 3), (0, 5), (0, 6), (0, 7), (0, 8)]
    assert len(kept) == MAX_MISMATCHES
    assert kept[0].request_id == "q3"
