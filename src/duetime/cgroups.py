"""The memory this process's control groups (a container's, a systemd unit's) allow it: cgroup v2
(`memory.max`, `memory.current`) or v1 (`memory.limit_in_bytes`, `memory.usage_in_bytes`), read
in the group the process is in and each group above it, wherever the hierarchy is mounted.

NOTE: only `/sys/fs/cgroup/memory.max` was read: the root of a v2 hierarchy, which is the
process's own group only inside a cgroup namespace (a container). A 4 GiB v1 limit (the memory
controller under `/sys/fs/cgroup/memory/<group>`) was missed, and so was a systemd unit's
`MemoryMax=` (its group below the root): the default limit on one run's memory was a quarter
of the host's, and one request under it had the server killed for memory (found by a tester).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from pathlib import Path

UNLIMITED_V1 = 2**62
"""A v1 limit at or above this is none (the kernel writes 9223372036854771712 for none)."""


@dataclass(frozen=True, slots=True)
class MemoryGroup:
    """One cgroup holding this process, as mounted here."""

    folder: Path
    """Its folder: the process's own group."""
    top: Path
    """The mount's root: the highest of its groups readable here."""
    v2: bool


def memory_groups(proc: Path = Path("/proc/self"), root: Path = Path("/")) -> list[MemoryGroup]:
    """The groups that account this process's memory: its v2 group and its v1 memory group,
    where mounted (`root`: where paths in the mount table start; tests give another)."""
    try:
        groups = (proc / "cgroup").read_text().splitlines()
        mounts = (proc / "mountinfo").read_text().splitlines()
    except OSError:
        return []
    found = []
    for line in groups:
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        ident, controllers, path = parts
        v2 = ident == "0" and not controllers
        if not v2 and "memory" not in controllers.split(","):
            continue
        for mount_root, mount_point in _mounts(mounts, v2):
            if path == mount_root or path.startswith(mount_root.rstrip("/") + "/"):
                inside = path[len(mount_root) :].strip("/")
                top = root / mount_point.lstrip("/")
                folder = top / inside if inside else top
                if folder.is_dir():
                    found.append(MemoryGroup(folder, top, v2))
                    break
    return found


def _mounts(mountinfo: list[str], v2: bool) -> list[tuple[str, str]]:
    """(the cgroup path mounted, where) of each cgroup2 mount, or each v1 mount of the memory
    controller."""
    found = []
    for line in mountinfo:
        head, _, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if len(fields) < 5 or len(rest) < 3:
            continue
        fstype, options = rest[0], rest[2].split(",")
        if (v2 and fstype == "cgroup2") or (not v2 and fstype == "cgroup" and "memory" in options):
            found.append((_unescaped(fields[3]), _unescaped(fields[4])))
    return found


def _unescaped(field: str) -> str:
    """A mountinfo path field: spaces and the like are written as octal escapes (`\\040`)."""
    return field.encode().decode("unicode_escape") if "\\" in field else field


def memory_limit(groups: list[MemoryGroup] | None = None) -> int | None:
    """The lowest memory limit of the process's groups and the groups above them; None where
    none is set (or none is readable)."""
    chosen = memory_groups() if groups is None else groups
    limits = [
        limit
        for group in chosen
        for folder in _up_to_top(group)
        if (limit := _read_limit(folder, group.v2)) is not None
    ]
    return min(limits) if limits else None


def memory_room(groups: list[MemoryGroup] | None = None) -> int | None:
    """Bytes the process's groups still allow it: the least, over groups with a limit, of the
    limit less the group's usage; None where none has a limit."""
    rooms = []
    for group in memory_groups() if groups is None else groups:
        for folder in _up_to_top(group):
            limit = _read_limit(folder, group.v2)
            used = _read_number(
                folder / ("memory.current" if group.v2 else "memory.usage_in_bytes")
            )
            if limit is not None and used is not None:
                rooms.append(max(0, limit - used))
    return min(rooms) if rooms else None


def _up_to_top(group: MemoryGroup) -> list[Path]:
    folders = [group.folder]
    while folders[-1] != group.top and folders[-1].parent != folders[-1]:
        folders.append(folders[-1].parent)
    return folders


def _read_limit(folder: Path, v2: bool) -> int | None:
    limit = _read_number(folder / ("memory.max" if v2 else "memory.limit_in_bytes"))
    if limit is None or (not v2 and limit >= UNLIMITED_V1):
        return None
    return limit


def _read_number(path: Path) -> int | None:
    """The integer in `path`; None where it says `max`, or cannot be read."""
    with contextlib.suppress(OSError, ValueError):
        text = path.read_text().strip()
        if text != "max":
            return int(text)
    return None
