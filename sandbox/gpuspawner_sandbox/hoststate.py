"""A snapshot of the host state real nodes touch, to prove ``down`` restores it.

Starting nodes creates processes, mount namespaces and mounts, cgroups,
bridges and veths, routes, iptables chains, directories, and the kubelet changes
sysctls. :func:`snapshot` reads all of that (limited to what could be ours
where the machine is shared with other work) into plain data, so a test can
compare the host before ``up`` with the host after ``down``.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .nodeconfig import (
    KUBELET_SYSCTLS,
    LINK_PREFIX,
    NETWORK_SYSCTLS,
    POD_RANGE,
    PRIVATE_HOST_DIRS,
)

#: Where cgroup hierarchies are mounted (v1 controllers and the v2 unified one).
CGROUP_MOUNT_TYPES = ("cgroup", "cgroup2")

#: Host paths the kubelet, containerd or CNI would create if they were
#: allowed to use the shared ones.
WATCHED_PATHS = (
    *PRIVATE_HOST_DIRS,
    "/var/log/pods",
    "/etc/cni",
    "/opt/cni",
    "/run/netns",
    "/var/run/netns",
    "/etc/kubernetes",
    "/var/lib/containerd",
)


def sysctl_path(name: str) -> Path:
    return Path("/proc/sys") / name.replace(".", "/")


def read_sysctl(name: str) -> str | None:
    try:
        return sysctl_path(name).read_text().strip()
    except OSError:
        return None


def cgroup_mounts(mountinfo: str | None = None) -> list[Path]:
    """Mount points of every cgroup hierarchy (from /proc/self/mountinfo)."""
    text = mountinfo if mountinfo is not None else Path("/proc/self/mountinfo").read_text()
    found = []
    for line in text.splitlines():
        left, _, right = line.partition(" - ")
        fstype = right.split(" ", 1)[0]
        if fstype in CGROUP_MOUNT_TYPES:
            found.append(Path(left.split(" ")[4]))
    return sorted(set(found))


def _cgroup_trees(roots: Iterable[str]) -> dict[str, list[str]]:
    trees: dict[str, list[str]] = {}
    for mount in cgroup_mounts():
        for root in roots:
            top = mount / root.strip("/")
            if top.is_dir():
                trees[str(top)] = sorted(
                    str(Path(d).relative_to(mount)) for d, _, _ in os.walk(top)
                )
    return trees


def _mounts(state_root: Path) -> list[str]:
    watched = (str(state_root), *WATCHED_PATHS)
    out = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        mount_point = fields[4]
        if any(mount_point == w or mount_point.startswith(w.rstrip("/") + "/") for w in watched):
            out.append(f"{mount_point} {fields[3]}")
    return sorted(out)


def _processes(state_root: Path, cgroup_roots: Iterable[str]) -> list[str]:
    """Processes whose command line names the state root, or that live in a node cgroup."""
    marker = str(state_root).encode()
    roots = tuple("/" + r.strip("/") for r in cgroup_roots)
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            cgroups = (entry / "cgroup").read_text()
        except OSError:
            continue
        paths = [line.split(":", 2)[-1] for line in cgroups.splitlines()]
        in_node = any(p == r or p.startswith(r + "/") for p in paths for r in roots)
        if marker in cmdline or in_node:
            found.append(cmdline.replace(b"\0", b" ").decode(errors="replace").strip())
    return sorted(found)


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


#: Chains every table has; an empty table holding only these (policy ACCEPT)
#: is the same as no table, and iptables cannot remove it once listed.
BUILTIN_CHAINS = ("INPUT", "FORWARD", "OUTPUT", "PREROUTING", "POSTROUTING")


def iptables_rules(save_output: str) -> list[str]:
    """``table: rule`` for every non-default chain and rule in ``iptables-save`` output.

    Counters, comments and empty built-in chains are left out, so two
    snapshots of the same rules compare equal.
    """
    rules = []
    table = ""
    for line in save_output.splitlines():
        if line.startswith("*"):
            table = line[1:]
            continue
        if not line or line.startswith("#") or line == "COMMIT":
            continue
        if line.startswith(":"):
            name, policy = line[1:].split()[:2]
            if name in BUILTIN_CHAINS and policy == "ACCEPT":
                continue
            # Chain lines carry counters: ":NAME POLICY [packets:bytes]".
            line = f":{name} {policy}"
        rules.append(f"{table}: {line}")
    return rules


def _links() -> list[str]:
    names = []
    for line in _run(["ip", "-o", "link", "show"]).splitlines():
        name = line.split(":", 2)[1].strip().split("@", 1)[0]
        if name.startswith((LINK_PREFIX, "veth")):
            names.append(name)
    return sorted(names)


def _routes() -> list[str]:
    pods = str(POD_RANGE).split(".")[:2]
    prefix = ".".join(pods) + "."
    return sorted(
        line.strip()
        for line in _run(["ip", "-4", "route", "show", "table", "all"]).splitlines()
        if prefix in line
    )


def snapshot(state_root: Path, cgroup_roots: Iterable[str] = ()) -> dict[str, Any]:
    """What real nodes could have changed on this host, as plain data."""
    state_root = Path(state_root).resolve()
    roots = list(cgroup_roots)
    return {
        "processes": _processes(state_root, roots),
        "mounts": _mounts(state_root),
        "cgroups": _cgroup_trees(roots),
        "links": _links(),
        "routes": _routes(),
        "iptables": iptables_rules(_run(["iptables-save"])),
        "ip6tables": iptables_rules(_run(["ip6tables-save"])),
        # kube-proxy's iptables mode clears the nftables mode's table at start;
        # it must not leave one behind either (empty where nft is not installed).
        "nftables": sorted(_run(["nft", "list", "tables"]).splitlines()),
        "sysctls": {name: read_sysctl(name) for name in (*KUBELET_SYSCTLS, *NETWORK_SYSCTLS)},
        "paths": {p: os.path.lexists(p) for p in WATCHED_PATHS},
        "state_root": sorted(p.name for p in state_root.iterdir()) if state_root.is_dir() else None,
    }


def differences(before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """Readable differences between two snapshots (empty when equal)."""
    out = []
    for key in sorted(set(before) | set(after)):
        if before.get(key) != after.get(key):
            out.append(f"{key}: before {before.get(key)!r}, after {after.get(key)!r}")
    return out
