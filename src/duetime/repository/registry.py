"""Registry: the table of served models, swapped as a whole so readers never see it half-made."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType

from duetime.config import PRIMARY_VARIANT, TrafficConfig
from duetime.errors import DuetimeError, InvalidInput, ModelNotFound, ModelUnavailable
from duetime.repository.layout import VERSION_MAX, version_of
from duetime.repository.loader import LoadedModel
from duetime.routing.traffic import TrafficPlan, plan_traffic
from duetime.scheduling.scheduler import ModelScheduler, SchedulerStatistics, combined

PRIMARY = PRIMARY_VARIANT
"""The variant name of a version's own `model.onnx` (reserved: see config.VariantConfig)."""

UNKNOWN_MODEL = "Request for unknown model: "
"""How the errors of a model or version not served start, as Triton's do ("Request for unknown
model: 'x' is not found", "... 'x' version 3 is not found", "... 'x' has no available
versions"): its example clients and QA tests match on these words. duetime's detail (what is
served, why not) follows them."""


RESOLVED_MAX = 1024
"""Model and version pairs whose scheduler `Registry.scheduler_of` keeps per snapshot."""
VERSION_SHOWN = 64
"""How much of a malformed version string an error repeats (a gRPC request's can be long)."""


@dataclass(frozen=True, slots=True, eq=False)
class Deployment:
    """A loaded variant of a version with the scheduler that feeds its instances."""

    model: LoadedModel
    scheduler: ModelScheduler
    variant: str = PRIMARY


@dataclass(frozen=True, slots=True, eq=False)
class ServedVersion:
    """One version: its primary model first, then its cheaper variants, best first."""

    version: str
    variants: tuple[Deployment, ...]
    primary: Deployment = field(init=False)
    """`variants[0]` (a field, not a property: every request reads it)."""

    def __post_init__(self) -> None:
        if not self.variants:
            raise ValueError(f"version {self.version}: a served version has at least one variant")
        object.__setattr__(self, "primary", self.variants[0])

    def takes_work(self, now_ns: int) -> bool:
        """Whether some variant takes requests now: not every instance's breaker open (a
        half-open one lets its probe through)."""
        return any(d.scheduler.available(now_ns) for d in self.variants)


@dataclass(frozen=True, slots=True)
class ServedModel:
    """All served versions of one model; `traffic` spreads requests that name no version."""

    name: str
    versions: Mapping[str, ServedVersion]
    default: str
    """The highest served version: what metadata calls without a version describe."""
    traffic: TrafficPlan

    def version(self, version: str) -> ServedVersion:
        """The served `version` ("01" is version 1, as Triton parses it), ModelNotFound, or
        InvalidInput for a `version` that is not a version number at all.

        NOTE: "abc" and "-1" were told "version abc is not found" (404 / NOT_FOUND), as if a
        version so named might exist; they are malformed requests, as Triton answers them
        (INVALID_ARG from its GetModelVersionFromString, whose words begin the message)."""
        found = self.versions.get(version)
        if found is None:
            number = parse_version(self.name, version)
            found = self.versions.get(str(number))
            if found is None:
                loaded = ", ".join(sorted(self.versions, key=int))
                raise ModelNotFound(
                    f"{UNKNOWN_MODEL}'{self.name}' version {version} is not found; loaded "
                    f"versions: {loaded}"
                )
        return found


def parse_version(model: str, version: str) -> int:
    """The version number a request's `version` string names, or InvalidInput (Triton's
    INVALID_ARG) for one that is not a version: not a non-negative int64 ("abc", "-1",
    "99999999999999999999")."""
    number = version_of(version)
    if number is None:
        shown = version[:VERSION_SHOWN] + ("..." if len(version) > VERSION_SHOWN else "")
        raise InvalidInput(
            f"failed to get model version from specified version string '{shown}' of model "
            f"'{model}': model_version must be a non-negative integer of at most "
            f"{VERSION_MAX} (the name of a version folder, such as 1), or empty for the "
            "default version"
        )
    return number


@dataclass(frozen=True, slots=True)
class Loading:
    """A load of a model under way: about how long it takes, and the versions it loads that do
    not serve yet (their requests are told to come back, not that they are unknown)."""

    expected_s: float
    versions: frozenset[str] = frozenset()


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One immutable routing table; the registry replaces it, never edits it."""

    models: Mapping[str, ServedModel] = field(default_factory=dict)
    failures: Mapping[str, str] = field(default_factory=dict)
    """Model name -> why it could not be loaded (while no version of it is served)."""
    closed: bool = False
    """The server is shutting down: a model it served is unavailable (503, retry elsewhere),
    not unknown (404, which clients and load balancers take as final)."""
    loading: Mapping[str, Loading] = field(default_factory=dict)
    """Model name -> its load under way: a model that nothing of serves yet, or a version of it
    that does not serve yet, is told to come back (503), not that it is unknown (404)."""

    retiring: tuple[Deployment, ...] = ()
    """Deployments a publish took out of `models` (replaced by a reload, or unloaded) that had
    not finished draining at the last publish, oldest first: what they answer counts (see
    `statistics`)."""
    retired: Mapping[Labels, SchedulerStatistics] = field(default_factory=dict)
    """The final counts of retired deployments, by (model, version, variant), kept while a
    deployment so labelled serves or drains: its series go on from them."""

    def deployments(self) -> Iterator[Deployment]:
        for served in self.models.values():
            for version in served.versions.values():
                yield from version.variants

    def statistics(self, deployment: Deployment) -> SchedulerStatistics:
        """`deployment`'s statistics (a served one, or one of `draining_only`), with the counts
        of those it replaced (same model, version and variant) added: draining ones, and closed
        ones (see `retired`)."""
        key = labels(deployment)
        others = [  # (newest first: `retiring` is oldest first, and `retired` older still)
            d.scheduler.statistics()
            for d in reversed(self.retiring)
            if d is not deployment and labels(d) == key
        ]
        if key in self.retired:
            others.append(self.retired[key])
        return combined(deployment.scheduler.statistics(), *others)

    def draining_only(self) -> list[Deployment]:
        """The retiring deployments that no served one has the labels of (their version was
        unloaded), one per labels: each the newest."""
        served = {labels(d) for d in self.deployments()}
        alone: dict[Labels, Deployment] = {}
        for deployment in self.retiring:
            if labels(deployment) not in served:
                alone[labels(deployment)] = deployment
        return list(alone.values())


Labels = tuple[str, str, str]


def labels(deployment: Deployment) -> Labels:
    """A deployment's (model, version, variant): its series' labels."""
    return (deployment.model.name, deployment.model.version, deployment.variant)


def _retire(
    old: Snapshot, models: Mapping[str, ServedModel]
) -> tuple[tuple[Deployment, ...], Mapping[Labels, SchedulerStatistics]]:
    """`retiring` and `retired` of the snapshot that serves `models` after `old`: the
    deployments `old` served that `models` does not join the retiring ones; those finished
    (closed and drained) fold their final counts into `retired`; counts of labels that nothing
    serves or drains any more are forgotten (a version loaded again starts from zero)."""
    served = [d for m in models.values() for v in m.versions.values() for d in v.variants]
    # (by scheduler: it holds the counts, and a publish may wrap one in a new Deployment)
    seen = {id(d.scheduler) for d in served}
    retiring = []
    for deployment in (*old.retiring, *old.deployments()):
        if id(deployment.scheduler) not in seen:
            seen.add(id(deployment.scheduler))
            retiring.append(deployment)
    retired = dict(old.retired)
    still: list[Deployment] = []
    for deployment in retiring:
        if deployment.scheduler.finished:
            key = labels(deployment)
            final = deployment.scheduler.statistics()
            retired[key] = combined(final, retired[key]) if key in retired else final
        else:
            still.append(deployment)
    known = {labels(d) for d in (*served, *still)}
    retired = {key: stats for key, stats in retired.items() if key in known}
    return tuple(still), MappingProxyType(retired)


class Registry:
    """Publishes models by swapping one reference; resolves model and version names."""

    def __init__(self) -> None:
        self.snapshot = Snapshot()
        self._schedulers_of = self.snapshot
        self._schedulers: dict[tuple[str, str | None], ModelScheduler | None] = {}
        """`scheduler_of` each model and version asked, in the snapshot `_schedulers_of`."""
        self.load_failure: Callable[[str, str], str | None] = _no_failure
        """Why version V of model M failed to load, if it did (its repository index reason;
        set by the model manager): a request for it is told that (see `served_version`)."""
        self.on_demand: Callable[[], Iterable[str]] = tuple
        """The models not served that a request loads first (lazy loading; set by the model
        manager): a request for an unknown model is told them with the served ones."""

    def publish(
        self, name: str, versions: Mapping[str, ServedVersion], traffic: TrafficConfig
    ) -> None:
        """Serve exactly `versions` of `name` from now on (none: stop serving it)."""
        snapshot = self.snapshot
        models = dict(snapshot.models)
        if versions:
            default = max(versions, key=int)
            plan = plan_traffic(traffic, list(versions), default)
            models[name] = ServedModel(name, MappingProxyType(dict(versions)), default, plan)
        else:
            models.pop(name, None)
        failures = {k: v for k, v in snapshot.failures.items() if k != name or not versions}
        retiring, retired = _retire(snapshot, models)
        self.snapshot = Snapshot(
            MappingProxyType(models),
            MappingProxyType(failures),
            loading=snapshot.loading,
            retiring=retiring,
            retired=retired,
        )

    def prune_retiring(self) -> None:
        """Fold the retiring deployments that have finished (closed, drained, idle) out of the
        snapshot now: their final counts go into `retired` (kept while a deployment of the same
        labels serves or drains, forgotten otherwise, as `_retire` decides) and the snapshot
        holds them, their sessions and schedulers, no longer. What a drain calls as it ends.

        NOTE: only a publish folded them, so a deployment that finished draining after a
        reload or an unload stayed in `retiring` until some later publish, which may never
        come: its session and scheduler were kept alive, an unloaded version's series kept
        being exported and every scrape read its statistics (found by a reviewer)."""
        snapshot = self.snapshot
        if not any(d.scheduler.finished for d in snapshot.retiring):
            return
        retiring, retired = _retire(snapshot, snapshot.models)
        self.snapshot = replace(snapshot, retiring=retiring, retired=retired)

    def record_failure(self, name: str, reason: str | None) -> None:
        """Remember why `name` is not served (None forgets it)."""
        snapshot = self.snapshot
        failures = {k: v for k, v in snapshot.failures.items() if k != name}
        if reason is not None:
            failures[name] = reason
        self.snapshot = replace(snapshot, failures=MappingProxyType(failures))

    def record_loading(
        self, name: str, expected_s: float | None, versions: Iterable[str] = ()
    ) -> None:
        """Say that `name` is loading, `versions` of it that do not serve yet among what it
        loads, and that the load takes about `expected_s` (None: the load has ended, served or
        failed)."""
        snapshot = self.snapshot
        loading = {k: v for k, v in snapshot.loading.items() if k != name}
        if expected_s is not None:
            loading[name] = Loading(expected_s, frozenset(versions))
        self.snapshot = replace(snapshot, loading=MappingProxyType(loading))

    def clear(self) -> list[Deployment]:
        """Stop serving everything (for good: requests are told the server is shutting down);
        returns what was served so the caller can drain and close it."""
        old = self.snapshot
        self.snapshot = Snapshot(closed=True)
        return list(old.deployments())

    def served(self, name: str, version: str | None = None) -> ServedModel:
        """The served model `name`, or the error a client should see; a request's `version`
        that is not a version at all is refused first (see `version`)."""
        if version:
            parse_version(name, version)
        snapshot = self.snapshot
        served = snapshot.models.get(name)
        if served is None:
            if name in snapshot.loading:
                # NOTE: a 404 here ("unknown model"), as before, told clients and load
                # balancers that take it as final that a model still loading is not there
                wait_s = retry_after_s(snapshot.loading[name].expected_s)
                raise ModelUnavailable(
                    f"{UNKNOWN_MODEL}'{name}' has no available versions: it is loading (a load "
                    f"takes about {wait_s} s); retry shortly",
                    retry_after_s=wait_s,
                )
            if name in snapshot.failures:
                # (Triton's words first, as its QA tests expect; duetime's reason after them)
                raise ModelUnavailable(
                    f"{UNKNOWN_MODEL}'{name}' has no available versions: {snapshot.failures[name]}"
                )
            if snapshot.closed:
                raise ModelUnavailable(
                    f"model '{name}': the server is shutting down; retry on another replica"
                )
            # NOTE: with lazy loading, the models not loaded yet were left out: a mistyped
            # name was told "served models: none" while every model of the repository served
            # on request (found by a tester)
            later = sorted(set(self.on_demand()) - snapshot.models.keys())
            if name in later:
                # NOTE: it was "not found" (404, NOT_FOUND: final to a client) for its metadata
                # and HTTP readiness, its message listing it as served, where gRPC's ModelReady
                # and V1 said not ready (found by a tester)
                raise ModelUnavailable(
                    f"{UNKNOWN_MODEL}'{name}' has no available versions: it is not loaded yet; "
                    "it loads on its first inference request (--lazy-load)"
                )
            known = ", ".join(repr(n) for n in sorted([*snapshot.models, *later])) or "none"
            if later and not snapshot.models:
                known += " (each loads on its first request)"
            elif later:
                waiting = ", ".join(map(repr, later))
                known += f" ({waiting} not loaded yet: each loads on its first request)"
            raise ModelNotFound(f"{UNKNOWN_MODEL}'{name}' is not found; served models: {known}")
        return served

    def version(self, name: str, version: str | None) -> ServedVersion:
        """The served `version` of `name` (None or "": the default version).

        NOTE: a malformed `version` is refused before the model is looked up, as Triton parses
        the version string first: "abc" of a model not served was told the model is not found
        (404), where Triton says the version string is not one (400)."""
        served = self.served(name, version)
        return self.served_version(served, version or served.default)

    def takes_work(self, name: str, version: str | None, now_ns: int) -> bool:
        """Whether a request for `name` and `version` can run now (see
        `ServedVersion.takes_work`); without a version, on any version its traffic policy
        sends requests to. What model readiness reports: KServe's "ready for inferencing".

        NOTE: a model whose every instance's breaker was open answered every request 503 while
        /v2/models/NAME/ready said 200 (found by a tester)."""
        served = self.served(name, version)
        if version:
            return self.served_version(served, version).takes_work(now_ns)
        versions = served.versions
        return any(versions[v].takes_work(now_ns) for v in served.traffic.versions if v in versions)

    def served_version(self, served: ServedModel, version: str) -> ServedVersion:
        """`served.version(version)`, where a version that a load under way is loading is
        unavailable (503, retry), not unknown (404).

        NOTE: while other versions of the model served, a request for one still loading was
        told "version V is not found" (404), which clients take as final; Triton answers
        UNAVAILABLE "version V is not at ready state"."""
        try:
            return served.version(version)
        except ModelNotFound:
            number = version_of(version)
            if number is None:
                raise
            loading = self.snapshot.loading.get(served.name)
            if loading is None or str(number) not in loading.versions:
                # NOTE: a version whose load failed, beside versions that serve, was "not
                # found" (404) with no reason, where the index gives it; Triton answers
                # UNAVAILABLE "version V is not at ready state" (found by a tester)
                failure = self.load_failure(served.name, str(number))
                if failure is None:
                    raise
                raise ModelUnavailable(
                    f"{UNKNOWN_MODEL}'{served.name}' version {version} is not at ready "
                    f"state: its load failed: {failure}"
                ) from None
            wait_s = retry_after_s(loading.expected_s)
            raise ModelUnavailable(
                f"{UNKNOWN_MODEL}'{served.name}' version {version} is not at ready state: it is "
                f"loading (a load takes about {wait_s} s); retry shortly",
                retry_after_s=wait_s,
            ) from None

    def attribution(self, model: str, version: str | None, *, invalid: bool) -> tuple[str, str]:
        """The version and variant a refused request of `model` is counted under in the
        metrics (and its span): the version it names, as routing reads it ("01" is 1), else the
        one its traffic goes to where that is one version; the variant, the version's primary
        where a scheduler refused it (`invalid` inputs count under no variant). ("", "") where
        neither is known (an unknown model, a traffic split).

        NOTE: spans of a 504 or a 400 on mlp said version '' where the metrics counted them
        under version "1": over HTTP (found by a tester), and later over gRPC, which had not
        been given this (found by another)."""
        served = self.snapshot.models.get(model)
        if served is None:
            return version or "", ""
        try:
            chosen = (
                self.served_version(served, version)
                if version
                else served.versions[served.traffic.versions[0]]
            )
        except DuetimeError:
            return version or "", ""
        if not version and served.traffic.split:
            return "", ""
        if invalid:
            return chosen.version, ""
        return chosen.version, chosen.primary.variant

    def resolve(self, name: str, version: str | None) -> Deployment:
        """The primary deployment of `name` and `version` (None or "": the default version)."""
        return self.version(name, version).primary

    def scheduler_of(self, name: str, version: str | None) -> ModelScheduler | None:
        """The scheduler of `resolve(name, version)`, or None where that raises (a model or
        version not served, a malformed version).

        NOTE: resolved once per snapshot (they are replaced, never changed): at overload the
        load shedder asks this of most requests (`count_shed`, `Engine.has_idle_capacity`),
        and resolving each was 7% of a refusal's cost."""
        snapshot = self.snapshot
        found = self._schedulers
        if snapshot is not self._schedulers_of:
            self._schedulers_of = snapshot
            found.clear()
        key = (name, version)
        if key in found:
            return found[key]
        try:
            scheduler: ModelScheduler | None = self.resolve(name, version).scheduler
        except DuetimeError:
            scheduler = None
        if len(found) < RESOLVED_MAX:  # (a client names versions at will)
            found[key] = scheduler
        return scheduler

    def served_name(self, name: str | None, version: str | None) -> str | None:
        """`name` where this registry serves it and its `version` (None or "": its default),
        else None: the load shedder weighs and counts a request of a name a client invents, or
        of a version not served, with the requests of no model.

        NOTE: a refusal of a version not served counted in `duetime_requests_shed_by_model`
        under its model, and in none of the model's other counts (a tester's flood: 3,197 shed
        for mlp against 1,635 rejected). (The name is looked up first: a name a client invents
        is not resolved, which costs an exception past `RESOLVED_MAX` names.)"""
        if name is None or name not in self.snapshot.models:
            return None
        return name if self.scheduler_of(name, version or None) is not None else None

    def turn_wait_ns(self, name: str, version: str | None) -> float:
        """What requests of `name` and `version` lately waited for a turn of the loop to run
        them (`ModelScheduler.turn_wait_ns`: 0 where its instances run on threads, or where it
        is not served)."""
        scheduler = self.scheduler_of(name, version)
        return 0.0 if scheduler is None else scheduler.turn_wait_ns

    def count_shed(self, name: str, version: str | None) -> None:
        """Count a request of `name` and `version` that the front end's load shedder refused in
        the statistics of the deployment it would have gone to (`ModelScheduler.count_shed`);
        one of a version not served counts nowhere."""
        scheduler = self.scheduler_of(name, version)
        if scheduler is not None:
            scheduler.count_shed()


def _no_failure(model: str, version: str) -> str | None:
    """`Registry.load_failure` where no manager tells: none known."""
    return None


def retry_after_s(load_s: float) -> int:
    """When to come back to a model or version whose load takes about `load_s` (a Retry-After:
    whole seconds, at least 1)."""
    return max(1, math.ceil(load_s))
