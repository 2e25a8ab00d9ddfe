"""An engine's life: opened or started, closed (or not), and the interpreter's exit."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.unit.test_executor_close import FOREVER, loop_model

pytestmark = pytest.mark.timeout(120)


def loop_repo(root: Path) -> Path:
    """A repository of 'loop' (see `loop_model`), run on an instance thread."""
    version = root / "loop" / "1"
    version.mkdir(parents=True)
    (version / "model.onnx").write_bytes(loop_model())
    (version.parent / "config.toml").write_text('max_batch_size = 0\nexecution = "thread"\n')
    return root


def test_a_started_engine_left_open_with_a_run_in_flight_exits_with_the_programs_status(
    tmp_path: Path,
) -> None:
    """An `Engine.start` engine never aclose()d, its run still in ONNX Runtime (its infer_async
    given up): the interpreter aborted at exit (SIGABRT, "terminate called without an active
    exception"), its instance thread a daemon inside ORT."""
    repo = loop_repo(tmp_path)
    program = textwrap.dedent(f"""
        import asyncio, sys
        import numpy as np
        from duetime import Engine

        async def main():
            engine = await Engine.start({str(repo)!r})
            inputs = {{"n": np.array([{FOREVER}], np.int64), "x": np.zeros(1, np.float32)}}
            try:
                await asyncio.wait_for(engine.infer_async("loop", inputs), 0.3)
            except asyncio.TimeoutError:
                pass

        asyncio.run(main())
        sys.exit(7)
    """)
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=90
    )
    assert "terminate called" not in done.stderr
    assert done.returncode == 7, done.stderr
