"""Router: picks the version and variant that answer a request, and mirrors shadow copies.

It reads one registry snapshot per request. Version: the one the request names, else the traffic
plan's (sticky key or weighted draw). Variant: the best one (primary first) whose scheduler
predicts a finish by the request's due time, while no cheaper one is backlogged (`_cascade`);
when none does, the cheapest one takes the request and its admission gives the client the
reason.
"""

from __future__ import annotations

import asyncio
import functools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from duetime.clock import Clock
from duetime.datatypes import is_float
from duetime.errors import (
    DeadlineExceeded,
    DuetimeError,
    InvalidInput,
    ModelOutputError,
    Overloaded,
)
from duetime.execution.executor import Feeds
from duetime.repository.registry import Deployment, Registry, ServedModel, ServedVersion
from duetime.routing.fit import chosen_by_weights
from duetime.routing.traffic import routing_key
from duetime.types import InferRequest
from duetime.validation import Prepared

SHADOW_DUE_NS = 1_000_000_000
"""Due time of a shadow copy of a request that has none (no timeout, no `default_timeout_ms`):
a copy not started by then is dropped, as one kept waiting behind real requests compares an
answer long given, and (kept forever) took the room of real requests (see
`ModelScheduler.submit_shadow`)."""


@dataclass(slots=True)
class ShadowStatistics:
    """How a shadow version's answers compared with the answering version's."""

    mirrored: int = 0
    compared: int = 0
    skipped: int = 0
    """Copies refused, failed or cancelled (by the shadow, or whose primary failed); refused
    also where the request's inputs do not fit the shadow's (the model's load warns of a
    shadow whose inputs never fit those of a version answering requests, and the index says
    so of it: see routing/fit.py `unfit_traffic`)."""
    dropped: int = 0
    """Of `skipped`, the copies the shadow version dropped unrun to keep its room and time for
    real requests: over its cap of copies in flight, its queue full, given up for a real
    request, or predicted or found unable to finish by their due time (see
    `ModelScheduler.submit_shadow`)."""
    mismatched: int = 0
    """Copies whose outputs differ from the answer's in names or shapes: nothing to compare
    element by element, and a divergence of its own (not counted as `compared`)."""
    argmax_disagreements: int = 0
    """Compared copies whose first output's argmax differs from the answer's somewhere, or
    differs from it by NaN or infinity anywhere (np.argmax takes a NaN for the largest)."""
    max_abs_diff: float = 0.0
    """Largest absolute difference of any output element seen so far; infinite once an element
    differed by NaN or infinity (a NaN where the other has a number, or in both)."""
    sum_max_abs_diff: float = 0.0

    def as_json(self) -> dict[str, float | int | str]:
        return {
            "mirrored": self.mirrored,
            "compared": self.compared,
            "skipped": self.skipped,
            "dropped": self.dropped,
            "mismatched": self.mismatched,
            "argmax_disagreements": self.argmax_disagreements,
            "argmax_disagreement_rate": self.argmax_disagreements / self.compared
            if self.compared
            else 0.0,
            "max_abs_diff": _json_float(self.max_abs_diff),
            "mean_max_abs_diff": _json_float(
                self.sum_max_abs_diff / self.compared if self.compared else 0.0
            ),
        }


def _json_float(value: float) -> float | str:
    """`value`, or "inf" where JSON has no number for it (the statistics' encoder, orjson,
    writes null for an infinity, which reads as no divergence at all)."""
    return value if value < math.inf else "inf"


@dataclass(slots=True, eq=False)
class Routed:
    """Where a request goes: the served model, the version and variant, the validated inputs."""

    served: ServedModel
    version: ServedVersion
    deployment: Deployment
    prepared: Prepared
    due_ns: int | None
    by_default: bool = False
    """`due_ns` is the one the model's `default_timeout_ms` set: the request brought none."""


class Router:
    """Routes requests over the registry's current snapshot."""

    def __init__(self, registry: Registry, clock: Clock, rng: random.Random | None = None) -> None:
        self._registry = registry
        self._clock = clock
        self._random = (rng or random.Random()).random
        self.shadows: dict[tuple[str, str], ShadowStatistics] = {}
        """(model, shadow version) -> comparison statistics; kept across reloads."""
        self.invalid: dict[tuple[str, str], int] = {}
        """(model, version) -> requests whose inputs failed validation (before any variant was
        chosen, so no scheduler saw them); kept across reloads."""

    def route(self, request: InferRequest) -> Routed:
        """Choose version and variant for `request` and validate its inputs; raises the error a
        client should see (unknown model or version, invalid input)."""
        served = self._registry.served(request.model, request.version)
        key: str | None = None
        if request.version:
            version = self._registry.served_version(served, request.version)
        else:
            traffic = served.traffic
            if traffic.split:
                key = routing_key(traffic.sticky_key, request.parameters, request.headers)
                version = served.versions[traffic.pick(key, self._random())]
            else:
                version = served.versions[traffic.versions[0]]
        now = self._clock.now_ns()
        if (
            not request.version
            and not version.primary.scheduler.available(now)
            and not _working(version, now)
        ):
            version = self._failover(served, version, key, now)
        primary = version.primary
        try:
            prepared = primary.model.validator.prepare(
                request.inputs, request.outputs, request.template
            )
        except InvalidInput as error:
            error.count_in(self.invalid, (served.name, version.version))
            if not request.version and (served.traffic.split or version.version != served.default):
                chosen_by_weights(error, served.name, version.version)  # (not what metadata says)
            raise
        # (the due time the scheduler will hold it to: the variant is chosen by it)
        due = primary.scheduler.due_by_default(request.due_ns, request.arrival_ns, now)
        deployment = primary
        # (a variant may lack an optional input: see loader.load_version)
        if len(version.variants) > 1 and not primary.model.validator.overrides(prepared):
            if due is not None:
                deployment = _cascade(version.variants, now, due, prepared.rows, request.priority)
            else:
                deployment = _undue(version.variants, now, request.priority)
        return Routed(
            served, version, deployment, prepared, due, request.due_ns is None and due is not None
        )

    def count_invalid(self, error: Exception, model: str, version: str | None) -> None:
        """Count `error`, where it is an InvalidInput not counted yet, among the invalid
        requests of `model` (`invalid`), as `route` counts those its inputs' checks refuse: a
        request its front end refused before routing it (its body or inputs could not be read,
        a bad parameter), under the version it names (None: the first its traffic goes to, as
        the header checks count it: `rest.Signatures`); not one to a model or version not
        served (a client's name is no label).

        NOTE: a 400 for a `data` count that does not match the shape, or a body that is not
        JSON, was counted in `duetime_requests_refused_total` but not in the model's
        `duetime_requests_total{outcome="invalid"}` (found by a tester)."""
        if not isinstance(error, InvalidInput) or error.counted:
            return
        if isinstance(error, ModelOutputError):  # (a model's output at fault, after its run)
            return
        served = self._registry.snapshot.models.get(model)
        if served is None:
            return
        if version:
            try:  # (`attribution` would name it as the client wrote it: a label per string)
                named = self._registry.served_version(served, version).version
            except DuetimeError:
                return
        else:
            named = served.traffic.versions[0]
        error.count_in(self.invalid, (served.name, named))

    def _failover(
        self, served: ServedModel, broken: ServedVersion, key: str | None, now: int
    ) -> ServedVersion:
        """Another version the traffic policy sends requests to, with a working instance,
        picked as the policy picks among those (by the sticky `key`, else by weight); the
        broken one when there is none (its scheduler then refuses with a Retry-After).

        NOTE: the first working version in version order took all of a broken version's
        traffic: with weights 1 (a canary), 1 and 98, losing the third sent 99% of requests
        to the canary."""
        traffic = served.traffic
        usable = {
            name
            for name in traffic.versions
            if served.versions[name] is not broken and _working(served.versions[name], now)
        }
        chosen = traffic.pick_among(usable, key, self._random())
        return broken if chosen is None else served.versions[chosen]

    def mirror(self, routed: Routed, request: InferRequest, answer: asyncio.Future[Feeds]) -> None:
        """Send copies of `request` to the model's shadow versions (each with its share of
        requests), at the lowest priority, and compare their outputs with `answer`'s. A copy is
        due when the request is, or `SHADOW_DUE_NS` after it arrived where it has no due time."""
        due = routed.due_ns
        compared: asyncio.Future[Feeds] | None = None
        for name, share in routed.served.traffic.shadows:
            if name == routed.version.version or self._random() >= share:
                continue
            stats = self.shadows.setdefault((routed.served.name, name), ShadowStatistics())
            stats.mirrored += 1
            shadow = routed.served.versions[name].primary
            inputs = request.inputs
            if request.protocol == "engine":  # (the caller's arrays: theirs again once answered,
                inputs = {k: np.array(v, copy=True) for k, v in inputs.items()}  # the copy later)
            try:
                prepared = shadow.model.validator.prepare(inputs, None)
            except DuetimeError:
                stats.skipped += 1
                continue
            if due is None:
                arrival = request.arrival_ns
                due = (self._clock.now_ns() if arrival is None else arrival) + SHADOW_DUE_NS
            copy = shadow.scheduler.submit_shadow(
                prepared.feeds, rows=prepared.rows, shape_key=prepared.shape_key, due_ns=due
            )
            if copy is None:
                stats.skipped += 1
                stats.dropped += 1
                continue
            if compared is None:
                compared = _answer_as_given(answer) if request.protocol == "engine" else answer
            _when_both_done(compared, copy, functools.partial(_compare, stats=stats))


def _answer_as_given(answer: asyncio.Future[Feeds]) -> asyncio.Future[Feeds]:
    """`answer`'s outputs copied as the model gave them, before its caller has them: an
    in-process caller's answer is its own, and it may change it in place.

    NOTE: compared with the caller's arrays once the shadow's copy ran (after the caller had
    them), an answer scaled in place by its caller counted as the shadow's divergence: two
    byte-identical versions showed argmax disagreements (found by a tester). The copy is taken
    in a callback registered before the caller's (or now, where the answer came already)."""
    given: asyncio.Future[Feeds] = answer.get_loop().create_future()

    def take(done: asyncio.Future[Feeds]) -> None:
        if done.cancelled():
            given.cancel()
        elif (error := done.exception()) is not None:
            given.set_exception(error)
        else:
            given.set_result({k: np.array(v, copy=True) for k, v in done.result().items()})

    if answer.done():
        take(answer)
    else:
        answer.add_done_callback(take)
    return given


def _cascade(
    variants: tuple[Deployment, ...], now: int, due: int, rows: int, priority: int
) -> Deployment:
    """The best variant that fits the request while no cheaper variant is backlogged; the
    cheapest when none does.

    NOTE: a backlogged cheaper variant means the CPU they share is busy: a request that the
    better variant would still fit in takes three or four cheaper requests' worth of it, and
    the cheaper variant's waiting requests, admitted on the CPU they expected, run late or
    expire. Under overload everything goes to the cheapest; below it, the best."""
    backlogged = [i for i, v in enumerate(variants) if v.scheduler.backlogged(now)]
    for candidate in variants[backlogged[-1] if backlogged else 0 :]:
        if candidate.scheduler.fits(now, due, rows, priority):
            return candidate
        candidate.scheduler.refresh_if_stale(now)  # (passed over on its predictions)
    return variants[-1]


def _undue(variants: tuple[Deployment, ...], now: int, priority: int) -> Deployment:
    """For a request with no due time: the best variant with a working instance and room in
    its queue; else the best working one, else the primary (whose scheduler then refuses,
    saying why).

    NOTE: a full queue on the primary sent the request back 429 while a cheaper variant sat
    idle: 12 closed-loop clients on a 7 ms model (max_queue_size = 2) with a 0.05 ms variant
    got 5,860 refusals and no answer from the variant."""
    for candidate in variants:
        if candidate.scheduler.available(now) and candidate.scheduler.has_room(priority):
            return candidate
    working = (d for d in variants if d.scheduler.available(now))
    return next(working, variants[0])


def _working(version: ServedVersion, now: int) -> bool:
    """Some variant of `version` has an instance whose circuit breaker lets work through."""
    return any(d.scheduler.available(now) for d in version.variants)


def _when_both_done(
    first: asyncio.Future[Feeds],
    second: asyncio.Future[Feeds],
    then: Callable[[asyncio.Future[Feeds], asyncio.Future[Feeds]], None],
) -> None:
    remaining = [2]

    def check(_: object) -> None:
        remaining[0] -= 1
        if remaining[0] == 0:
            then(first, second)

    first.add_done_callback(check)
    second.add_done_callback(check)


def _compare(
    answer: asyncio.Future[Feeds], copy: asyncio.Future[Feeds], stats: ShadowStatistics
) -> None:
    if answer.cancelled() or copy.cancelled() or answer.exception() or copy.exception():
        stats.skipped += 1
        if not copy.cancelled() and isinstance(copy.exception(), (Overloaded, DeadlineExceeded)):
            stats.dropped += 1  # (the shadow's scheduler dropped it: see `submit_shadow`)
        return
    primary, shadow = answer.result(), copy.result()
    if primary.keys() != shadow.keys() or any(
        shadow[name].shape != expected.shape for name, expected in primary.items()
    ):
        stats.mismatched += 1
        return
    worst = 0.0
    disagree = False
    first = True
    for name, expected in primary.items():
        got = shadow[name]
        if not (_numeric(expected.dtype) and _numeric(got.dtype)):
            continue
        with np.errstate(invalid="ignore"):  # (inf - inf: NaN, which is what it is)
            diff = np.abs(got.astype(np.float64) - expected.astype(np.float64))
        # NOTE: as tools/optimize/measure.py: a NaN difference is infinite. max() of a NaN and a
        # number gives either, and a shadow answering NaN (a broken fp16 conversion) showed a
        # divergence of 0.0 (np.argmax, taking a NaN for the largest, hid it there too)
        finite = bool(np.isfinite(diff).all())
        if expected.size:
            worst = max(worst, float(diff.max()) if finite else math.inf)
        if first and expected.ndim and expected.shape[-1] > 1:
            differs = np.argmax(got, axis=-1) != np.argmax(expected, axis=-1)
            disagree = bool(np.any(differs)) or not finite
        first = False
    stats.compared += 1
    stats.max_abs_diff = max(stats.max_abs_diff, worst)
    stats.sum_max_abs_diff += worst
    stats.argmax_disagreements += disagree


def _numeric(dtype: np.dtype[np.generic]) -> bool:
    """Whether outputs of `dtype` are compared as numbers (BF16's too: see datatypes.is_float)."""
    return dtype.kind in "biuf" or is_float(dtype)
