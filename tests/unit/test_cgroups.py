"""The memory limits of this process's control groups, v1 and v2, read where the groups are
mounted, in the process's own group and those above it (duetime.cgroups). Only a v2 root's
`memory.max` was read: a v1 container's limit and a systemd unit's `MemoryMax=` were missed, and
one request under the default run limit (a quarter of the host's memory) had the server killed
(found by a tester)."""

from __future__ import annotations

from pathlib import Path

from duetime.cgroups import memory_groups, memory_limit, memory_room

V1_MOUNT = "35 25 0:30 / /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n"
V2_MOUNT = "30 25 0:26 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
V2_ONLY = "30 25 0:26 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n"


def tree(tmp_path: Path, cgroup: str, mountinfo: str, files: dict[str, str]) -> Path:
    proc = tmp_path / "proc"
    proc.mkdir()
    (proc / "cgroup").write_text(cgroup)
    (proc / "mountinfo").write_text("22 1 8:1 / / rw - ext4 /dev/sda1 rw\n" + mountinfo)
    for name, text in files.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return proc


def hybrid(tmp_path: Path, group: str, files: dict[str, str]) -> Path:
    """A host with v1's memory controller and v2 mounted beside it (systemd's hybrid layout),
    the process in v1 memory group `group`, and `files` besides v1's root limit (none)."""
    return tree(
        tmp_path,
        f"4:memory:{group}\n0::/\n",
        V1_MOUNT + V2_MOUNT,
        {
            "sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
            "sys/fs/cgroup/unified/cgroup.procs": "",
            **files,
        },
    )


def test_a_v1_group_s_limit_is_read_in_the_process_s_own_group(tmp_path: Path) -> None:
    proc = hybrid(
        tmp_path,
        "/process_api/abc",
        {
            "sys/fs/cgroup/memory/process_api/abc/memory.limit_in_bytes": f"{4 << 30}\n",
            "sys/fs/cgroup/memory/process_api/abc/memory.usage_in_bytes": f"{1 << 30}\n",
        },
    )
    groups = memory_groups(proc, tmp_path)
    assert [(g.folder, g.v2) for g in groups] == [
        (tmp_path / "sys/fs/cgroup/memory/process_api/abc", False),
        (tmp_path / "sys/fs/cgroup/unified", True),
    ]
    assert memory_limit(groups) == 4 << 30
    assert memory_room(groups) == 3 << 30


def test_a_v2_limit_set_on_a_group_above_the_process_s_counts(tmp_path: Path) -> None:
    """systemd's `MemoryMax=` on a slice: the process's own group sets none ('max')."""
    unit = "sys/fs/cgroup/system.slice/duetime.service"
    proc = tree(
        tmp_path,
        "0::/system.slice/duetime.service\n",
        V2_ONLY,
        {
            f"{unit}/memory.max": "max\n",
            f"{unit}/memory.current": f"{1 << 20}\n",
            "sys/fs/cgroup/system.slice/memory.max": f"{2 << 30}\n",
            "sys/fs/cgroup/system.slice/memory.current": f"{1 << 30}\n",
        },
    )
    groups = memory_groups(proc, tmp_path)
    assert memory_limit(groups) == 2 << 30
    assert memory_room(groups) == 1 << 30


def test_inside_a_cgroup_namespace_the_mount_s_root_is_the_process_s_group(tmp_path: Path) -> None:
    proc = tree(tmp_path, "0::/\n", V2_ONLY, {"sys/fs/cgroup/memory.max": "1073741824\n"})
    assert memory_limit(memory_groups(proc, tmp_path)) == 1 << 30


def test_no_limit_anywhere_is_none(tmp_path: Path) -> None:
    groups = memory_groups(hybrid(tmp_path, "/", {}), tmp_path)
    assert memory_limit(groups) is None
    assert memory_room(groups) is None


def test_no_proc_files_is_no_group(tmp_path: Path) -> None:
    assert memory_groups(tmp_path / "missing", tmp_path) == []
