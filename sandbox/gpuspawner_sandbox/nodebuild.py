"""Build what a real node runs besides the kubelet: containerd, its runc shim,
the CNI plugins, NVIDIA's container runtime (GPU nodes), the programs inside
our own pause and test images, and the emulated driver's nvidia-smi; and, for
people at the cluster rather than its nodes, kubectl from the control plane's pin.

The kubelet itself is a component of the control plane's multi-call binary
(:mod:`gpuspawner_sandbox.build`, ``k8s kubelet``), which shares its compile.
containerd, the CNI plugins and NVIDIA's container toolkit have their own ``go.mod`` files and are built
from them, unchanged, with ``go install module/cmd/x@version`` (the Go module
proxy serves them; nothing is vendored). runc is Debian's package
(``scripts/install-system-packages.sh``).

Everything lands in ``<cache>/bin/<name>-<version>-<hash>/``, where the hash
covers what decides the binaries (packages, tags, flags, or our sources); a
directory that exists is reused, a changed pin builds a new one.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

from . import build, gpudriver

#: Our Go module with the pause and test-tool programs (standard library only).
IMAGE_MODULE_DIR = build.REPO_ROOT / "sandbox" / "nodeimages"
IMAGE_PROGRAMS = ("pause", "tool")

#: The emulated nvidia-smi: a small static program of the sandbox's Go module, built on its
#: own (linking it into `k8s` would relink that, which takes minutes).

#: Debian's runc (the package scripts/install-system-packages.sh installs).
RUNC_CANDIDATES = ("/usr/sbin/runc", "/usr/bin/runc")
RUNC_MISSING = (
    "runc is needed for real nodes: install Debian's package "
    "(sh scripts/install-system-packages.sh, or apt-get install runc)."
)


@dataclass(frozen=True)
class GoInstall:
    """One ``go install`` of packages of a module at a version, with build tags."""

    packages: tuple[str, ...]
    tags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ("-s", "-w")


@dataclass(frozen=True)
class GoTool:
    """Binaries installed from a Go module at a pinned version into one directory."""

    name: str
    module: str
    version: str
    installs: tuple[GoInstall, ...]
    #: Rough cold-build time on 2 cores, printed so nobody thinks it hangs.
    cold_estimate: str
    #: Whether the module needs cgo (the result then links libc dynamically).
    #: Not in the repr: the static tools' cache directories keep their names.
    cgo: bool = field(default=False, repr=False)

    @property
    def binaries(self) -> tuple[str, ...]:
        return tuple(p.rsplit("/", 1)[-1] for i in self.installs for p in i.packages)


CONTAINERD_MODULE = "github.com/containerd/containerd/v2"
CONTAINERD_VERSION = "v2.4.2"

CONTAINERD = GoTool(
    name="containerd",
    module=CONTAINERD_MODULE,
    version=CONTAINERD_VERSION,
    installs=(
        GoInstall(
            ("cmd/containerd", "cmd/ctr"),
            ldflags=("-s", "-w", f"-X {CONTAINERD_MODULE}/version.Version={CONTAINERD_VERSION}"),
        ),
        # The shim needs no gRPC server (it speaks ttrpc); containerd builds it so.
        GoInstall(("cmd/containerd-shim-runc-v2",), tags=("no_grpc",)),
    ),
    cold_estimate="about 4 minutes",
)

CNI_PLUGINS = GoTool(
    name="cni-plugins",
    module="github.com/containernetworking/plugins",
    version="v1.10.0",
    installs=(
        GoInstall(("plugins/main/bridge", "plugins/ipam/host-local", "plugins/main/loopback")),
    ),
    cold_estimate="about 20 seconds",
)

#: NVIDIA's container runtime, its CDI hook and nvidia-ctk. go-nvml (and its
#: cuda/dxcore packages) need cgo, though NVML is only loaded at run time (in
#: CDI mode never): the binaries link just libc. With CGO_ENABLED=0 nothing builds.
NVIDIA_TOOLKIT = GoTool(
    name="nvidia-container-toolkit",
    module="github.com/NVIDIA/nvidia-container-toolkit",
    version="v1.20.2",
    installs=(
        GoInstall(("cmd/nvidia-container-runtime", "cmd/nvidia-cdi-hook", "cmd/nvidia-ctk")),
    ),
    cold_estimate="about 2 minutes",
    cgo=True,
)

NODE_TOOLS = (CONTAINERD, CNI_PLUGINS, NVIDIA_TOOLKIT)


@dataclass(frozen=True)
class NodeBinaries:
    """Paths of everything a real node runs."""

    k8s: Path  # the multi-call binary; `k8s kubelet` is the kubelet
    containerd_dir: Path  # containerd, ctr, containerd-shim-runc-v2
    cni_dir: Path
    images_dir: Path  # pause, tool (static; packed into OCI images)
    runc: Path
    nvidia_dir: Path  # nvidia-container-runtime, nvidia-cdi-hook, nvidia-ctk
    nvidia_smi: Path  # the emulated driver's nvidia-smi (static)
    dcgm_exporter: Path  # the emulated DCGM exporter (static; one per GPU node)
    coredns: Path  # the cluster DNS (one per machine, with the cluster network)

    @property
    def containerd(self) -> Path:
        return self.containerd_dir / "containerd"

    @property
    def ctr(self) -> Path:
        return self.containerd_dir / "ctr"

    @property
    def nvidia_runtime(self) -> Path:
        return self.nvidia_dir / "nvidia-container-runtime"

    @property
    def nvidia_cdi_hook(self) -> Path:
        return self.nvidia_dir / "nvidia-cdi-hook"

    @property
    def nvidia_ctk(self) -> Path:
        return self.nvidia_dir / "nvidia-ctk"


def tool_hash(tool: GoTool) -> str:
    """A short digest of everything that decides a tool's binaries."""
    key = repr(tool) + ("\0cgo" if tool.cgo else "")
    return hashlib.sha256(key.encode()).hexdigest()[:12]


def tool_dir(tool: GoTool, cache: Path | None = None) -> Path:
    cache = cache if cache is not None else build.cache_dir()
    return cache / "bin" / f"{tool.name}-{tool.version}-{tool_hash(tool)}"


def images_source_hash(module_dir: Path = IMAGE_MODULE_DIR) -> str:
    """A short digest of our image programs' sources (every file of the module)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in module_dir.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(module_dir)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def images_dir(module_dir: Path = IMAGE_MODULE_DIR, cache: Path | None = None) -> Path:
    cache = cache if cache is not None else build.cache_dir()
    return cache / "bin" / f"nodeimages-{images_source_hash(module_dir)}"


def install_commands(go: str, tool: GoTool, jobs: int = 2) -> list[list[str]]:
    """The ``go install`` command lines that build a tool (pure)."""
    cmds = []
    for inst in tool.installs:
        cmd = [go, "install", "-v", f"-p={jobs}", "-trimpath"]
        if inst.tags:
            cmd.append("-tags=" + ",".join(inst.tags))
        cmd.append("-ldflags=" + " ".join(inst.ldflags))
        cmd += [f"{tool.module}/{pkg}@{tool.version}" for pkg in inst.packages]
        cmds.append(cmd)
    return cmds


def _go_env(cgo: bool = False) -> dict[str, str]:
    # Static binaries unless a module needs cgo, never a downloaded toolchain;
    # modules come from the proxy.
    return dict(os.environ, CGO_ENABLED="1" if cgo else "0", GOTOOLCHAIN="local")


def _complete(directory: Path, names: tuple[str, ...]) -> bool:
    return all((directory / n).is_file() for n in names)


def _prune(current: Path, stem: str) -> None:
    """Delete directories of the same tool built from an older pin or source."""
    for old in current.parent.glob(f"{stem}-*"):
        if old != current and old.is_dir() and not old.name.endswith(".tmp"):
            shutil.rmtree(old, ignore_errors=True)


def _promote(
    tmp: Path, target: Path, name: str, out: TextIO, compiled: int, elapsed: float
) -> None:
    """A finished build's directory becomes the cached one; older ones go."""
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    _prune(target, name)
    print(f"Built {name} in {elapsed:.0f}s ({compiled} packages compiled).", file=out, flush=True)


def build_tool(tool: GoTool, cache: Path | None = None, *, out: TextIO | None = None) -> Path:
    """Install a tool's binaries into its cache directory if missing; return the directory."""
    out = out if out is not None else sys.stderr
    target = tool_dir(tool, cache)
    if _complete(target, tool.binaries):
        return target
    with build.exclusive(target):
        if _complete(target, tool.binaries):  # built meanwhile by another process
            return target
        go = build.find_go()
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        env = dict(_go_env(tool.cgo), GOBIN=str(tmp))
        print(
            f"Building {tool.name} {tool.version} ({', '.join(tool.binaries)}) from {tool.module}; "
            f"from a cold Go cache this takes {tool.cold_estimate}.",
            file=out,
            flush=True,
        )
        compiled = 0
        elapsed = 0.0
        try:
            for cmd in install_commands(go, tool):
                # Outside any module: `go install pkg@version` uses that module's own go.mod.
                n, t = build.run_go(cmd, tmp, env, out)
                compiled, elapsed = compiled + n, elapsed + t
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _promote(tmp, target, tool.name, out, compiled, elapsed)
        return target


def build_image_programs(
    module_dir: Path = IMAGE_MODULE_DIR, cache: Path | None = None, *, out: TextIO | None = None
) -> Path:
    """Build the pause and test-tool programs (static) if missing; return their directory."""
    out = out if out is not None else sys.stderr
    target = images_dir(module_dir, cache)
    if _complete(target, IMAGE_PROGRAMS):
        return target
    with build.exclusive(target):
        if _complete(target, IMAGE_PROGRAMS):  # built meanwhile by another process
            return target
        go = build.find_go()
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        print(f"Building the node images' programs ({', '.join(IMAGE_PROGRAMS)})…", file=out)
        cmd = [go, "build", "-v", "-trimpath", "-ldflags=-s -w", "-o", str(tmp) + "/"]
        cmd += [f"./{name}" for name in IMAGE_PROGRAMS]
        try:
            build.run_go(cmd, module_dir, _go_env(), out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        shutil.rmtree(target, ignore_errors=True)
        tmp.rename(target)
        _prune(target, "nodeimages")
        return target


def smi_ldflags() -> str:
    """The linker flags that give nvidia-smi the driver's layout from gpudriver's constants."""
    settings = {
        "viewRoot": gpudriver.CONTAINER_VIEW_ROOT,
        "driverDir": gpudriver.VIEW_DRIVER_DIR,
        "gpusDir": gpudriver.VIEW_GPUS_DIR,
        "usageDir": gpudriver.USAGE_DIR,
        "driverFile": gpudriver.DRIVER_VIEW_FILE,
        "gpuFile": gpudriver.GPU_VIEW_FILE,
        "usageFile": gpudriver.USAGE_FILE,
        "capsDir": gpudriver.NVIDIA_CAPS_DIR,
        "emulatedRootEnv": gpudriver.EMULATED_ROOT_ENV,
    }
    return " ".join(["-s", "-w", *(f"-X main.{k}={v}" for k, v in settings.items())])


@dataclass(frozen=True)
class LocalProgram:
    """A program built from one of our own Go modules in this repository.

    Cached under ``<cache>/bin/<name>-<hash>/``; the hash covers the files of its
    ``sources`` (tests excepted) and the link flags.
    """

    name: str
    module_dir: Path
    #: What the build prints first, so a long build is not taken for a hang.
    describe: str
    package: str = "."
    ldflags: str = "-s -w"
    #: The files and directories of the module that decide the binary (its packages,
    #: go.mod, go.sum); empty: the whole module directory.
    sources: tuple[str, ...] = ()

    @property
    def binary(self) -> str:
        return self.name


def local_source_hash(program: LocalProgram) -> str:
    digest = hashlib.sha256(program.ldflags.encode() + b"\0" + program.package.encode() + b"\0")
    roots = [program.module_dir / s for s in program.sources] or [program.module_dir]
    files = {p for root in roots for p in ([root] if root.is_file() else root.rglob("*"))}
    for path in sorted(p for p in files if p.is_file()):
        if path.name.endswith("_test.go"):
            continue
        digest.update(str(path.relative_to(program.module_dir)).encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def local_dir(program: LocalProgram, cache: Path | None = None) -> Path:
    cache = cache if cache is not None else build.cache_dir()
    return cache / "bin" / f"{program.name}-{local_source_hash(program)}"


def build_local(
    program: LocalProgram, cache: Path | None = None, *, out: TextIO | None = None
) -> Path:
    """Build a program of ours (static) if missing; return the binary's path."""
    out = out if out is not None else sys.stderr
    target = local_dir(program, cache)
    if _complete(target, (program.binary,)):
        return target / program.binary
    with build.exclusive(target):
        if _complete(target, (program.binary,)):  # built meanwhile by another process
            return target / program.binary
        go = build.find_go()
        tmp = target.with_name(target.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        print(program.describe, file=out, flush=True)
        cmd = [go, "build", "-v", "-trimpath", f"-ldflags={program.ldflags}"]
        cmd += ["-o", str(tmp / program.binary), program.package]
        try:
            compiled, elapsed = build.run_go(cmd, program.module_dir, _go_env(), out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _promote(tmp, target, program.name, out, compiled, elapsed)
        return target / program.binary


#: The emulated DCGM exporter, one per GPU node: its own small binary of our module, so
#: changing it never relinks the ``k8s`` binary (seconds with Go's cache warm).
DCGM_EXPORTER = LocalProgram(
    name="dcgm-exporter",
    module_dir=build.GO_MODULE_DIR,
    describe="Building the emulated DCGM exporter (sandbox/go/cmd/dcgm-exporter)…",
    package="./cmd/dcgm-exporter",
    sources=(
        *build.SOURCE_FILES,
        "cmd/dcgm-exporter",
        "dcgm",
        "gpuusage",
        "podresources",
        "deviceplugin",
    ),
)

#: The emulated nvidia-smi, mounted into GPU containers: static, standard library only,
#: told the driver's layout by link flags from gpudriver's constants.
NVIDIA_SMI = LocalProgram(
    name="nvidia-smi",
    module_dir=build.GO_MODULE_DIR,
    describe="Building the emulated nvidia-smi (standard library only; seconds)…",
    package="./cmd/nvidia-smi",
    ldflags=smi_ldflags(),
    sources=(*build.SOURCE_FILES, "cmd/nvidia-smi", "nvidiasmi"),
)

#: The cluster DNS (gpuspawner_sandbox.clusterdns): CoreDNS from its Go module with
#: the cluster-DNS plugins only (sandbox/coredns), its own module.
COREDNS = LocalProgram(
    name="coredns",
    module_dir=build.REPO_ROOT / "sandbox" / "coredns",
    describe=(
        "Building CoreDNS (github.com/coredns/coredns with the cluster DNS plugins only); "
        "from a cold Go cache this takes about 2 minutes."
    ),
)


def kubectl_ldflags(module_dir: Path = build.GO_MODULE_DIR) -> str:
    """The ``k8s`` binary's version flags: ``kubectl version`` names the cluster's release."""
    go_mod = module_dir / "go.mod"
    if not go_mod.is_file():  # not a clone: nothing builds, and build.binary_path says why
        return "-s -w"
    return build.version_ldflags(build.kubernetes_version(go_mod.read_text()))


#: Upstream's kubectl (k8s.io/kubectl at the staging version of the control plane's pin),
#: for people at the local cluster (gpuspawner_sandbox.kubectl puts it on the venv's PATH).
#: Its own binary, so adding or changing it never relinks ``k8s``, and the control plane's
#: processes carry none of kubectl's packages.
KUBECTL = LocalProgram(
    name="kubectl",
    module_dir=build.GO_MODULE_DIR,
    describe=(
        "Building kubectl (sandbox/go/cmd/kubectl, k8s.io/kubectl at the control plane's pin); "
        "about 30 seconds once the control plane is built, several minutes from a cold Go cache."
    ),
    package="./cmd/kubectl",
    ldflags=kubectl_ldflags(),
    sources=(*build.SOURCE_FILES, "cmd/kubectl"),
)

#: Our programs built from sandbox/go besides the ``k8s`` binary.
MODULE_PROGRAMS = (NVIDIA_SMI, DCGM_EXPORTER, KUBECTL)


def find_runc() -> Path:
    """Debian's runc (or any runc on PATH)."""
    for candidate in (*RUNC_CANDIDATES, shutil.which("runc")):
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    raise build.BuildError(RUNC_MISSING)


def go_arch(machine: str | None = None) -> str:
    """The GOARCH (= OCI architecture) of this machine, e.g. ``amd64``."""
    machine = (machine or platform.machine()).lower()
    return {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm"}.get(machine, machine)


def build_all(cache: Path | None = None, *, out: TextIO | None = None) -> NodeBinaries:
    """Build (or find cached) everything real nodes need."""
    out = out if out is not None else sys.stderr
    runc = find_runc()
    k8s = build.build(cache=cache, out=out)
    dirs = {tool.name: build_tool(tool, cache, out=out) for tool in NODE_TOOLS}
    # Not a node's: people's kubectl for the cluster (the shim finds it by its sources).
    build_local(KUBECTL, cache, out=out)
    return NodeBinaries(
        k8s=k8s,
        containerd_dir=dirs[CONTAINERD.name],
        cni_dir=dirs[CNI_PLUGINS.name],
        images_dir=build_image_programs(cache=cache, out=out),
        runc=runc,
        nvidia_dir=dirs[NVIDIA_TOOLKIT.name],
        nvidia_smi=build_local(NVIDIA_SMI, cache, out=out),
        dcgm_exporter=build_local(DCGM_EXPORTER, cache, out=out),
        coredns=build_local(COREDNS, cache, out=out),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpuspawner_sandbox.nodebuild",
        description="Build the real nodes' kubelet, containerd, CNI plugins and image programs.",
    )
    parser.parse_args(argv)
    try:
        binaries = build_all()
    except build.BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("Build interrupted; nothing incomplete was cached.", file=sys.stderr)
        return 130
    for name, value in vars(binaries).items():
        print(f"{name}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
