"""One run of `duetime optimize`, start to end: find the model version, run the primary on the
sample set, build and time each kind, then move the kept files into place and record them."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from duetime.config import ModelConfig, VariantQuality, VariantSpeed
from duetime.errors import ConfigError
from duetime.execution.ort import graph_specs, open_session, session_options
from duetime.repository.layout import MODEL_FILENAME, scan_model
from duetime.repository.loader import reconcile
from duetime.repository.tritonconfig import declared_filename, load_model_config
from duetime.tools.optimize.build import RUNS_ALONE, Builder, Built
from duetime.tools.optimize.measure import (
    Bounds,
    constant_class,
    nan_share,
    rounded,
    speeds,
    verdict,
)
from duetime.tools.optimize.options import (
    Kind,
    OptimizeError,
    OptimizeOptions,
    file_of,
    reason_of,
)
from duetime.tools.optimize.records import config_file, stage, update_config
from duetime.tools.optimize.report import OptimizeReport, VariantResult
from duetime.tools.optimize.samples import (
    SEED,
    Feeds,
    batches_of,
    free_dims,
    hold_out,
    load_calibration,
    random_samples,
    run_all,
)
from duetime.types import ModelSignature


@dataclass(frozen=True)
class Target:
    model_dir: Path
    version: int
    path: Path
    filename: str = MODEL_FILENAME
    """The version's model file as its config names it (`default_model_filename`)."""


def resolve_target(model_dir: Path, version: int | None) -> Target:
    """The model file to optimize; ConfigError naming the path when there is none."""
    if not model_dir.is_dir():
        raise ConfigError(f"{model_dir}: not a folder; expected a model folder REPO/MODEL")
    if (
        model_dir.name.isascii()
        and model_dir.name.isdigit()
        and (model_dir / MODEL_FILENAME).is_file()
    ):
        raise ConfigError(
            f"{model_dir} is a version folder; give the model folder {model_dir.parent} "
            f"and --version {model_dir.name}"
        )
    filename = declared_filename(model_dir)
    source = scan_model(model_dir, filename=filename)
    chosen = source.latest if version is None else version
    if chosen not in source.versions:
        found = ", ".join(str(v) for v in sorted(source.versions))
        raise ConfigError(f"{model_dir}: no version {chosen} holds a {filename}; found {found}")
    return Target(model_dir, chosen, source.versions[chosen], filename)


def optimize(options: OptimizeOptions, say: Callable[[str], None]) -> OptimizeReport:
    """Build, check and time each kind, then record the worthwhile ones in the model's config;
    `say` gets a line at each step.

    Raises ConfigError for a bad path, config or calibration file, and OptimizeError when the
    primary model cannot run on the sample inputs or takes no inputs to sample. A kind that
    cannot be built is reported as failed in the result; its config entry (if any) is left as
    it was.
    """
    started = time.perf_counter()
    target = resolve_target(options.model_dir, options.version)
    # NOTE: before anything is built: a config the results cannot be written to was refused
    # only after every kind was built and timed (minutes, for a big model)
    config_file(target.model_dir)
    config = load_model_config(target.model_dir)
    primary = open_session(target.path, session_options(intra_op_threads=1, inter_op_threads=1))
    signature = reconcile(config, *graph_specs(primary, target.path), source=str(target.model_dir))
    _refuse_without_inputs(target, signature)
    samples, calib, source = _sample_sets(options, signature)
    samples, reference = _reference(primary, samples, signature, options.calibration is None)
    say(f"{target.model_dir.name} version {target.version}: {len(reference[0])} samples ({source})")
    fixed = constant_class(reference[0])
    results: list[VariantResult] = []
    built: list[Built] = []
    with tempfile.TemporaryDirectory(prefix="duetime-optimize-") as scratch:
        builder = Builder(target.path, signature, samples, calib, Path(scratch), fixed is None)
        try:
            for kind in options.kinds:
                say(f"building {kind}")
                try:
                    _check_clash(config, kind)
                    built.append(builder.build(kind, reference))
                except Exception as exc:  # a kind that cannot be built is reported, not fatal
                    results.append(VariantResult(kind, file_of(kind), "failed", reason_of(exc)))
            say("timing")
            sessions = [primary, *(b.session for b in built)]
            try:
                one, top, bounds = speeds(sessions, samples, signature, options.measure_s)
            except Exception as exc:  # ORT's own exception types
                raise OptimizeError(f"timing failed: {reason_of(exc)}") from exc
            results += [
                _measured(b, one, top, bounds[i], i, signature, options)
                for i, b in enumerate(built)
            ]
            results.sort(key=lambda r: options.kinds.index(r.kind))
            config_path = _commit(target, results, built, fixed is None)
        finally:
            for b in built:
                b.temp.unlink(missing_ok=True)
    notes = builder.notes + _notes(options, target, results, config_path)
    if fixed is not None:
        notes.insert(0, _constant_class_note(target, fixed))
    texts = [s.name for s in signature.required_inputs if s.datatype == "BYTES"]
    if texts and options.calibration is None:
        notes.insert(0, (
            f"the random samples of the text (BYTES) input(s) {', '.join(texts)} are all empty "
            "strings: the quality figures say little of a variant; --calibration FILE.npz with "
            "real inputs would tell"
        ))  # fmt: skip
    if nans := nan_share(reference):
        notes.insert(0, (
            f"{target.model_dir.name} answers NaN for {nans:.1%} of its output values on the "
            "quality samples; a variant answering NaN there too counts as agreeing"
        ))  # fmt: skip
    return OptimizeReport(
        model=target.model_dir.name, version=target.version, samples=len(reference[0]),
        sample_source=source, max_batch=signature.max_batch_size if top else 0,
        primary_batch_1_us=rounded(one[0]), primary_max_batch_us=rounded(top[0]) if top else None,
        results=results, config_path=config_path, elapsed_s=time.perf_counter() - started,
        notes=notes, primary_file=target.filename,
    )  # fmt: skip


def _notes(
    options: OptimizeOptions, target: Target, results: list[VariantResult], config: Path | None
) -> list[str]:
    """What the reader of the table should also know."""
    notes = []
    if config is not None and config.suffix != ".toml":
        notes.append(f"{config} was rewritten with PyYAML, which keeps no comments")
    for r in results:
        stale = target.path.parent / r.file
        if r.status == "dropped" and stale.is_file():
            notes.append(f"{stale} (from an earlier run) is left in place, no longer listed")
    # (only for a variant that was built: a failed or refused int8-static calibrated nothing)
    static_built = any(r.kind == "int8-static" and r.status != "failed" for r in results)
    if options.calibration is None and static_built:
        notes.append("int8-static was calibrated on random inputs; --calibration FILE.npz "
                     "with real inputs gives it representative ranges")  # fmt: skip
    return notes


def _constant_class_note(target: Target, fixed: int) -> str:
    return (
        f"{target.model_dir.name} answers class {fixed} for every quality sample, so argmax "
        "agreement says nothing of a variant: variants are ranked by max abs error instead "
        "(samples of real inputs, --calibration FILE.npz, would tell more)"
    )


def _refuse_without_inputs(target: Target, signature: ModelSignature) -> None:
    """OptimizeError for a model that takes no inputs a request must give (none, or only
    optional ones, which keep their initializers' values in the samples: see random_samples).

    NOTE: such a model has no samples: nothing to compare a variant's answers with the
    primary's on, nor to calibrate int8-static with, nor to time a run on. It was run on an
    empty sample set and failed with "StopIteration at samples.py:179" and advice to give
    --calibration inputs, which it has none of."""
    if signature.required_inputs:
        return
    optional = ", ".join(repr(spec.name) for spec in signature.inputs)
    takes = "no inputs"
    if optional:
        takes = (
            f"only optional inputs ({optional}), and samples are drawn only for the inputs a "
            "request must give"
        )
    raise OptimizeError(
        f"{target.model_dir} version {target.version} takes {takes}: there is nothing to "
        "sample, so no variant's answers could be compared with the model's, nor int8-static "
        "calibrated; nothing was built (the model serves as it is)"
    )


def _sample_sets(options: OptimizeOptions, signature: ModelSignature) -> tuple[Feeds, Feeds, str]:
    """The quality sample set, the calibration set, and a description of where they came from.

    ConfigError when random samples cannot have the sizes real inputs have (see `free_dims`)."""
    if options.calibration is None and (free := free_dims(signature)):
        raise ConfigError(
            f"{options.model_dir}: input {'; '.join(free)} can be any size, and random samples "
            "would be 1 there (their quality and speed would say nothing of real inputs); pass "
            "--calibration FILE.npz with real inputs"
        )
    if options.calibration is not None:
        rows = load_calibration(options.calibration, signature)
        samples, calib = hold_out(options.calibration, rows, options.samples)
        used = len(next(iter(calib.values())))
        return samples, calib, (f"held out from {options.calibration}, calibrated on {used} others")
    # Random calibration data is drawn apart from the quality set, so quality is not in-sample.
    samples = random_samples(signature, options.samples, SEED)
    calib = random_samples(signature, options.samples, SEED + 1)
    return samples, calib, f"random, seed {SEED}"


def _reference(
    primary: Any, samples: Feeds, signature: ModelSignature, random: bool
) -> tuple[Feeds, list[np.ndarray]]:
    """The primary's outputs; random integer inputs that it rejects are retried as zeros."""
    batched = signature.max_batch_size > 0
    try:
        return samples, run_all(primary, batches_of(samples, signature), batched)
    except Exception as exc:  # ORT's own exception types
        first = exc
    if random and any(a.dtype.kind in "iu" for a in samples.values()):
        count = len(next(iter(samples.values())))
        zeros = random_samples(signature, count, SEED, zero_ints=True)
        try:
            return zeros, run_all(primary, batches_of(zeros, signature), batched)
        except Exception:
            pass
    if not random:
        raise OptimizeError(
            f"the primary model fails on the --calibration inputs ({reason_of(first)})"
        )
    raise OptimizeError(
        f"the primary model fails on the sample inputs ({reason_of(first)}); give --calibration "
        "FILE.npz with real inputs"
    )


def _check_clash(config: ModelConfig, kind: Kind) -> None:
    """Refuse `kind` when an entry of another kind already uses its name or its file."""
    for entry in config.variants:
        if entry.kind != kind and (entry.name == kind or entry.file == file_of(kind)):
            raise ValueError(
                f"variant '{entry.name}' (kind {entry.kind}) already uses the name {kind} or the "
                f"file {file_of(kind)}; not overwriting it"
            )


def _measured(
    built: Built,
    one: list[float],
    top: list[float] | None,
    bounds: tuple[Bounds, Bounds | None],
    index: int,
    signature: ModelSignature,
    options: OptimizeOptions,
) -> VariantResult:
    """The result of the `index`th built variant, given the medians (primary's first) and its
    time ratio's `bounds`."""
    alone = built.kind in RUNS_ALONE and top is not None  # (batches it never runs: not counted)
    batched = None if alone else top
    speed = VariantSpeed(
        batch_1_us=rounded(one[index + 1]), primary_batch_1_us=rounded(one[0]),
        max_batch_us=rounded(batched[index + 1]) if batched else None,
        primary_max_batch_us=rounded(batched[0]) if batched else None,
    )  # fmt: skip
    at_1, at_top = bounds
    bounds = (at_1, None if alone else at_top)
    status, reason = verdict(speed, signature.max_batch_size, options.keep_slower, bounds)
    if alone:
        reason += " (it runs each request alone: its activations are quantized dynamically)"
    quality = VariantQuality(
        max_abs_error=rounded(built.quality.max_abs_error),
        argmax_agreement=round(built.quality.argmax_agreement, 4),
        samples=built.quality.samples,
    )
    reason = f"{reason} ({built.note})" if built.note else reason
    return VariantResult(built.kind, file_of(built.kind), status, reason, quality, speed)


def _commit(
    target: Target, results: list[VariantResult], built: list[Built], by_argmax: bool
) -> Path | None:
    """Move the kept files into place, then write the config (so a reader never finds an entry
    without its file), its variants ranked `by_argmax`. Returns the config path, or None when
    nothing was written (nothing was measured, or nothing changes: see `update_config`).

    OptimizeError naming the file when one cannot be written; the folders are then as they were:
    the config is staged first (a folder that is not writable stops the run there), and should a
    later step fail, the files moved are moved back."""
    if all(r.status == "failed" for r in results):
        return None
    # NOTE: no rewrite when nothing changes: a config rewritten all the same had a new mtime,
    # and a server polling the repository reloaded the model for nothing
    update = update_config(target.model_dir, results, by_argmax)
    if update is None:
        return None
    path, text = update
    kept = {r.kind for r in results if r.status == "kept"}
    try:
        staged = stage(path, text.encode("utf-8"))
    except OSError as exc:
        raise _unwritable(exc, path) from None
    moved: list[tuple[Path, Path | None]] = []  # (a file put in place, its former self)
    try:
        for b in built:
            if b.kind in kept:
                moved.append(_put(b.temp, target.path.parent / file_of(b.kind)))
        os.replace(staged, path)
    except OSError as exc:
        staged.unlink(missing_ok=True)
        _put_back(moved)
        raise _unwritable(exc, path) from None
    for _, former in moved:
        if former is not None:
            former.unlink(missing_ok=True)
    return path


def _put(temp: Path, dest: Path) -> tuple[Path, Path | None]:
    """Move `temp` to `dest`, keeping the file it replaces as a hidden hard link (its former
    self, None when there was none) until the run is known to have gone through."""
    former = None
    if dest.exists():
        former = dest.with_name(f".{dest.name}.former.tmp")
        former.unlink(missing_ok=True)
        os.link(dest, former)
    try:
        os.replace(temp, dest)
    except OSError:
        if former is not None:
            former.unlink(missing_ok=True)
        raise
    return dest, former


def _put_back(moved: list[tuple[Path, Path | None]]) -> None:
    """Undo `_put`s, latest first: best effort, as the run is failing already."""
    for dest, former in reversed(moved):
        try:
            if former is None:
                dest.unlink(missing_ok=True)
            else:
                os.replace(former, dest)
        except OSError:
            pass


def _unwritable(exc: OSError, config: Path) -> OptimizeError:
    """One line naming the file: the one the OS named, or the config for our temp files."""
    where = exc.filename if exc.filename and not str(exc.filename).endswith(".tmp") else config
    return OptimizeError(f"cannot write {where}: {exc.strerror or exc}; nothing was changed")
