"""Traffic policy: which version answers a request that names none, and which versions see a copy.

Pure: no clock, no I/O; randomness comes from the caller. A sticky key is mapped to a version by
weighted rendezvous hashing (Schindelhauer & Schomaker 2005; Resch's logarithmic method): every
version scores the key as `-weight / ln(u)` with `u` a uniform hash of (key, version), and the
highest score wins. Each version's share of keys is its share of the weight, and changing one
version's weight only moves keys to it (weight raised) or away from it (weight lowered): a key
whose version and winner kept their weights keeps its version.
"""

from __future__ import annotations

import bisect
import contextlib
import hashlib
import math
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from duetime.config import TrafficConfig

_SCALE = float(1 << 64)


@dataclass(frozen=True, slots=True)
class TrafficPlan:
    """The traffic policy of one model, narrowed to the versions actually served."""

    versions: tuple[str, ...]
    """Versions with a weight above zero, in the order of `cumulative`."""
    cumulative: tuple[float, ...]
    """Running sums of the weights, for a weighted draw by bisection."""
    weights: tuple[float, ...]
    sticky_key: str | None
    shadows: tuple[tuple[str, float], ...]
    """(version, share of requests mirrored to it)."""

    split: bool = field(init=False)
    """More than one version takes traffic: a draw or a hash is needed (a field: every request
    reads it)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "split", len(self.versions) > 1)

    def pick(self, key: str | None, draw: float) -> str:
        """The version for a request: by `key` when it has one, else by `draw` in [0, 1)."""
        return _pick(self.versions, self.weights, self.cumulative, key, draw)

    def pick_among(self, usable: Collection[str], key: str | None, draw: float) -> str | None:
        """`pick` over the versions in `usable` only (None: none of them takes traffic): as if
        the others weighed nothing. A key goes where it would go next in rendezvous order
        (keys of the usable versions stay where they are), a draw by the usable weights."""
        kept = [(v, w) for v, w in zip(self.versions, self.weights, strict=True) if v in usable]
        if not kept:
            return None
        versions, weights = [v for v, _ in kept], [w for _, w in kept]
        return _pick(versions, weights, _running_sums(weights), key, draw)


def _pick(
    versions: Sequence[str],
    weights: Sequence[float],
    cumulative: Sequence[float],
    key: str | None,
    draw: float,
) -> str:
    """By `key` (weighted rendezvous) when there is one, else by `draw` in [0, 1) over the
    running sums of the weights (`cumulative`)."""
    if key is not None:
        return rendezvous(key, versions, weights)
    index = bisect.bisect_right(cumulative, draw * cumulative[-1])
    return versions[min(index, len(versions) - 1)]


def plan_traffic(config: TrafficConfig, served: Sequence[str], default: str) -> TrafficPlan:
    """The plan for the versions in `served`: weights of versions not served are dropped; with
    no weighted version served, everything goes to `default`."""
    weighted = [
        (version, weight)
        for version, weight in sorted((config.weights or {}).items(), key=lambda i: int(i[0]))
        if weight > 0 and version in served
    ]
    if not weighted:
        weighted = [(default, 1.0)]
    versions = tuple(version for version, _ in weighted)
    weights = tuple(float(weight) for _, weight in weighted)
    cumulative = tuple(_running_sums(weights))
    shadows = tuple(
        (version, share)
        for version, share in sorted((config.shadow or {}).items(), key=lambda i: int(i[0]))
        if share > 0 and version in served
    )
    return TrafficPlan(versions, cumulative, weights, config.sticky_key, shadows)


def _running_sums(weights: Sequence[float]) -> list[float]:
    total = 0.0
    sums = []
    for weight in weights:
        total += weight
        sums.append(total)
    return sums


def rendezvous(key: str, versions: Sequence[str], weights: Sequence[float]) -> str:
    """The version with the highest weighted rendezvous score for `key`."""
    best = versions[0]
    best_score = -math.inf
    encoded = key.encode("utf-8", "surrogatepass")
    for version, weight in zip(versions, weights, strict=True):
        score = -weight / math.log(unit_hash(encoded, version))
        if score > best_score:
            best, best_score = version, score
    return best


def unit_hash(key: bytes, version: str) -> float:
    """A uniform value in (0, 1) from (key, version), the same on every replica and run.

    The whole version is hashed, whatever its length: BLAKE2b's `person` holds 16 bytes, so a
    longer version also gives a `salt` (a digest of all of it). A version of at most 16 bytes
    gives none (BLAKE2b pads both with zeros), and keeps the hashes it always had: a sticky key
    keeps its version across the upgrade.

    NOTE: `person` alone took the first 16 bytes: two versions sharing them (timestamps with
    milliseconds, 20241201120000123 and ...124) hashed every key alike, so the heavier (or, at
    equal weights, the first) of them took every keyed request whatever the weights said."""
    name = version.encode()
    if len(name) <= 16:
        digest = hashlib.blake2b(key, digest_size=8, person=name).digest()
    else:
        salt = hashlib.blake2b(name, digest_size=16).digest()
        digest = hashlib.blake2b(key, digest_size=8, person=name[:16], salt=salt).digest()
    return (int.from_bytes(digest, "big") + 0.5) / _SCALE


def routing_key(
    name: str | None, parameters: Mapping[str, object], headers: Mapping[str, str]
) -> str | None:
    """The sticky key's value: a request parameter of that name, else the header / metadata.

    A key is the same whichever way it comes: an HTTP header's bytes are read as UTF-8 where
    they are (the HTTP front end reads header values as Latin-1), and spaces and tabs at
    either end are dropped from a parameter's (a header's lose them on the wire, RFC 9110
    5.5). NOTE: 'Zürich-42' as a header and as a parameter pinned different versions, and
    so did ' padded '."""
    if name is None:
        return None
    value = parameters.get(name)
    if value is None:
        value = headers.get(name.lower())
        if isinstance(value, str) and not value.isascii():
            with contextlib.suppress(UnicodeError):  # (not UTF-8, or not Latin-1: as it is)
                value = value.encode("latin-1").decode("utf-8")
    if value is None:
        return None
    if isinstance(value, bool):
        # NOTE: a boolean keyed nothing: each request drew its version, and the header beside
        # it was passed over (found by a tester); it keys as JSON writes it, as a header would
        return "true" if value else "false"
    return value.strip(" \t") if isinstance(value, str) else str(value)
