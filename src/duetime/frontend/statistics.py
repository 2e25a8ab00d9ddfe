"""Model statistics in Triton's form (the v2 statistics extension), plus duetime's own figures."""

from __future__ import annotations

from typing import Any

from duetime.repository.registry import Deployment, Snapshot


def _duration(count: int, ns: int) -> dict[str, int]:
    return {"count": count, "ns": ns}


def model_statistics_json(deployment: Deployment) -> dict[str, Any]:
    """One `model_stats` entry: Triton's fields, and `duetime` with the scheduler's own view."""
    stats = deployment.scheduler.statistics()
    model = deployment.model
    failed = stats.failed + stats.rejected + stats.expired
    return {
        "name": model.name,
        "version": model.version,
        "last_inference": stats.last_inference_ms,
        "inference_count": stats.inferences,
        "execution_count": stats.executions,
        "inference_stats": {
            "success": _duration(stats.succeeded, stats.success_ns),
            "fail": _duration(failed, 0),
            "queue": _duration(stats.succeeded + stats.failed, stats.queue_ns),
            "compute_input": _duration(0, 0),
            "compute_infer": _duration(stats.succeeded, stats.compute_ns),
            "compute_output": _duration(0, 0),
            "cache_hit": _duration(0, 0),
            "cache_miss": _duration(0, 0),
        },
        "batch_stats": [
            {
                "batch_size": size,
                "compute_input": _duration(0, 0),
                "compute_infer": _duration(batch.count, batch.compute_ns),
                "compute_output": _duration(0, 0),
            }
            for size, batch in sorted(stats.batch_sizes.items())
        ],
        "duetime": {
            "queued": stats.queued,
            "peak_queued": stats.peak_queued,
            "busy_instances": stats.busy_instances,
            "instances": stats.instances,
            "rejected": stats.rejected,
            "expired": stats.expired,
            "late": stats.late,
            "failed": stats.failed,
            "cancelled": stats.cancelled,
            "handoff_overhead_ns": stats.overhead_ns,
            "scheduling_policy": model.config.scheduling.policy,
            "latency_profile": deployment.scheduler.profile.snapshot(),
        },
    }


def statistics_json(snapshot: Snapshot, name: str | None, version: str | None) -> dict[str, Any]:
    """Statistics of every served version of `name` (or of `version` only), or of all models."""
    deployments = [
        deployment
        for model_name, served in sorted(snapshot.models.items())
        if name is None or model_name == name
        for v, deployment in sorted(served.versions.items(), key=lambda item: int(item[0]))
        if version is None or v == version
    ]
    return {"model_stats": [model_statistics_json(d) for d in deployments]}
