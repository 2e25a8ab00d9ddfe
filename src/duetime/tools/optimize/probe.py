"""Checks a built variant must pass before this process opens it: ONNX's model checker, then
ONNX Runtime opening it (and running one batch) in a child process, where a crash costs the
child and not the run."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx

from duetime.tools.optimize.samples import Feeds

_CHILD = """
import sys
from pathlib import Path
import numpy as np
from duetime.execution.ort import open_session, session_options
session = open_session(Path(sys.argv[1]), session_options(intra_op_threads=1, inter_op_threads=1))
with np.load(sys.argv[2], allow_pickle=True) as data:
    feeds = {name: data[name] for name in data.files}
session.run(None, feeds)
"""
# NOTE: the child opens the file as the run (and `duetime serve`) will, with duetime's own
# session options: ORT_ENABLE_ALL is what crashed on a mis-sorted fp16 graph (BASIC did not).
# allow_pickle: the feeds file is one this process has just written (text inputs are objects).


def check_graph(path: Path) -> None:
    """ValueError with the checker's first line when ONNX's checker rejects the file at `path`.

    NOTE: by path, not by a loaded proto: the checker then takes models over 2 GB."""
    try:
        onnx.checker.check_model(str(path))
    except onnx.checker.ValidationError as exc:
        raise ValueError(f"ONNX's model checker rejects it: {_first_line(exc)}") from None


def save_feeds(feeds: Feeds, path: Path) -> Path:
    """`feeds` as the .npz file `check_loads` hands its child."""
    np.savez(path, **feeds)  # type: ignore[arg-type]
    return path


def check_loads(path: Path, feeds: Path) -> None:
    """ValueError when ONNX Runtime dies (a signal) opening the model at `path` or running it on
    the `feeds` file. An ordinary failure is left to this process's own open, which says it
    better; whatever the child prints is dropped (ORT's warnings included)."""
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(path), str(feeds)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        check=False,
    )  # fmt: skip
    if child.returncode < 0:
        raise ValueError(f"ONNX Runtime crashed loading it ({_signal_name(-child.returncode)})")


def _signal_name(number: int) -> str:
    try:
        return f"signal {number}, {signal.Signals(number).name}"
    except ValueError:
        return f"signal {number}"


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:200] if lines else type(exc).__name__
