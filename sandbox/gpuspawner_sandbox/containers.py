"""How the local kubelet turns a container spec into a local process: pure functions.

Everything here takes pod and container objects as the API serves them
(plain dicts, camelCase keys) and returns data; the kubelet does the I/O. The
rules follow the Kubernetes API and the kubelet's behaviour, not GPUSpawner's
assumptions: ``$(VAR)`` expansion as in ``third_party/forked/golang/expansion``,
``fieldRef`` paths as the downward API defines them, phases and conditions as
``pkg/kubelet/status`` computes them.
"""

from __future__ import annotations

import math
import os
import re
import shutil
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit, urlunsplit


class ContainerConfigError(Exception):
    """The container cannot be configured (CreateContainerConfigError in a real kubelet)."""


class ContainerStartError(Exception):
    """The container's process cannot start (StartError, exit code 128)."""


# --- $(VAR) expansion ---------------------------------------------------------------------


def expand(text: str, env: Mapping[str, str]) -> str:
    """Expand ``$(VAR)`` references like Kubernetes does for command, args and env values.

    ``$$`` is an escaped ``$``; a reference to an undefined variable, or an
    unterminated one, is left as written.
    """
    out = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "$" or i + 1 >= len(text):
            out.append(c)
            i += 1
            continue
        nxt = text[i + 1]
        if nxt == "$":
            out.append("$")
            i += 2
        elif nxt == "(":
            end = text.find(")", i + 2)
            if end == -1:
                out.append(text[i:])
                break
            name = text[i + 2 : end]
            out.append(env[name] if name in env else text[i : end + 1])
            i = end + 1
        else:
            out.append(c)
            i += 1
    return "".join(out)


# --- environment --------------------------------------------------------------------------

_LABEL_REF = re.compile(r"^metadata\.(labels|annotations)\['(.+)'\]$")


def field_ref(pod: Mapping[str, Any], path: str, pod_ip: str, host_ip: str) -> str:
    """The value of a downward-API ``fieldRef`` path for ``pod``."""
    meta = pod.get("metadata", {})
    spec = pod.get("spec", {})
    simple = {
        "metadata.name": meta.get("name", ""),
        "metadata.namespace": meta.get("namespace", ""),
        "metadata.uid": meta.get("uid", ""),
        "spec.nodeName": spec.get("nodeName", ""),
        "spec.serviceAccountName": spec.get("serviceAccountName", ""),
        "status.hostIP": host_ip,
        "status.hostIPs": host_ip,
        "status.podIP": pod_ip,
        "status.podIPs": pod_ip,
    }
    if path in simple:
        return simple[path]
    m = _LABEL_REF.match(path)
    if m:
        return (meta.get(m.group(1)) or {}).get(m.group(2), "")
    raise ContainerConfigError(f"unsupported fieldRef path {path!r}")


_SUFFIXES = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "m": 10**-3,
}


def quantity(value: str) -> float:
    """A Kubernetes quantity ("500m", "2Gi", "4") as a number."""
    value = str(value).strip()
    for suffix, factor in sorted(_SUFFIXES.items(), key=lambda kv: -len(kv[0])):
        if value.endswith(suffix):
            return float(value[: -len(suffix)]) * factor
    return float(value)


def resource_field_ref(container: Mapping[str, Any], ref: Mapping[str, Any]) -> str:
    """The value of a ``resourceFieldRef`` (limits/requests of cpu, memory, ...)."""
    kind, _, name = ref["resource"].partition(".")
    resources = container.get("resources") or {}
    raw = (resources.get(kind) or {}).get(name)
    if raw is None and kind == "requests":
        raw = (resources.get("limits") or {}).get(name)
    if raw is None:
        return "0"
    divisor = quantity(ref.get("divisor") or "1")
    return str(math.ceil(quantity(raw) / divisor))


def build_env(
    pod: Mapping[str, Any],
    container: Mapping[str, Any],
    pod_ip: str,
    host_ip: str,
    configmaps: Mapping[str, Mapping[str, str]] | None = None,
    secrets: Mapping[str, Mapping[str, str]] | None = None,
) -> dict[str, str]:
    """The container's environment from its spec, in the kubelet's order.

    ``envFrom`` first, then ``env`` entries in order, each value expanded against
    the variables defined before it. ``configmaps``/``secrets`` hold the data of
    the objects the spec refers to (fetched by the caller).
    """
    configmaps = configmaps or {}
    secrets = secrets or {}
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = source.get("prefix", "")
        for kind, store in (("configMapRef", configmaps), ("secretRef", secrets)):
            ref = source.get(kind)
            if ref is None:
                continue
            data = store.get(ref["name"])
            if data is None:
                if ref.get("optional"):
                    continue
                what = "configmap" if kind == "configMapRef" else "secret"
                raise ContainerConfigError(f'{what} "{ref["name"]}" not found')
            for key, value in data.items():
                env[prefix + key] = value
    for var in container.get("env") or []:
        name = var["name"]
        if "valueFrom" not in var:
            env[name] = expand(var.get("value", ""), env)
            continue
        source = var["valueFrom"]
        if "fieldRef" in source:
            env[name] = field_ref(pod, source["fieldRef"]["fieldPath"], pod_ip, host_ip)
        elif "resourceFieldRef" in source:
            env[name] = resource_field_ref(container, source["resourceFieldRef"])
        else:
            for kind, store, what in (
                ("configMapKeyRef", configmaps, "configmap"),
                ("secretKeyRef", secrets, "secret"),
            ):
                ref = source.get(kind)
                if ref is None:
                    continue
                data = store.get(ref["name"])
                if data is None or ref["key"] not in data:
                    if ref.get("optional"):
                        break
                    if data is None:
                        raise ContainerConfigError(f'{what} "{ref["name"]}" not found')
                    raise ContainerConfigError(
                        f"couldn't find key {ref['key']} in {what} "
                        f"{pod['metadata']['namespace']}/{ref['name']}"
                    )
                env[name] = data[ref["key"]]
                break
    return env


def referenced_objects(container: Mapping[str, Any]) -> tuple[set[str], set[str]]:
    """Names of the ConfigMaps and Secrets a container's environment refers to."""
    configmaps: set[str] = set()
    secrets: set[str] = set()
    for source in container.get("envFrom") or []:
        if "configMapRef" in source:
            configmaps.add(source["configMapRef"]["name"])
        if "secretRef" in source:
            secrets.add(source["secretRef"]["name"])
    for var in container.get("env") or []:
        source = var.get("valueFrom") or {}
        if "configMapKeyRef" in source:
            configmaps.add(source["configMapKeyRef"]["name"])
        if "secretKeyRef" in source:
            secrets.add(source["secretKeyRef"]["name"])
    return configmaps, secrets


def merge_runtime_env(
    image_env: Mapping[str, str], plugin_env: Mapping[str, str], spec_env: Mapping[str, str]
) -> dict[str, str]:
    """The process environment: image ENV, overridden by device-plugin env, overridden by the spec.

    This is the precedence of a real node: the image's ENV lines are the base,
    and the CRI config the kubelet sends (device plugin envs, then the
    container's own env) replaces variables of the same name.
    """
    return {**image_env, **plugin_env, **spec_env}


# --- command line -------------------------------------------------------------------------


def container_argv(container: Mapping[str, Any], env: Mapping[str, str]) -> list[str]:
    """``command`` + ``args`` with ``$(VAR)`` expanded.

    Images are not pulled, so an image's ENTRYPOINT is unknown: ``args`` alone
    (as KubeSpawner sends) are taken as the whole command line, as with images
    whose entrypoint only execs its arguments (tini, docker-stacks' start scripts).
    """
    command = [expand(c, env) for c in container.get("command") or []]
    args = [expand(a, env) for a in container.get("args") or []]
    argv = command + args
    if not argv:
        raise ContainerStartError(
            "failed to generate container spec: no command specified (images are not "
            "pulled in the sandbox, so the pod must name the command to run)"
        )
    return argv


_IP_FLAGS = ("--ip", "--ServerApp.ip", "--NotebookApp.ip", "--SingleUserNotebookApp.ip")
_ANY_ADDRESSES = ("0.0.0.0", "::", "[::]", "")


def confine_to_pod_ip(
    argv: list[str], env: dict[str, str], pod_ip: str
) -> tuple[list[str], dict[str, str]]:
    """Make "listen on every address" mean the pod's own loopback address.

    In a pod, 0.0.0.0 is the pod's network namespace, not the host's. Here all
    pods share the host's, so the kubelet rewrites the places a notebook server
    takes its address from: ``--ip=0.0.0.0``-style flags and the host of
    ``JUPYTERHUB_SERVICE_URL`` (how KubeSpawner passes ``c.KubeSpawner.ip``).
    """
    out = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        flag, eq, value = arg.partition("=")
        if flag in _IP_FLAGS and eq and value.strip("'\"") in _ANY_ADDRESSES:
            out.append(f"{flag}={pod_ip}")
        elif arg in _IP_FLAGS and i + 1 < len(argv) and argv[i + 1] in _ANY_ADDRESSES:
            out += [arg, pod_ip]
            i += 1
        else:
            out.append(arg)
        i += 1
    env = dict(env)
    url = env.get("JUPYTERHUB_SERVICE_URL")
    if url:
        parts = urlsplit(url)
        if parts.hostname in ("0.0.0.0", "::", None, ""):
            port = f":{parts.port}" if parts.port else ""
            env["JUPYTERHUB_SERVICE_URL"] = urlunsplit(
                (parts.scheme, f"{pod_ip}{port}", parts.path, parts.query, parts.fragment)
            )
    return out, env


def replace_path(argv: list[str], env: dict[str, str], old: str, new: str) -> tuple[list, dict]:
    """Point every literal mention of ``old`` (a path inside the container) at ``new``.

    Used for ``terminationMessagePath``: there is no per-container /dev here,
    so the container's termination log is a file in its pod directory.
    """
    return [a.replace(old, new) for a in argv], {k: v.replace(old, new) for k, v in env.items()}


def resolve_executable(name: str, path: str) -> str | None:
    """The program a container command names, looked up on the container's PATH."""
    if "/" in name:
        return name if os.path.isfile(name) and os.access(name, os.X_OK) else None
    return shutil.which(name, path=path)


def not_found_message(name: str) -> str:
    """containerd's message for a command that is not in the image."""
    return (
        "failed to create containerd task: failed to create shim task: OCI runtime create "
        "failed: runc create failed: unable to start container process: error during "
        f'container init: exec: "{name}": executable file not found in $PATH: unknown'
    )


# --- status -------------------------------------------------------------------------------


def should_restart(restart_policy: str, exit_code: int) -> bool:
    """Whether a container that exited with ``exit_code`` is started again."""
    if restart_policy == "Always":
        return True
    if restart_policy == "OnFailure":
        return exit_code != 0
    return False


def backoff_seconds(restarts: int, initial: float = 10.0, cap: float = 300.0) -> float:
    """The kubelet's crash-loop back-off: 10s doubling to at most 5 minutes."""
    return min(cap, initial * (2 ** max(0, restarts)))


def pod_phase(
    restart_policy: str,
    init_done: bool,
    init_failed: bool,
    statuses: list[Mapping[str, Any]],
) -> str:
    """The pod phase from its containers' states (``getPhase`` in the kubelet)."""
    if init_failed:
        return "Failed"
    if not init_done or not statuses:
        return "Pending"
    running = sum(1 for s in statuses if "running" in s.get("state", {}))
    waiting = sum(1 for s in statuses if "waiting" in s.get("state", {}))
    terminated = [s["state"]["terminated"] for s in statuses if "terminated" in s["state"]]
    if (
        waiting
        and not running
        and not terminated
        and all(s.get("restartCount", 0) == 0 and "lastState" not in s for s in statuses)
    ):
        return "Pending"
    if running or waiting:
        return "Running"
    if restart_policy == "Always":
        return "Running"
    if all(t["exitCode"] == 0 for t in terminated):
        return "Succeeded"
    if restart_policy == "OnFailure":
        return "Running"
    return "Failed"
