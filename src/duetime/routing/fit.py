"""Whether the versions a model's traffic policy sends requests to can take them: the weighted
versions each other's, a shadow the copies of the answering versions'.

Said at load, in the log and the repository index's reasons (see repository/manager.py), as a
variant with another signature is refused there; and, for a request that named no version,
in the error of the version the weights chose (`chosen_by_weights`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NamedTuple

from duetime.config import TrafficConfig
from duetime.errors import InvalidInput
from duetime.repository.registry import ServedVersion
from duetime.routing.traffic import TrafficPlan, plan_traffic
from duetime.types import ModelSignature, TensorSpec


class Unfit(NamedTuple):
    """What to say of a model's traffic policy over the versions it serves."""

    said: str
    """For the log: every warning, joined (empty: none)."""
    reasons: dict[str, str]
    """Version -> the warnings about it, for its repository index reason."""


def unfit_traffic(served: Mapping[str, ServedVersion], traffic: TrafficConfig) -> Unfit:
    """What `traffic` over the `served` versions (not empty) sends where it cannot be taken:
    weighted versions unlike each other (`_unlike_weighted`), and shadows that cannot take the
    copies of the requests sent to another version (`_unfit_shadows`)."""
    plan = plan_traffic(traffic, list(served), max(served, key=int))
    unlike = _unlike_weighted(served, plan)
    reasons = dict(unlike)
    shadows = _unfit_shadows(served, plan)
    for version, why in shadows.items():
        reasons[version] = " ".join(filter(None, (reasons.get(version), why)))
    said = [next(iter(unlike.values()), ""), *(shadows[v] for v in sorted(shadows, key=int))]
    return Unfit(" ".join(filter(None, said)), reasons)


def chosen_by_weights(error: InvalidInput, model: str, version: str) -> None:
    """Add to `error`, refused by `version` of `model` where its `[traffic] weights` chose it
    for a request naming none, which version that was and why: its words stay first, as
    clients match on them (see validation.shape_refused). Called only for a refusal, so a
    request that validates pays nothing for it.

    NOTE: weights over versions 1 (x [-1,4]) and 2 (x [-1,6]) refused half the requests
    shaped as metadata (version 2's) says, "Expected [-1,4], got [1,6]", naming no version: the
    client could not tell that the traffic split had sent them to another (found by a tester)."""
    message = (
        f"{error.message}; refused by model '{model}' version {version} (chosen by its "
        "[traffic] weights: the request named no version)"
    )
    error.message = message
    error.args = (message,)


def _unlike_weighted(served: Mapping[str, ServedVersion], plan: TrafficPlan) -> dict[str, str]:
    """Version -> what to say where the versions the weights send requests to do not take
    and give the same tensors (names, datatypes and shapes as clients send and get them, the
    inputs they may leave out): each version unlike the highest of them, and that one.

    NOTE: weights over versions 1 (x [-1,4]) and 2 (x [-1,6]) were served without a word,
    though a request fit for either (metadata describes 2) is refused by the other, and the
    client gets that refusal: warned of for a shadow, whose copies no client waits for, and
    not for these (found by a tester)."""
    if not plan.split:
        return {}
    highest = plan.versions[-1]
    face = _face(served[highest].primary.model.signature)
    unlike = [v for v in plan.versions[:-1] if _face(served[v].primary.model.signature) != face]
    if not unlike:
        return {}
    described = "; ".join(
        f"version {v} takes {_tensors(served[v].primary.model.signature.inputs)} and gives "
        f"{_tensors(served[v].primary.model.signature.outputs)}"
        for v in (highest, *unlike)
    )
    said = (
        f"[traffic] weights send requests that name no version to versions "
        f"{', '.join(plan.versions[:-1])} and {highest}, which do not take and give the same "
        f"tensors: a request fit for one is refused by another, whichever the weights choose "
        f"({described})."
    )
    return dict.fromkeys((highest, *unlike), said)


def _face(signature: ModelSignature) -> tuple[frozenset[tuple[object, ...]], ...]:
    """The tensors of `signature` as clients send and get them (in any order)."""
    return tuple(
        frozenset(
            (spec.name, spec.datatype, spec.any_rank, spec.client_shape, spec.optional)
            for spec in specs
        )
        for specs in (signature.inputs, signature.outputs)
    )


def _unfit_shadows(served: Mapping[str, ServedVersion], plan: TrafficPlan) -> dict[str, str]:
    """Shadow version -> what to say where its inputs cannot take the copies of the requests
    that the traffic policy sends to another version (a copy is validated against the
    shadow's inputs, and skipped when it fails): an input of the one missing from the other
    (required by either), or given another datatype or shape.

    NOTE: such a shadow was accepted without a word: every copy was skipped (mirrored 20,
    skipped 20), and neither the log nor the index said why, where a variant with another
    signature is refused at load (found by a tester)."""
    said: dict[str, str] = {}
    for shadow, _ in plan.shadows:
        takes = served[shadow].primary.model.signature
        unfit = [
            version
            for version in plan.versions
            if version != shadow and not _takes(takes, served[version].primary.model.signature)
        ]
        if not unfit:
            continue
        given = served[unfit[0]].primary.model.signature
        which = f"version {unfit[0]}'s" if len(unfit) == 1 else f"versions {', '.join(unfit)}'"
        said[shadow] = (
            f"[traffic] shadow version {shadow} cannot take the copies of {which} requests "
            f"(each is skipped): it takes {_tensors(takes.inputs)}, version {unfit[0]} "
            f"{_tensors(given.inputs)}."
        )
    return said


def _takes(shadow: ModelSignature, given: ModelSignature) -> bool:
    """Whether requests fit for `given`'s inputs can fit `shadow`'s."""
    names = {spec.name for spec in shadow.inputs}
    if any(spec.name not in names for spec in given.required_inputs):
        return False  # (the request carries an input the shadow has not)
    for spec in shadow.inputs:
        other = given.input(spec.name)
        if other is None:
            if not spec.optional:
                return False
        elif other.datatype != spec.datatype or not _shapes_meet(spec, other):
            return False
    return True


def _shapes_meet(one: TensorSpec, other: TensorSpec) -> bool:
    """Some tensor has both shapes (-1: any size; a spec of any rank takes any shape)."""
    if one.any_rank or other.any_rank:
        return True
    a, b = one.client_shape, other.client_shape
    return len(a) == len(b) and all(x == y or -1 in (x, y) for x, y in zip(a, b, strict=True))


def _tensors(specs: tuple[TensorSpec, ...]) -> str:
    return ", ".join(f"{spec.name} {spec.describe()}" for spec in specs)
