"""SizeCost: how much longer than its profile a run on inputs far bigger than the profile's
samples takes, learnt per input size from real runs; pure.

A model of free size (a free non-batch dim, or no batching at all) is profiled on samples of size
1. Its run time on a request is then the profile's (the fixed cost: a run on the samples) plus a
cost that follows the extra input bytes. Both are needed: a cost per byte learnt as run time
over bytes turned the fixed cost of a 28-byte request into 1 µs a byte, and the next 16 MB
request, which runs in 12 ms, was predicted at 57 s and refused for good.
"""

from __future__ import annotations

from dataclasses import dataclass

BYTES_DOMINATE = 2.0
"""A run teaches a cost per byte only when it took this many times the profile's fixed cost or
more: below that the extra bytes explain less of it than the fixed cost's own jitter (a 28-byte
request on a 30 µs model: a few µs of noise over 24 extra bytes is 0.2 µs a byte)."""
TAKE_ALPHA = 0.2
"""Weight of a new run of a size class already measured (an EWMA: it follows a change of
machine load, and one run does not move it far)."""
STALL_FACTOR = 2.0
"""A run counts at most this many times its class's current estimate: one run stalled by
something else (a preempted vCPU) must not double every prediction of its size."""
PROBE_GAP_MIN_NS = 1_000_000_000
"""How long after the last size probe another may run (see `SizeCost.may_probe`) ..."""
PROBE_GAP_MAX_NS = 64_000_000_000
"""... doubling after each, up to this, until a run shows a prediction twice too long."""


@dataclass(slots=True)
class _Class:
    ns_per_byte: float
    """Extra run time per extra input byte, over the profile's fixed cost."""
    measured_ns: int
    """When a run of this class last taught it."""


class SizeCost:
    """Extra run time for extra input bytes (over the profile samples' bytes), per size class:
    input sizes within a factor of two share one cost per byte.

    NOTE: one cost per byte for every size fits neither a cost that grows faster than the bytes
    (attention over a longer sequence) nor one that grows slower; each class has its own, and a
    size not measured yet borrows its nearest measured class's (`predict`).

    NOTE: predictions come from runs, and a request refused on them never runs: an estimate that
    came out too long (a run stalled by another process, a class borrowed from much bigger
    inputs) would refuse its size for good. `may_probe` lets an idle model admit one such
    request now and then to measure again, backing off while its runs confirm the estimates."""

    __slots__ = ("_classes", "_gap_ns", "_probed_ns")

    def __init__(self) -> None:
        self._classes: dict[int, _Class] = {}
        self._probed_ns = -(1 << 62)
        self._gap_ns = PROBE_GAP_MIN_NS

    def __bool__(self) -> bool:
        """Some run has taught a cost (else every size is predicted by the profile alone)."""
        return bool(self._classes)

    def predict(self, extra_bytes: int) -> int:
        """Extra ns for a run `extra_bytes` over its samples' bytes (0 when nothing is known)."""
        known = self._class_for(extra_bytes)
        return 0 if known is None else int(extra_bytes * known.ns_per_byte)

    def _class_for(self, extra_bytes: int) -> _Class | None:
        """The class whose cost a size is predicted by: its own, else the nearest measured."""
        if extra_bytes <= 0 or not self._classes:
            return None
        size = extra_bytes.bit_length()
        known = self._classes.get(size)
        if known is None:
            # NOTE: the nearest class below if there is one: a longer input costs at least as
            # much a byte for most models, and an estimate too short answers one request late
            # (its run then measures the class); one too long refuses the class unmeasured
            below = [c for c in self._classes if c < size]
            known = self._classes[max(below) if below else min(self._classes)]
        return known

    def observe(self, extra_bytes: int, extra_ns: int, fixed_ns: int, now_ns: int) -> None:
        """Fold in a run `extra_bytes` over its samples' bytes that took `extra_ns` longer than
        its profile's fixed cost `fixed_ns`. It teaches its size class when the bytes dominate
        it (see `BYTES_DOMINATE`), or when it shows the prediction for its size twice too long
        (then whatever its share: an estimate too long refuses requests, which never run)."""
        if extra_bytes <= 0:
            return
        extra_ns = max(0, extra_ns)
        long_by_far = self.predict(extra_bytes) >= 2 * max(1, extra_ns)
        if long_by_far:
            self._gap_ns = PROBE_GAP_MIN_NS  # estimates run long: measure again soon
        elif extra_ns < (BYTES_DOMINATE - 1) * fixed_ns:
            return
        size = extra_bytes.bit_length()
        rate = extra_ns / extra_bytes
        known = self._classes.get(size)
        if known is None:
            self._classes[size] = _Class(rate, now_ns)
            return
        known.measured_ns = now_ns
        if long_by_far:
            known.ns_per_byte = rate  # its estimate was wrong, not this run
        else:
            rate = min(rate, STALL_FACTOR * known.ns_per_byte)
            known.ns_per_byte += TAKE_ALPHA * (rate - known.ns_per_byte)

    def may_probe(self, extra_bytes: int, now_ns: int) -> bool:
        """Whether a request `extra_bytes` over its samples' bytes, refused only for its size's
        predicted cost, may run anyway to measure it (the caller checks the model is idle): when
        its size class was not measured within the probes' gap (a class borrowed from another
        size never was), nor was a probe admitted; if so, the next must wait twice as long.

        NOTE: a request that truly takes that long holds its instance for its whole run, so
        probes back off to one every `PROBE_GAP_MAX_NS` while their runs bear the estimates out;
        a run that shows one twice too long brings them back to `PROBE_GAP_MIN_NS`."""
        own = self._classes.get(extra_bytes.bit_length())
        gap = self._gap_ns
        if now_ns - self._probed_ns < gap or (own is not None and now_ns - own.measured_ns < gap):
            return False
        self._probed_ns = now_ns
        self._gap_ns = min(PROBE_GAP_MAX_NS, 2 * self._gap_ns)
        return True
