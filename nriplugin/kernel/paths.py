"""Cgroup paths from NRI data, for both drivers, as paths relative to a controller root.

cgroupfs: ``/kubepods/burstable/pod<uid>/<id>`` is already a path.
systemd:  ``kubepods-burstable-pod<uid_>.slice:cri-containerd:<id>`` (slice:prefix:name) becomes
``kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid_>.slice/cri-containerd-<id>.scope``.

Every component is checked: NRI data comes from pod specs, so a hostile value must never
name a path outside the cgroup tree.
"""

from __future__ import annotations

import re

_COMPONENT = re.compile(r"^[A-Za-z0-9_.:@+=-]{1,255}$")


class BadCgroupPath(ValueError):
    pass


def _check(parts: list[str], original: str) -> list[str]:
    for p in parts:
        if p in (".", "..") or not _COMPONENT.match(p):
            raise BadCgroupPath(f"unsafe cgroup path {original[:200]!r}")
    return parts


def expand_slice(name: str) -> list[str]:
    """``a-b-c.slice`` -> ``[a.slice, a-b.slice, a-b-c.slice]`` (systemd's slice nesting)."""
    if not name.endswith(".slice"):
        raise BadCgroupPath(f"not a systemd slice: {name[:200]!r}")
    stem = name[: -len(".slice")]
    if not stem or stem.startswith("-") or stem.endswith("-") or "--" in stem:
        raise BadCgroupPath(f"invalid systemd slice name {name[:200]!r}")
    words = stem.split("-")
    return _check([("-".join(words[: i + 1])) + ".slice" for i in range(len(words))], name)


def is_systemd(path: str) -> bool:
    return not path.startswith("/") and (path.endswith(".slice") or path.count(":") == 2)


def relative(path: str) -> str:
    """A cgroup path from NRI (either driver) as ``a/b/c`` relative to a controller root."""
    if not path or len(path) > 4096 or "\0" in path:
        raise BadCgroupPath(f"invalid cgroup path {path[:200]!r}")
    if is_systemd(path):
        if path.count(":") == 2:
            slice_, prefix, name = path.split(":")
            parts = expand_slice(slice_) if slice_ else []
            scope = f"{prefix}-{name}.scope" if prefix else f"{name}.scope"
            return "/".join(_check([*parts, scope], path))
        return "/".join(expand_slice(path))
    return "/".join(_check([p for p in path.split("/") if p], path))


def pod_dir(cgroup_parent: str) -> str:
    return relative(cgroup_parent)


def container_dir(cgroups_path: str, cgroup_parent: str = "", container_id: str = "") -> str:
    """The container's cgroup: its own cgroups_path, else parent/id (cgroupfs)."""
    if cgroups_path:
        return relative(cgroups_path)
    if cgroup_parent and container_id:
        return relative(cgroup_parent.rstrip("/") + "/" + container_id)
    raise BadCgroupPath("container has neither cgroups_path nor parent and id")
