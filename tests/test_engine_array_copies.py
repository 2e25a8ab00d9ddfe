"""An in-process caller's arrays that ONNX Runtime cannot take as they are (transposed, strided,
big-endian) are copied on the caller's thread, before the request reaches the engine's loop: the
loop copied them as it checked the request, and a transposed 120 MB array held every other
caller's requests, on every model, for 3 s (found by a tester)."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from repo_models import scale_model, write_version

from duetime import Engine
from duetime.errors import InvalidInput

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    write_version(tmp_path, "m", 1, scale_model(2.0))
    return tmp_path


def _odd_arrays(folder: Path) -> dict[str, np.ndarray]:
    mapped = np.memmap(folder / "mapped.bin", dtype=np.float32, mode="w+", shape=(6, 4))
    mapped[:] = np.arange(24, dtype=np.float32).reshape(6, 4)
    return {
        "memmap, transposed": mapped.T,
        "transposed": np.arange(24, dtype=np.float32).reshape(6, 4).T,
        "strided": np.arange(48, dtype=np.float32).reshape(8, 6)[::2],
        "big-endian": np.arange(24, dtype=np.float32).reshape(4, 6).astype(">f4"),
    }


@pytest.mark.parametrize("kind", ["transposed", "strided", "big-endian", "memmap, transposed"])
def test_the_loop_gets_arrays_copied_on_the_callers_thread(
    repo: Path, tmp_path: Path, kind: str
) -> None:
    x = _odd_arrays(tmp_path)[kind][:, :4]
    assert not (x.flags.c_contiguous and x.dtype.isnative)
    with Engine.open(repo) as engine:
        seen: list[tuple[str, bool, bool]] = []
        submit = engine.submit

        def spying(request: Any, **kwargs: Any) -> Any:
            array = request.inputs["x"]
            seen.append(
                (threading.current_thread().name, array.flags.c_contiguous, array.dtype.isnative)
            )
            return submit(request, **kwargs)

        engine.submit = spying  # type: ignore[method-assign]
        got = engine.infer("m", {"x": x})["y"]
        assert seen
        assert all(contiguous and native for _, contiguous, native in seen), seen
        assert seen[0][0] != threading.current_thread().name  # (it was the loop's thread)
    np.testing.assert_array_equal(got, 2 * x.astype(np.float32))


def test_infer_async_from_another_loop_answers_a_transposed_array(repo: Path) -> None:
    x = np.arange(12, dtype=np.float32).reshape(4, 3).T  # [3, 4], F-ordered
    assert not x.flags.c_contiguous
    with Engine.open(repo) as engine:
        got = asyncio.run(engine.infer_async("m", {"x": x}))["y"]
    np.testing.assert_array_equal(got, 2 * x)


def test_an_array_too_big_to_copy_is_refused_naming_the_input(repo: Path) -> None:
    """A zero-stride view of 2**44 bytes takes a few bytes, and no machine has the memory to
    copy it: InvalidInput naming the input, not MemoryError (nor the loop held trying)."""
    view = np.lib.stride_tricks.as_strided(
        np.zeros(1, np.float32), shape=(2**40, 4), strides=(0, 0)
    )
    with Engine.open(repo) as engine:
        with pytest.raises(InvalidInput, match=r"input 'x': no memory to copy the array"):
            engine.infer("m", {"x": view})
        np.testing.assert_array_equal(
            engine.infer("m", {"x": np.ones((1, 4), np.float32)})["y"], np.full((1, 4), 2.0)
        )
