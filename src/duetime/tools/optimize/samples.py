"""The inputs a run compares answers on and calibrates with: random ones drawn from the model's
signature, or those of an .npz file; cut into the feeds a session runs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from duetime.datatypes import NUMPY_OF
from duetime.errors import ConfigError
from duetime.types import ModelSignature, TensorSpec

Feeds = dict[str, np.ndarray]
SEED = 0
RANDOM_INT_HIGH = 8
"""Random integer inputs are drawn from [0, 8): valid as small indices or category ids."""
HOLD_OUT_EVERY = 4
"""Of a --calibration file, every 4th sample is held out to compare answers on; the rest
calibrate int8-static."""
MIN_CALIBRATION_SAMPLES = 2 * HOLD_OUT_EVERY
"""The fewest samples a --calibration file may hold: two held out, six to calibrate on."""


def _per_sample_shape(spec: TensorSpec, batched: bool) -> tuple[int, ...]:
    return spec.shape[1:] if batched else spec.shape


def free_dims(signature: ModelSignature) -> list[str]:
    """The free dims of the required inputs that random samples would set to 1, besides the
    batch: "'image' dims 2, 3" (axes of the input's full shape).

    NOTE: a model that does not batch (max_batch_size 0) often still has a free leading dim, its
    own batch: 1 there is a size it takes, so that dim is not counted."""
    batched = signature.max_batch_size > 0
    found = []
    for spec in signature.required_inputs:
        skip = 1 if batched or spec.shape[:1] == (-1,) else 0
        axes = [str(axis) for axis, d in enumerate(spec.shape) if axis >= skip and d < 0]
        if axes:
            found.append(f"'{spec.name}' {'dims' if len(axes) > 1 else 'dim'} {', '.join(axes)}")
    return found


def random_samples(
    signature: ModelSignature, count: int, seed: int, *, zero_ints: bool = False
) -> Feeds:
    """`count` samples of every required input (optional ones keep their initializers),
    stacked on a new first axis; free dims are 1.

    Floats are standard normal; integers uniform in [0, RANDOM_INT_HIGH) (or zeros); text empty.
    """
    rng = np.random.default_rng(seed)
    batched = signature.max_batch_size > 0
    samples: Feeds = {}
    for spec in signature.required_inputs:
        shape = (count, *(d if d >= 0 else 1 for d in _per_sample_shape(spec, batched)))
        dtype = NUMPY_OF[spec.datatype]
        if spec.datatype == "BYTES":
            samples[spec.name] = np.full(shape, "", dtype=object)
        elif dtype.kind == "f":
            samples[spec.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype.kind == "b":
            samples[spec.name] = rng.integers(0, 2, shape).astype(dtype)
        else:
            high = 1 if zero_ints else RANDOM_INT_HIGH
            samples[spec.name] = rng.integers(0, high, shape).astype(dtype)
    return samples


def load_calibration(path: Path, signature: ModelSignature, count: int | None = None) -> Feeds:
    """The first `count` samples (default all) of an .npz file holding one array per required
    input, samples first."""
    arrays = _read_npz(path)
    wanted = [spec.name for spec in signature.required_inputs]
    if sorted(arrays) != sorted(wanted):
        raise ConfigError(
            f"--calibration {path}: holds arrays {sorted(arrays)}; the model's inputs are {wanted}"
        )
    batched = signature.max_batch_size > 0
    samples = {s.name: _fit(path, s, arrays[s.name], batched) for s in signature.required_inputs}
    sizes = {name: len(array) for name, array in samples.items()}
    if len(set(sizes.values())) != 1 or 0 in sizes.values():
        raise ConfigError(f"--calibration {path}: arrays need the same number of samples: {sizes}")
    return {name: array[:count] for name, array in samples.items()}


_NPZ_MAGIC = b"PK\x03\x04"
"""An .npz file is a zip archive; np.load reads anything else as an .npy array or a pickle."""


def _read_npz(path: Path) -> dict[str, np.ndarray]:
    try:
        with path.open("rb") as file:
            lead = file.read(len(_NPZ_MAGIC))
    except OSError as exc:
        raise ConfigError(f"--calibration {path}: cannot be read: {exc.strerror or exc}") from None
    if lead != _NPZ_MAGIC:
        raise ConfigError(
            f"--calibration {path}: not an .npz file (np.savez(path, name=array, ...) writes one, "
            "one array per model input)"
        )
    try:
        with np.load(path, allow_pickle=False) as data:
            return {name: data[name] for name in data.files}
    except (OSError, ValueError, EOFError) as exc:
        # NOTE: an object array (e.g. of Python strings) needs pickle, which a file given to
        # read should never run
        raise ConfigError(f"--calibration {path}: cannot be read as .npz: {exc}") from None


def _fit(path: Path, spec: TensorSpec, array: np.ndarray, batched: bool) -> np.ndarray:
    def fits(shape: tuple[int, ...], want: tuple[int, ...]) -> bool:
        return len(shape) == len(want) and all(
            w in (-1, d) for d, w in zip(shape, want, strict=True)
        )

    want = _per_sample_shape(spec, batched)
    if not fits(array.shape[1:], want):
        if not batched and want[:1] == (1,) and fits(array.shape[1:], want[1:]):
            array = array[:, None]  # a model fixed at batch 1: samples without that dim
        else:
            raise ConfigError(
                f"--calibration {path}: '{spec.name}' has shape {list(array.shape)}; expected "
                f"[samples, {', '.join(str(d) for d in want)}] (-1: any size)"
            )
    if spec.datatype == "BYTES":
        return _text(path, spec, array)
    dtype = NUMPY_OF[spec.datatype]
    if not np.can_cast(array.dtype, dtype, "same_kind"):
        raise ConfigError(
            f"--calibration {path}: '{spec.name}' is {array.dtype}; the model takes {spec.datatype}"
        )
    array = array.astype(dtype, copy=False)
    if array.dtype.kind in "fc":
        # NOTE: a NaN ended int8 calibration in ONNX Runtime's "AssertionError: scale issue"
        finite = np.isfinite(array).reshape(len(array), -1).all(axis=1)
        if not finite.all():
            bad = np.flatnonzero(~finite)
            raise ConfigError(
                f"--calibration {path}: '{spec.name}' holds NaN or infinite values in "
                f"{len(bad)} of its {len(array)} samples (the first: sample {bad[0]}); "
                "calibration needs finite values: drop or fix those samples"
            )
    return array


def _text(path: Path, spec: TensorSpec, array: np.ndarray) -> np.ndarray:
    """A BYTES input's samples as ONNX Runtime takes text: an object array of str (from a str
    array, or a bytes one read as UTF-8; ORT maps bytes objects to no string at all)."""
    if array.dtype.kind == "S":
        try:
            array = np.char.decode(array, "utf-8")
        except UnicodeDecodeError as exc:
            raise ConfigError(
                f"--calibration {path}: '{spec.name}' holds bytes that are not UTF-8 text: {exc}"
            ) from None
    elif array.dtype.kind != "U":
        raise ConfigError(
            f"--calibration {path}: '{spec.name}' is {array.dtype}; the model takes BYTES (text: "
            "save a str or bytes array)"
        )
    return array.astype(object)


def hold_out(path: Path, rows: Feeds, count: int) -> tuple[Feeds, Feeds]:
    """The samples of a --calibration file (`rows`) split in two, each of at most `count`: every
    HOLD_OUT_EVERY-th to compare answers on, the others to calibrate on. ConfigError when there
    are fewer than MIN_CALIBRATION_SAMPLES.

    NOTE: quality measured on the very samples int8-static was calibrated on is in-sample, and
    flatters it. Every 4th rather than the last quarter: a file sorted by class or by time gives
    both parts some of each."""
    total = len(next(iter(rows.values())))
    if total < MIN_CALIBRATION_SAMPLES:
        raise ConfigError(
            f"--calibration {path}: {total} samples; at least {MIN_CALIBRATION_SAMPLES} are "
            f"needed, as every {HOLD_OUT_EVERY}th is held out to compare answers on and the rest "
            "calibrate"
        )
    held = np.arange(total) % HOLD_OUT_EVERY == HOLD_OUT_EVERY - 1
    quality = {name: a[held][:count] for name, a in rows.items()}
    calibration = {name: a[~held][:count] for name, a in rows.items()}
    return quality, calibration


def batches_of(samples: Feeds, signature: ModelSignature, rows: int | None = None) -> list[Feeds]:
    """The sample set as run feeds: chunks of `rows` (default: the max batch), or one sample per
    run for a model that does not batch."""
    count = len(next(iter(samples.values())))
    if signature.max_batch_size == 0:
        return [{name: a[i, ...] for name, a in samples.items()} for i in range(count)]  # (arrays)
    step = rows or signature.max_batch_size
    return [{name: a[i : i + step] for name, a in samples.items()} for i in range(0, count, step)]


def first_rows(samples: Feeds, rows: int) -> Feeds:
    """The first `rows` samples as one batch, repeating the set when it is smaller."""
    return {name: np.take(a, np.arange(rows) % len(a), axis=0) for name, a in samples.items()}


def run_all(session: Any, batches: list[Feeds], batched: bool) -> list[np.ndarray]:
    """Every output over the whole sample set, samples first."""
    runs = [session.run(None, feeds) for feeds in batches]
    join = np.concatenate if batched else np.stack
    return [join([run[i] for run in runs]) for i in range(len(runs[0]))]
