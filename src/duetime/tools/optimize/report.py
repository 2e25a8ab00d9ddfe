"""What became of each kind, and the whole run: `VariantResult` and `OptimizeReport`, printed as a
table (`format`) or written as JSON (`to_json`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from duetime.config import VariantQuality, VariantSpeed
from duetime.repository.layout import MODEL_FILENAME
from duetime.tools.optimize.options import Kind

Status = Literal["kept", "dropped", "failed"]


@dataclass
class VariantResult:
    """What became of one kind: built and listed (kept), built but not listed, or not built."""

    kind: Kind
    file: str
    status: Status
    reason: str
    quality: VariantQuality | None = None
    speed: VariantSpeed | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind, "file": self.file, "status": self.status, "reason": self.reason,
            "quality": self.quality.model_dump() if self.quality else None,
            "speed": self.speed.model_dump() if self.speed else None,
        }  # fmt: skip


@dataclass
class OptimizeReport:
    model: str
    version: int
    samples: int
    sample_source: str
    max_batch: int
    primary_batch_1_us: float
    primary_max_batch_us: float | None
    results: list[VariantResult]
    config_path: Path | None
    """The config file written; None when none was (nothing built, or nothing to record)."""
    elapsed_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    primary_file: str = MODEL_FILENAME
    """The version's own model file (the config's `default_model_filename`)."""

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model, "version": self.version, "samples": self.samples,
            "sample_source": self.sample_source, "max_batch": self.max_batch,
            "primary": {"batch_1_us": self.primary_batch_1_us,
                        "max_batch_us": self.primary_max_batch_us},
            "variants": [r.to_json() for r in self.results],
            "config": str(self.config_path) if self.config_path else None,
            "elapsed_s": round(self.elapsed_s, 2), "notes": self.notes,
        }  # fmt: skip

    def format(self) -> str:
        max_head = f"batch {self.max_batch} µs" if self.primary_max_batch_us else "max batch µs"
        rows = [("kind", "file", "max abs err", "argmax", "batch 1 µs", max_head, "result")]
        rows.append(("primary", self.primary_file, "-", "-", _us(self.primary_batch_1_us, None),
                     _us(self.primary_max_batch_us, None), ""))  # fmt: skip
        for r in self.results:
            q, s = r.quality, r.speed
            rows.append((
                r.kind, r.file if r.status == "kept" else "-",
                f"{q.max_abs_error:.3g}" if q else "-", f"{q.argmax_agreement:.3f}" if q else "-",
                _us(s.batch_1_us, s.primary_batch_1_us) if s else "-",
                _us(s.max_batch_us, s.primary_max_batch_us) if s else "-",
                f"{r.status}: {r.reason}",
            ))  # fmt: skip
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
        lines = [
            f"{self.model} version {self.version}: {self.samples} samples ({self.sample_source})"
        ]
        for row in rows:
            cells = [c.rjust(w) if 2 <= i <= 5 else c.ljust(w) for i, (c, w) in
                     enumerate(zip(row, widths, strict=False))]  # fmt: skip
            lines.append("  ".join([*cells, row[-1]]).rstrip())
        lines.append(f"updated {self._updated()} ({self.elapsed_s:.1f} s)")
        return "\n".join([*lines, *self.notes])

    def _updated(self) -> str:
        if self.config_path is not None:
            return str(self.config_path)
        if all(r.status == "failed" for r in self.results):
            return "nothing: no kind could be built"
        return "nothing: no kind was kept, and none of them was listed to remove"


def _us(value: float | None, primary: float | None) -> str:
    if value is None:
        return "-"
    text = f"{value:.0f}" if value >= 100 else f"{value:.1f}"
    return f"{text} (x{value / primary:.2f})" if primary else text
