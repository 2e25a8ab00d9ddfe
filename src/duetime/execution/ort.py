"""ONNX Runtime sessions: options, the signature a graph declares, and string-tensor conversion."""

from __future__ import annotations

import contextlib
import ctypes
import functools
import hashlib
import logging
import os
import platform
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, cast

import numpy as np
import onnxruntime as ort

from duetime.cgroups import memory_limit
from duetime.datatypes import BFLOAT16, V2_OF_ONNX, unserved_output_reason
from duetime.errors import ConfigError, InvalidInput
from duetime.types import TensorSpec

log = logging.getLogger("duetime.ort")


def session_options(*, intra_op_threads: int, inter_op_threads: int) -> ort.SessionOptions:
    """Options for a serving session: full graph optimisation, sequential execution."""
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = inter_op_threads
    # NOTE: spinning ORT workers would steal the core the event loop needs on small machines.
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    # NOTE: fatal only: ORT logs a failing kernel at ERROR to stderr, so a client's bad value
    # (an index out of range) wrote a coloured line per request past the server's log level and
    # format; what a failure says reaches the client, and the server's log, as its exception.
    options.log_severity_level = 4
    return options


def open_session(
    model_path: Path, options: ort.SessionOptions, graph: bytes | None = None
) -> ort.InferenceSession:
    """An InferenceSession on the CPU, or ConfigError naming the file and ORT's reason.

    `graph`: the model's bytes as the loader rewrote them (repository/graphs.py), served in place
    of the file's; tensors the model keeps in files of their own are still read beside it."""
    source: str | bytes = str(model_path)
    if graph is not None:
        source = graph
        # NOTE: ORT looks for a graph-from-bytes' external data in the working directory, and
        # refuses it there (a path that "escapes" it), unless told the model's folder.
        options.add_session_config_entry(EXTERNAL_DATA_FOLDER, str(model_path.parent.absolute()))
    try:
        session = ort.InferenceSession(
            source, sess_options=options, providers=["CPUExecutionProvider"]
        )
    except Exception as exc:  # ORT raises its own exception types for bad graphs and files
        raise ConfigError(f"{model_path}: ONNX Runtime cannot load it: {exc}") from exc
    if getattr(session, "_model_bytes", None) is graph is not None:
        # NOTE: ORT's Python session keeps the bytes it was made from for as long as it lives
        # (its own "TODO: This is bad as we're holding the memory indefinitely"), to remake
        # itself on another provider: a second copy of the model, weights and all, for each
        # guarded model (905 vs 514 MB for a 400 MB one). On the CPU alone it is never remade.
        session._model_bytes = None
    return session


RUN_MEMORY_SHARE = 4
"""By default one run may allocate a quarter of the machine's memory (or of the cgroup's limit,
if lower): see `default_run_memory_bytes`."""


def default_run_memory_bytes() -> int:
    """The default limit on what one run's request may ask a node to allocate: a quarter
    (`RUN_MEMORY_SHARE`) of physical memory, or of this process's cgroups' limit if lower (v1
    or v2, its own group's or one above it: see `duetime.cgroups`)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # (not on this platform)
        total = 16 * 2**30
    limit = memory_limit()
    if limit is not None:
        total = min(total, limit)
    return max(total // RUN_MEMORY_SHARE, 1)


OUT_OF_MEMORY_MARKS = ("Failed to allocate memory", "bad_alloc")
"""What ORT's error says when a run's allocation failed: its arena's ("BFCArena::
AllocateRawInternal ... Failed to allocate memory for requested buffer of size N"), or the
plain allocator's (std::bad_alloc, with the arena off)."""


def out_of_memory(exc: BaseException, model: str) -> InvalidInput | None:
    """What a run that raised `exc` tells the client when its allocation failed (the request's
    values asked for more memory than the machine gives: a 400 naming the model, `model` as
    shown: `'m' version 1`, not a 500); None for any other failure."""
    text = str(exc)
    if isinstance(exc, MemoryError) or any(mark in text for mark in OUT_OF_MEMORY_MARKS):
        node = re.search(r"running (\w+) node\. Name:'([^']*)'", text)
        where = ""
        if node is not None:
            where = f" in its {node.group(1)} node" + (f" '{node[2]}'" if node[2] else "")
        return InvalidInput(
            f"model {model} ran out of memory{where}: the run needed more memory than the "
            "server has available for it; the request's values ask for too large a tensor "
            "(a shape or size input), ask for a smaller one"
        )
    return None


EXTERNAL_DATA_FOLDER = "session.model_external_initializers_file_folder_path"
"""ORT's session option naming the folder of a model's external data, for a model from bytes."""


CACHE_DIR = ".duetime-cache"
"""Folder beside a model file that holds ORT's optimised copy of it (ignored by the scanner)."""


def cached_session(
    model_path: Path, options: ort.SessionOptions, graph: bytes | None = None
) -> ort.InferenceSession:
    """A session on `model_path` (on `graph`, its bytes as rewritten, when given: see
    `open_session`), reusing the graph ORT optimised the last time it loaded these exact bytes
    (same ORT version and CPU features), or saving it for the next time.

    The cache is `<folder>/.duetime-cache/<name>.<key>.onnx`; a cache that cannot be written
    (a read-only repository) only costs the time it saves. A model whose tensors live in files
    of their own (ONNX external data) is not cached: ORT's optimised copy refers to those files
    by paths relative to the model, which do not resolve from the cache folder. It keeps
    `CACHE_KEEP` graphs of each model file (see `_prune_cache`).
    """
    try:
        key = _cache_key(model_path, graph)
    except OSError:
        return open_session(model_path, options, graph)
    if key is None:
        return open_session(model_path, options, graph)
    cached = model_path.parent / CACHE_DIR / f"{model_path.stem}.{key}.onnx"
    if _used_now(cached):
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        try:
            return open_session(cached, options)
        except ConfigError:
            log.warning("%s: cached optimised graph is unusable; optimising again", cached)
        finally:
            options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    partial = cached.with_name(f".{cached.name}.{os.getpid()}.partial")
    try:
        cached.parent.mkdir(exist_ok=True)
        options.optimized_model_filepath = str(partial)
    except OSError:
        return open_session(model_path, options, graph)
    try:
        session = open_session(model_path, options, graph)
    except ConfigError:
        # NOTE: saving the optimised graph fails for some models (over 2 GB, say) that load
        # fine without it; a model ORT cannot load at all fails again below.
        options.optimized_model_filepath = ""
        with contextlib.suppress(OSError):
            partial.unlink()
        return open_session(model_path, options, graph)
    finally:
        options.optimized_model_filepath = ""
    try:
        os.replace(partial, cached)
    except OSError as exc:
        log.info("%s: optimised graph not cached: %s", model_path, exc)
        with contextlib.suppress(OSError):
            partial.unlink()
    else:
        _prune_cache(cached, model_path.stem)
    return session


CACHE_KEEP = 2
"""Optimised graphs kept per model file: the one just written and the one used last before it.

NOTE: every graph written stayed: a version whose model.onnx changed in place left one more
at each reload, never to be read again (6 updates of a 275 KB model: 7 graphs, 1.9 MB), so a
server updated in place grew its repository without bound. One more than the newest keeps
the graph of the bytes served before (a rollback, or another server sharing the repository
that has not reloaded yet, still finds it), and both graphs of one file when its loader
serves rewritten bytes (repository/graphs.py) as well as the file's own."""


def _used_now(cached: Path) -> bool:
    """Whether the optimised graph `cached` is there; marks it used now (its access time), so
    that `_prune_cache` keeps it over graphs used before it."""
    try:
        os.utime(cached, ns=(time.time_ns(), cached.stat().st_mtime_ns))
    except FileNotFoundError:
        return False
    except OSError:  # (a read-only repository: its cache is never pruned here either)
        try:
            return cached.is_file()
        except OSError:  # (a cache folder it may not read: `is_file` raises PermissionError)
            return False
    return True


def _prune_cache(cached: Path, stem: str) -> None:
    """Remove the optimised graphs of the model file named `stem` beyond `CACHE_KEEP`, those
    used longest ago first; never `cached`, just written.

    A graph is read only while a session is made from it (a session keeps no hold on the
    file: a version serving needs its graph again only to load those bytes again), and a graph
    about to be read was marked used just before (`_used_now`), so it stays unless
    `CACHE_KEEP` newer graphs of the file are written meanwhile; even then its load only
    optimises again (`cached_session`'s fallback). Servers sharing the repository may prune at
    once: a graph already gone is no error, and a graph is only ever seen whole (written to a
    partial file, which this never matches, then renamed)."""
    pattern = re.compile(rf"{re.escape(stem)}\.[0-9a-f]{{{CACHE_KEY_CHARS}}}\.onnx")
    others: list[tuple[int, Path]] = []
    try:
        with os.scandir(cached.parent) as entries:
            for entry in entries:
                if entry.name == cached.name or not pattern.fullmatch(entry.name):
                    continue
                with contextlib.suppress(OSError):  # (gone meanwhile: another server pruned)
                    others.append((entry.stat(follow_symlinks=False).st_atime_ns, Path(entry)))
    except OSError:
        return
    others.sort(reverse=True)
    for _, stale in others[CACHE_KEEP - 1 :]:
        try:
            stale.unlink()
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.info("%s: stale optimised graph not removed: %s", stale, exc)
            return
        log.debug("%s: stale optimised graph removed", stale)


@contextlib.contextmanager
def private_external_data(model_path: Path) -> Iterator[Path]:
    """`model_path` as sessions should be opened on it: where the model keeps tensors in files
    of their own (ONNX external data), a copy of the model and those files in a private folder,
    removed once the block ends (the sessions opened in it keep their maps of the files: their
    pages outlive the names); else `model_path` itself.

    NOTE: ONNX Runtime maps external data files and reads the tensors in place, for as long as
    a session lives: a data file overwritten in place (`cp new c`, a download into place,
    `rsync --inplace`) changed the weights a serving version answered with, before any reload
    (rows of old and new weights mixed in its answers, 200 each), and one truncated first had
    the server killed by SIGBUS (found by a tester). Each version answers from its own copy now,
    which no one else writes. Where no copy can be made (no room in the temporary folder), it
    serves from the repository's files, with a warning."""
    try:
        files = _external_files(model_path)
    except Exception:  # (onnx cannot read it: ORT's refusal says why)
        files = []
    if not files:
        yield model_path
        return
    with tempfile.TemporaryDirectory(prefix="duetime-weights-") as private:
        folder = Path(private)
        try:
            needed = model_path.stat().st_size
            needed += sum((model_path.parent / relative).stat().st_size for relative in files)
            free = shutil.disk_usage(folder).free
            if needed + COPY_SPARE_BYTES > free:
                # (a copy that fills the folder would fail other programs' writes meanwhile)
                raise OSError(
                    f"{needed} bytes to copy, {free} free in the temporary folder {folder.parent}"
                )
            shutil.copyfile(model_path, folder / model_path.name)
            for relative in files:
                target = folder / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(model_path.parent / relative, target)
        except OSError as exc:
            log.warning(
                "%s: its external data is served from the repository's files, not a copy of "
                "its own (%s): rewriting them in place would change its answers or crash the "
                "server; replace them by renaming new files into place", model_path, exc,
            )  # fmt: skip
            yield model_path
            return
        yield folder / model_path.name


COPY_SPARE_BYTES = 256 << 20
"""Room a private copy of external data leaves free in the temporary folder (see
`private_external_data`): it is not made where it would leave less."""


def _external_files(model_path: Path) -> list[Path]:
    """The files, relative to the model's folder, that the model at `model_path` keeps tensors
    in (any graph's, subgraphs' too); those named outside the folder are left out (ORT refuses
    them: see the loader)."""
    if not _marked(_chunks(model_path)):
        return []
    import onnx  # (~0.5 s to import: only for a model that may have external data)
    from onnx.external_data_helper import _get_all_tensors

    model = onnx.load(str(model_path), load_external_data=False)
    folder = model_path.parent.resolve()
    found: dict[Path, None] = {}
    for tensor in _get_all_tensors(model):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            continue
        for entry in tensor.external_data:
            if entry.key == "location" and entry.value:
                path = (folder / entry.value).resolve()
                if path.is_relative_to(folder) and path.is_file():
                    found[path.relative_to(folder)] = None
    return list(found)


EXTERNAL_DATA_MARK = b"location"
"""The key every external-data entry of an ONNX tensor carries (`external_data` {key:
"location", value: <file>}). Its bytes anywhere in the file (a node named so, say) only cost the
model its cache."""


def _cache_key(model_path: Path, graph: bytes | None = None) -> str | None:
    """The model's bytes (the file's, or `graph`), ORT's version and the CPU, hashed; None for a
    model that looks like it keeps tensors in other files (see `EXTERNAL_DATA_MARK`)."""
    digest = hashlib.sha256()
    if _marked(_chunks(model_path) if graph is None else _slices(graph), digest.update):
        return None
    digest.update(f"{ort.__version__}/{platform.machine()}/{_cpu_features()}".encode())
    return digest.hexdigest()[:CACHE_KEY_CHARS]


def _marked(chunks: Iterable[bytes], seen: Callable[[bytes], object] | None = None) -> bool:
    """Whether the bytes of `chunks` hold `EXTERNAL_DATA_MARK` anywhere (no parse; a mark
    across two chunks too); `seen` is given each chunk read until then."""
    tail = b""
    for chunk in chunks:
        if seen is not None:
            seen(chunk)
        if EXTERNAL_DATA_MARK in tail + chunk:
            return True
        tail = chunk[1 - len(EXTERNAL_DATA_MARK) :]
    return False


CACHE_KEY_CHARS = 20
"""Hex digits of a cached graph's key (`_cache_key`), in its file name."""


def _chunks(path: Path, size: int = 1 << 20) -> Iterator[bytes]:
    with path.open("rb") as handle:
        while chunk := handle.read(size):
            yield chunk


def _slices(data: bytes, size: int = 1 << 20) -> Iterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


@functools.cache
def _cpu_features() -> str:
    """The CPU's feature flags (ORT's optimised graphs may use AVX-512 kernels, say)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as info:
            for line in info:
                if line.startswith(("flags", "Features")):
                    return hashlib.sha256(line.encode()).hexdigest()[:12]
    except OSError:
        pass
    return platform.processor()


def graph_specs(
    session: ort.InferenceSession, model_path: Path
) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The inputs and outputs the graph declares, with symbolic or unknown dims as -1.

    An output duetime cannot return (the `seq(map(...))` of a scikit-learn classifier's ZipMap,
    which the v2 protocol has no way to carry; a bfloat16 tensor beside a string input, which no
    OrtValue can be made of: see `bfloat16_run`) is left out with a warning saying why
    (`unserved_output_reason`): the model's other outputs (the predicted label) are still worth
    serving. An input that is not a tensor, or a graph with no tensor output at all, cannot be
    served.

    The inputs end with the optional ones: graph inputs that also have an initializer, which
    ONNX Runtime uses unless a request gives a value (`get_overridable_initializers`; models
    from older exporters list every weight so). One of a type the v2 protocol cannot carry is
    left out with a warning: its default still serves."""
    inputs = _specs(session.get_inputs(), model_path, "input")
    inputs += _specs(
        session.get_overridable_initializers(), model_path, "optional input", optional=True
    )
    unserved = _BFLOAT16 if _string_inputs(session) else ""  # (see `bfloat16_run`)
    outputs = _specs(
        session.get_outputs(), model_path, "output", skip_unsupported=True, unserved=unserved
    )
    if not outputs:
        kinds = ", ".join(f"'{arg.name}' {arg.type}" for arg in session.get_outputs())
        raise ConfigError(
            f"{model_path}: no output is a tensor ({kinds}), so duetime has nothing to serve; "
            f"supported: {', '.join(sorted(V2_OF_ONNX))}"
        )
    return inputs, outputs


def _specs(
    args: list[Any],
    model_path: Path,
    kind: str,
    *,
    skip_unsupported: bool = False,
    optional: bool = False,
    unserved: str = "",
) -> list[TensorSpec]:
    """`args`' specs; with `skip_unsupported`, those of a type the v2 protocol cannot carry, or
    of type `unserved`, are left out with a warning (an error otherwise)."""
    specs = []
    shapeless = _shapeless(model_path) if any(not arg.shape for arg in args) else frozenset()
    for arg in args:
        datatype = None if arg.type == unserved else V2_OF_ONNX.get(arg.type)
        if datatype is None:
            if optional:
                log.warning(
                    "%s: %s '%s' has type %s, which the v2 protocol cannot carry: requests "
                    "cannot give it (its initializer serves)", model_path, kind, arg.name,
                    arg.type,
                )  # fmt: skip
                continue
            if skip_unsupported:
                log.warning(
                    "%s: %s '%s' has type %s, not served: %s", model_path, kind, arg.name,
                    arg.type, unserved_output_reason(arg.type),
                )  # fmt: skip
                continue
            raise ConfigError(
                f"{model_path}: {kind} '{arg.name}' has type {arg.type}, which duetime cannot "
                f"serve; supported: {', '.join(sorted(V2_OF_ONNX))}"
            )
        shape = tuple(d if isinstance(d, int) and d >= 0 else -1 for d in (arg.shape or ()))
        specs.append(
            TensorSpec(arg.name, datatype, shape, any_rank=arg.name in shapeless, optional=optional)
        )
    return specs


def _shapeless(model_path: Path) -> frozenset[str]:
    """The graph's inputs and outputs declared with no shape at all.

    NOTE: ONNX Runtime reports those as [], as it does scalars; only the graph itself tells them
    apart (read without external data: the declarations are all that is wanted)."""
    import onnx  # (here: the onnx package costs ~0.3 s to import, and most graphs declare shapes)

    try:
        model = onnx.load(str(model_path), load_external_data=False)
    except Exception:  # (ORT read it: a file this cannot read is one ORT's own format took)
        return frozenset()
    return frozenset(
        value.name
        for value in (*model.graph.input, *model.graph.output)
        if value.type.HasField("tensor_type") and not value.type.tensor_type.HasField("shape")
    )


Run = Callable[[list[str], dict[str, np.ndarray]], list[np.ndarray]]
"""Runs a session: (output names, feeds) -> outputs."""

_BFLOAT16 = "tensor(bfloat16)"


def bfloat16_run(session: Any, run: Run, run_options: ort.RunOptions | None = None) -> Run:
    """`run`, for a session with bfloat16 inputs or outputs, taking and giving them as numpy
    arrays of BF16's dtype (ml_dtypes'); `run` itself for one with none.

    ONNX Runtime's Python API takes no such array ("Numpy_type 256 can't be converted to
    MLDataType") and gives none ("No corresponding Numpy type for Tensor Type"): a bfloat16
    input goes in as an OrtValue over its bits, which `run` takes beside numpy arrays; where an
    output is bfloat16, every input goes in as an OrtValue (`run_with_ort_values`) and that
    output's bits are copied out of its OrtValue. A string input cannot be an OrtValue: such a
    graph's bfloat16 outputs are not served (see `graph_specs`)."""
    try:
        inputs = [*session.get_inputs(), *session.get_overridable_initializers()]
        outputs = session.get_outputs()
    except AttributeError:  # (a stand-in session in tests)
        return run
    bfloat16_inputs = frozenset(arg.name for arg in inputs if arg.type == _BFLOAT16)
    if any(arg.type == _BFLOAT16 for arg in outputs) and not _string_inputs(session):

        def by_values(output_names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            values = {name: _ort_value(array) for name, array in feeds.items()}
            results = session.run_with_ort_values(output_names, values, run_options)
            return [_from_ort_value(value) for value in results]

        return by_values
    if not bfloat16_inputs:
        return run

    def with_values(output_names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        fed = {
            name: _ort_value(array) if name in bfloat16_inputs else array
            for name, array in feeds.items()
        }
        return run(output_names, fed)  # (OrtValues: `run` takes them)

    return with_values


def _ort_value(array: np.ndarray) -> ort.OrtValue:
    """`array` as an OrtValue (over its memory where it can: it keeps the array alive).

    NOTE: not `np.ascontiguousarray`, which makes a scalar (0-d) array 1-d: a scalar input went
    in as shape [1] (found by a tester)."""
    if not array.flags.c_contiguous:
        array = array.copy(order="C")
    if array.dtype == BFLOAT16:
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            array.view(np.uint16), _ONNX_BFLOAT16
        )
    return ort.OrtValue.ortvalue_from_numpy(array)


_ONNX_BFLOAT16 = 16
"""onnx.TensorProto.BFLOAT16 (onnx itself is not imported here)."""


def _from_ort_value(value: ort.OrtValue) -> np.ndarray:
    """A numpy array of an output's OrtValue: a bfloat16 one's bits copied out."""
    if value.data_type() != _BFLOAT16:
        return cast(np.ndarray, value.numpy())
    shape = tuple(value.shape())
    count = int(np.prod(shape, dtype=np.int64))
    if not count:
        return np.empty(shape, BFLOAT16)
    bits = (ctypes.c_uint16 * count).from_address(value.data_ptr())
    return np.ctypeslib.as_array(bits).copy().view(BFLOAT16).reshape(shape)


def direct_run(session: Any, run_options: ort.RunOptions | None = None) -> Run:
    """`session.run` without the Python wrapper's per-call checks (that every input is fed, that
    no OrtValue belongs to another session, that WebGPU graph capture is off): the validator has
    checked the feeds, which are numpy arrays, and the session is on the CPU. Measured: mlp
    batch 1, 10.3 -> 9.2 µs P50. Every run passes `run_options` (setting its `terminate` from
    another thread stops the run between nodes). Falls back to `session.run`, without the
    options, where the wrapper has no `_sess` (a stand-in session in tests). A session with
    string inputs gets their feeds' `bytes` elements made `str` first (`text_feeds`); one with
    bfloat16 inputs or outputs takes and gives them as numpy arrays (`bfloat16_run`)."""
    return bfloat16_run(session, _direct_run(session, run_options), run_options)


def _direct_run(session: Any, run_options: ort.RunOptions | None) -> Run:
    texts = _string_inputs(session)
    inner = getattr(session, "_sess", None)
    if inner is None or not callable(getattr(inner, "run", None)):
        if texts:
            return functools.partial(_run_texts, session.run, texts)
        return cast(Run, session.run)
    run = inner.run
    if texts:

        def with_options(output_names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
            return run(output_names, feeds, run_options)  # type: ignore[no-any-return]

        return functools.partial(_run_texts, with_options, texts)

    def direct(output_names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return run(output_names, feeds, run_options)  # type: ignore[no-any-return]  # (a call)

    return direct


def _run_texts(
    run: Callable[..., list[np.ndarray]],
    texts: frozenset[str],
    output_names: list[str],
    feeds: dict[str, np.ndarray],
) -> list[np.ndarray]:
    return run(output_names, text_feeds(feeds, texts))


def _string_inputs(session: Any) -> frozenset[str]:
    """The names of `session`'s string inputs (none known: none)."""
    try:
        return frozenset(arg.name for arg in session.get_inputs() if arg.type == "tensor(string)")
    except (AttributeError, TypeError):  # (a stand-in session in tests)
        return frozenset()


MAX_DIMS = 64
"""The most dims a tensor may have: numpy's own limit (an array of more cannot be made)."""


CHECKED_TEXT = np.dtype(object, metadata={"duetime": "bytes elements, all UTF-8"})
"""The dtype of a BYTES array whose elements are all `bytes` of valid UTF-8: the front ends'
codec makes its arrays so where it checked that (in C, over the request's own bytes), and
`strings_for_ort` trusts it. (numpy keeps the dtype, this very object, through views.)"""

RUN_TEXT_ELEMENTS = 4096
"""A CHECKED_TEXT input of more elements is made `str` in the run's thread (see `text_feeds`),
not on the event loop; fewer take under ~0.3 ms."""

TEXT_CHUNK = 65_536
"""Elements made `str` per call in the run's thread (~4 ms): between calls the event loop gets
the GIL back."""


def strings_for_ort(array: np.ndarray, input_name: str) -> np.ndarray:
    """BYTES elements as `str` (ONNX string tensors hold UTF-8 text); InvalidInput for an
    element that is not UTF-8 bytes or text (`i`: its index in row-major order). A CHECKED_TEXT
    array of more than `RUN_TEXT_ELEMENTS` elements comes back as a view, its elements left
    `bytes`, for `direct_run` to make `str` in the run's thread.

    NOTE: any other element was made its str(): the in-process Engine ran a model on "None" for
    a None and on "1.5" for a float, which every wire transport refuses ("BYTES 'data' element
    0 must be a string"). A str with a lone surrogate ('\\ud800') passed, and ORT's encoding of
    it failed the run: InvalidInput "ONNX Runtime could not run the model ...: 'utf-8' codec
    can't encode character", naming neither the input nor the element.

    NOTE: one by one, 4M one-byte elements (a 20 MB request) took 1.9 s on the event loop, every
    other request waiting. All `bytes` or all `str`, the usual, are now made so by calls that
    loop in C (`_all_text`, ~0.25 s for those 4M), and a request's that the codec checked, in
    the run's thread; anything else, and any fault, goes one element at a time (`_one_by_one`),
    which finds the element to name."""
    if array.dtype is CHECKED_TEXT and array.size > RUN_TEXT_ELEMENTS:
        # (a view, a new object: a template whose inputs went on as they are is remembered as
        # checked, and its next requests would skip the checks; see `Validator.prepare`)
        return array.view()
    items = array.reshape(-1).tolist() if array.dtype.kind in "OSU" else None
    texts = _all_text(items) if items else None
    if texts is None:
        return _one_by_one(array, input_name)
    out = np.empty(len(texts), dtype=object)
    out[:] = texts
    return out.reshape(array.shape)


def text_feeds(feeds: dict[str, np.ndarray], names: frozenset[str]) -> dict[str, np.ndarray]:
    """`feeds` with the `bytes` elements of inputs `names` made `str` (see `strings_for_ort`),
    `TEXT_CHUNK` elements per call: a new dict where one changes, else `feeds`."""
    changed: dict[str, np.ndarray] | None = None
    for name in names:
        array = feeds.get(name)
        if array is None or array.dtype != object:
            continue
        texts = _chunked_text(array, name)
        if texts is not array:
            changed = changed if changed is not None else dict(feeds)
            changed[name] = texts
    return feeds if changed is None else changed


def _chunked_text(array: np.ndarray, name: str) -> np.ndarray:
    """`array` with its `bytes` elements made `str`, a `TEXT_CHUNK` at a time (itself where all
    are `str` already: requests made so on the event loop)."""
    flat = array.reshape(-1)
    out: np.ndarray | None = None
    for start in range(0, flat.size, TEXT_CHUNK):
        part = flat[start : start + TEXT_CHUNK].tolist()
        try:
            texts = list(map(bytes.decode, part))  # (TypeError: one is not bytes)
        except TypeError:
            if _all_str(part):
                continue
            texts = [item.decode() if isinstance(item, bytes) else item for item in part]
        except UnicodeDecodeError:  # (checked before: not from a request the validator passed)
            raise InvalidInput(f"input '{name}': a BYTES element is not valid UTF-8") from None
        if out is None:
            out = flat.copy()  # (a new array: the request's, or the pool's, stays as it was)
        out[start : start + len(texts)] = texts
    return array if out is None else out.reshape(array.shape)


def _all_str(items: list[Any]) -> bool:
    try:
        "".join(items)  # (in C: TypeError where one is not a str)
    except TypeError:
        return False
    return True


def _all_text(items: list[Any]) -> list[Any] | None:
    """`items` as `str`, where all are `bytes` of UTF-8 or all `str` with a UTF-8 form (None:
    neither; `_one_by_one` then tells which element is at fault, if any)."""
    try:
        if isinstance(items[0], bytes):
            return list(map(bytes.decode, items))  # (TypeError: one is not bytes)
        if isinstance(items[0], str):
            # (a join checks each is a str, in C; its encoding, that none is a lone surrogate)
            joined = "".join(items)
            if not joined.isascii():
                joined.encode("utf-8")
            return items
    except (TypeError, UnicodeError):
        pass
    return None


def _one_by_one(array: np.ndarray, input_name: str) -> np.ndarray:
    """`strings_for_ort`, one element at a time."""
    flat = array.reshape(-1)
    out = np.empty(flat.shape, dtype=object)
    for i, item in enumerate(flat):
        if isinstance(item, bytes | bytearray | memoryview):  # (numpy's bytes_ too)
            try:
                out[i] = bytes(item).decode("utf-8")
            except UnicodeDecodeError:
                raise InvalidInput(
                    f"input '{input_name}': BYTES element {i} is not valid UTF-8; the model's "
                    "string tensor holds text"
                ) from None
        elif isinstance(item, str):  # (numpy's str_ too)
            if not item.isascii():
                try:
                    item.encode("utf-8")
                except UnicodeEncodeError:
                    raise InvalidInput(
                        f"input '{input_name}': BYTES element {i} is a string that is not "
                        "valid Unicode text (a lone surrogate): it has no UTF-8 form, and the "
                        "model's string tensor holds UTF-8 text"
                    ) from None
            out[i] = str(item)
        else:
            raise InvalidInput(
                f"input '{input_name}': BYTES element {i} must be bytes or a string, got "
                f"{type(item).__name__}"
            )
    return out.reshape(array.shape)


def strings_from_ort(array: np.ndarray) -> np.ndarray:
    """ORT string outputs (`str` objects) as BYTES elements (`bytes`)."""
    flat = array.reshape(-1)
    out = np.empty(flat.shape, dtype=object)
    for i, item in enumerate(flat):
        out[i] = item.encode("utf-8") if isinstance(item, str) else bytes(item)
    return out.reshape(array.shape)
