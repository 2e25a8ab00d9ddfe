"""Model statistics in Triton's form (the v2 statistics extension), plus duetime's own figures:
what the HTTP and gRPC statistics calls and `Engine.statistics` give (no front end's own)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from duetime.repository.layout import version_of
from duetime.repository.registry import Deployment, ServedVersion, Snapshot
from duetime.routing.router import ShadowStatistics
from duetime.scheduling.scheduler import SchedulerStatistics


def _duration(count: int, ns: int) -> dict[str, int]:
    return {"count": count, "ns": ns}


def model_statistics_json(
    name: str,
    version: ServedVersion,
    shadow: ShadowStatistics | None = None,
    snapshot: Snapshot | None = None,
) -> dict[str, Any]:
    """One `model_stats` entry: Triton's fields summed over the version's variants, and
    `duetime` with each variant's scheduler view (and, for a shadow version, how its outputs
    compared with the answers). With the `snapshot` that serves it, a variant's counts include
    those of the deployments of it that a reload replaced (`Snapshot.statistics`)."""
    per_variant = [
        (d, d.scheduler.statistics() if snapshot is None else snapshot.statistics(d))
        for d in version.variants
    ]

    def total(field: str) -> int:
        return sum(getattr(stats, field) for _, stats in per_variant)

    batches: dict[int, list[int]] = {}
    for _, stats in per_variant:
        for size, batch in stats.batch_sizes.items():
            entry = batches.setdefault(size, [0, 0, 0, 0])
            entry[0] += batch.count
            entry[1] += batch.input_ns
            entry[2] += batch.compute_ns
            entry[3] += batch.output_ns
    succeeded = total("succeeded")
    # NOTE: as Triton's: its `fail` and nv_inference_request_failure (reasons REJECTED, CANCELED,
    # BACKEND, OTHER) come from one count, so requests their clients cancelled are failures here
    # too. Requests refused by validation are not: Triton refuses them before they reach the
    # model (TRITONSERVER_ServerInferAsync returns PrepareForInference's error), uncounted.
    failed = (
        total("failed")
        + total("rejected")
        + total("expired")
        + total("cancelled")
        + total("unavailable")
    )
    doc: dict[str, Any] = {
        "name": name,
        "version": version.version,
        "last_inference": max(stats.last_inference_ms for _, stats in per_variant),
        "inference_count": total("inferences"),
        "execution_count": total("executions"),
        "inference_stats": {
            "success": _duration(succeeded, total("success_ns")),
            "fail": _duration(failed, total("fail_ns")),
            # NOTE: as Triton's, queue and compute count the successful requests only (its
            # InferenceStatsAggregator adds them in UpdateSuccess, never in UpdateFailure)
            "queue": _duration(succeeded, total("queue_ns")),
            "compute_input": _duration(succeeded, total("request_input_ns")),
            "compute_infer": _duration(succeeded, total("request_compute_ns")),
            "compute_output": _duration(succeeded, total("request_output_ns")),
            "cache_hit": _duration(0, 0),
            "cache_miss": _duration(0, 0),
        },
        "batch_stats": [
            {
                "batch_size": size,
                "compute_input": _duration(count, input_ns),
                "compute_infer": _duration(count, infer_ns),
                "compute_output": _duration(count, output_ns),
            }
            for size, (count, input_ns, infer_ns, output_ns) in sorted(batches.items())
        ],
    }
    doc["duetime"] = {"variants": [_variant_json(d, stats) for d, stats in per_variant]}
    if shadow is not None:
        doc["duetime"]["shadow"] = shadow.as_json()
    return doc


def _variant_json(deployment: Deployment, stats: SchedulerStatistics) -> dict[str, Any]:
    profile = deployment.scheduler.profile
    return {
        "variant": deployment.variant,
        "succeeded": stats.succeeded,
        "queued": stats.queued,
        "peak_queued": stats.peak_queued,
        "busy_instances": stats.busy_instances,
        "instances": stats.instances,
        "rejected": stats.rejected,
        "probes": stats.probes,
        "handed_over": stats.handed_over,
        "answers_failed": dict(sorted(stats.answers_failed.items())),
        "expired": stats.expired,
        "late": stats.late,
        "late_by_cause": dict(sorted(stats.late_by_cause.items())),
        "failed": stats.failed,
        "cancelled": stats.cancelled,
        "unavailable": stats.unavailable,
        "handoff_overhead_ns": stats.overhead_ns,
        "execution_overrun": round(stats.overrun, 3),
        "handoff_tail_ns": stats.handoff_tail_ns,
        "late_margin_ns": stats.late_margin_ns,
        "answer_ns": stats.answer_ns,
        "breakers": ["closed", "half-open", "open"][max(stats.breaker_states, default=0)]
        if stats.breaker_states
        else "closed",
        "breaker_states": list(stats.breaker_states),
        "breakers_opened": stats.breakers_opened,
        "scheduling_policy": deployment.model.config.scheduling.policy,
        "execution": "inline" if deployment.model.executor.inline else "thread",
        "latency_profile": profile.snapshot(),
        # (each instance's: the variant's at its pace, see profile.InstanceSpeed)
        "instance_speeds": [round(speed, 3) for speed in stats.instance_speeds],
        # (what a pace can be checked against from outside: found wanting by a tester)
        "instance_runs": list(stats.instance_runs),
        "instance_mean_compute_us": [
            round(ns / runs / 1e3, 3) if runs else None
            for runs, ns in zip(stats.instance_runs, stats.instance_compute_ns, strict=True)
        ],
        "instance_latency_profiles": [profile.snapshot(speed) for speed in stats.instance_speeds],
    }


def statistics_json(
    snapshot: Snapshot,
    name: str | None,
    version: str | None,
    shadows: Mapping[tuple[str, str], ShadowStatistics] | None = None,
) -> dict[str, Any]:
    """Statistics of every served version of `name` (or of `version` only: "01" is version 1,
    as routing reads it), or of all models."""
    if version is not None:
        # NOTE: compared as written, "01" matched no version: 200 with no statistics, where
        # infer, ready and metadata take it as version 1 (ServedVersion.version)
        parsed = version_of(version)
        version = str(parsed) if parsed is not None else version
    entries = []
    for model_name, served in sorted(snapshot.models.items()):
        if name is not None and model_name != name:
            continue
        for number, served_version in sorted(served.versions.items(), key=lambda i: int(i[0])):
            if version is None or number == version:
                shadow = (shadows or {}).get((model_name, number))
                entries.append(model_statistics_json(model_name, served_version, shadow, snapshot))
    return {"model_stats": entries}
