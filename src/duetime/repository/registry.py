"""Registry: the table of served models, swapped as a whole so readers never see it half-made."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

from duetime.errors import ModelNotFound, ModelUnavailable
from duetime.repository.loader import LoadedModel
from duetime.scheduling.scheduler import ModelScheduler


@dataclass(frozen=True, slots=True, eq=False)
class Deployment:
    """A loaded version with the scheduler that feeds its instances."""

    model: LoadedModel
    scheduler: ModelScheduler


@dataclass(frozen=True, slots=True)
class ServedModel:
    """All served versions of one model; `default` answers requests that name no version."""

    name: str
    versions: Mapping[str, Deployment]
    default: str


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One immutable routing table; the registry replaces it, never edits it."""

    models: Mapping[str, ServedModel] = field(default_factory=dict)
    failures: Mapping[str, str] = field(default_factory=dict)
    """Model name -> why it could not be loaded."""


class Registry:
    """Publishes deployments by swapping one reference; resolves model and version names."""

    def __init__(self) -> None:
        self.snapshot = Snapshot()

    def publish(self, deployment: Deployment) -> None:
        """Serve `deployment`, its version beside the others; the highest version is the default."""
        name = deployment.model.name
        current = self.snapshot.models.get(name)
        versions = dict(current.versions) if current else {}
        versions[deployment.model.version] = deployment
        served = ServedModel(name, MappingProxyType(versions), max(versions, key=int))
        models = {**self.snapshot.models, name: served}
        failures = {k: v for k, v in self.snapshot.failures.items() if k != name}
        self.snapshot = Snapshot(MappingProxyType(models), MappingProxyType(failures))

    def record_failure(self, name: str, reason: str) -> None:
        failures = {**self.snapshot.failures, name: reason}
        self.snapshot = Snapshot(self.snapshot.models, MappingProxyType(failures))

    def clear(self) -> list[Deployment]:
        """Stop serving everything; returns what was served so the caller can close it."""
        old = self.snapshot
        self.snapshot = Snapshot()
        return [d for served in old.models.values() for d in served.versions.values()]

    def resolve(self, name: str, version: str | None) -> Deployment:
        """The deployment for `name` and `version` (None or "": the default version)."""
        snapshot = self.snapshot
        served = snapshot.models.get(name)
        if served is None:
            if name in snapshot.failures:
                raise ModelUnavailable(f"model '{name}' failed to load: {snapshot.failures[name]}")
            known = ", ".join(repr(n) for n in sorted(snapshot.models)) or "none"
            raise ModelNotFound(f"unknown model '{name}'; served models: {known}")
        deployment = served.versions.get(version or served.default)
        if deployment is None:
            loaded = ", ".join(sorted(served.versions, key=int))
            raise ModelNotFound(
                f"model '{name}' has no version '{version}' loaded; loaded versions: {loaded}"
            )
        return deployment
