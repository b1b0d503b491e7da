"""Build the sandbox control plane binary from the Go module in ``sandbox/go``.

``python -m gpuspawner_sandbox.build`` compiles ``k8s.io/kubernetes`` (API
server, scheduler, controller manager) and embedded etcd into one binary. The
result is cached as ``.cache/sandbox/bin/k8s-<version>-<hash>``, where the hash
covers ``go.mod``, ``go.sum`` and every non-test ``.go`` file of the module
(``main.go``, the device plugin's package): any change to the pin or our code
builds a new binary, anything else reuses the cached one.

The cold build compiles about 2,500 packages and takes many minutes on a small
machine (see docs/sandbox.md for measured figures), so progress is printed
while it runs.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

from . import suitecosts

REPO_ROOT = Path(__file__).resolve().parents[2]
GO_MODULE_DIR = REPO_ROOT / "sandbox" / "go"
DEFAULT_CACHE_DIR = REPO_ROOT / ".cache" / "sandbox"

#: The Go release the module's go.mod asks for (k8s.io/kubernetes 1.36+ needs it).
MIN_GO = (1, 26)
GO_MISSING = (
    "Go 1.26 or newer is needed to build the local control plane: install it from "
    "https://go.dev/dl/ (or your package manager) and make sure `go` is on PATH."
)

#: Files whose content decides whether the cached binary is still current,
#: besides every non-test ``.go`` file (see :func:`source_files`).
SOURCE_FILES = ("go.mod", "go.sum")
#: Our packages the ``k8s`` binary links (its cache key covers them; tests check main.go agrees).
K8S_PACKAGES = ("deviceplugin",)

#: How often a "still building" line is printed when nothing else was.
PROGRESS_INTERVAL = 15.0


class BuildError(Exception):
    """The binary could not be built; the message is one readable sentence."""


class GoMissing(BuildError):
    """No Go toolchain new enough to build the control plane is installed."""


def cache_dir() -> Path:
    """Where binaries are cached; ``GPUSPAWNER_SANDBOX_CACHE`` overrides."""
    return Path(os.environ.get("GPUSPAWNER_SANDBOX_CACHE", DEFAULT_CACHE_DIR))


#: Moves the images' cache (the private Docker engine's data root with its layers, the
#: Debian base, the archives the nodes import) out of the checkout; ``gpuspawner-images``
#: reads the same variable. CI's fresh clones share one this way (.ci/run).
IMAGE_CACHE_ENV = "GPUSPAWNER_IMAGE_CACHE"


def image_cache_dir(repo: Path = REPO_ROOT) -> Path:
    """Where images are built and cached: ``$GPUSPAWNER_IMAGE_CACHE``, else the checkout's
    ``.cache/images``."""
    return Path(os.environ.get(IMAGE_CACHE_ENV) or repo / ".cache" / "images")


def kubernetes_version(go_mod: str) -> str:
    """The pinned ``k8s.io/kubernetes`` version in a go.mod's text."""
    match = re.search(r"^\s*k8s\.io/kubernetes\s+(v\S+)", go_mod, re.MULTILINE)
    if not match:
        raise BuildError("sandbox/go/go.mod does not require k8s.io/kubernetes at a version.")
    return match.group(1)


def source_files(module_dir: Path) -> list[str]:
    """The module's files that determine the ``k8s`` binary, relative to it (tests do not).

    Only the root package and the packages of ours it links (:data:`K8S_PACKAGES`): the
    module also holds small separate programs (under ``cmd/``) whose changes must not
    relink the ``k8s`` binary, which takes minutes.
    """
    roots = [module_dir.glob("*.go"), *(module_dir.joinpath(d).rglob("*.go") for d in K8S_PACKAGES)]
    go_files = sorted(
        str(p.relative_to(module_dir))
        for files in roots
        for p in files
        if not p.name.endswith("_test.go")
    )
    return [*SOURCE_FILES, *go_files]


def module_imports(go_source: str, module: str) -> set[str]:
    """The packages of ``module`` a Go source file imports, relative to the module."""
    prefix = module + "/"
    blocks = re.findall(r"^import\s*\((.*?)^\)", go_source, re.MULTILINE | re.DOTALL)
    singles = re.findall(r'^import\s+(?:[\w.]+\s+)?("[^"]+")', go_source, re.MULTILINE)
    paths = re.findall(r'"([^"\s]+)"', "\n".join([*blocks, *singles]))
    return {path[len(prefix) :] for path in paths if path.startswith(prefix)}


def module_path(go_mod: str) -> str:
    match = re.search(r"^module\s+(\S+)", go_mod, re.MULTILINE)
    if not match:
        raise BuildError("sandbox/go/go.mod names no module.")
    return match.group(1)


def source_hash(module_dir: Path) -> str:
    """A short digest of the files that determine the binary."""
    digest = hashlib.sha256()
    for name in source_files(module_dir):
        digest.update(name.encode() + b"\0")
        digest.update((module_dir / name).read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()[:12]


def binary_path(module_dir: Path = GO_MODULE_DIR, cache: Path | None = None) -> Path:
    """The cached binary's path for the module's current sources (it may not exist)."""
    if not (module_dir / "go.mod").is_file():
        raise BuildError(
            f"The control plane's Go module is not at {module_dir}: the sandbox runs "
            "from a clone of the gpuspawner repository (pip install -e .)."
        )
    version = kubernetes_version((module_dir / "go.mod").read_text())
    cache = cache if cache is not None else cache_dir()
    return cache / "bin" / f"k8s-{version}-{source_hash(module_dir)}"


def version_ldflags(version: str) -> str:
    """Linker flags that make ``/version`` report the pinned release.

    Without them the components report ``v0.0.0-master``, which clients
    (kubernetes_asyncio, KubeSpawner's version checks) take at face value.
    """
    match = re.fullmatch(r"v(\d+)\.(\d+)\..*", version)
    if not match:
        raise BuildError(f"Cannot read a major.minor version from {version}.")
    major, minor = match.groups()
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
        ]
    return " ".join(flags)


def parse_go_version(text: str) -> tuple[int, int] | None:
    """(major, minor) from ``go version`` output, e.g. ``go version go1.26.8 linux/amd64``."""
    match = re.search(r"\bgo(\d+)\.(\d+)", text)
    return (int(match.group(1)), int(match.group(2))) if match else None


def find_go() -> str:
    """The path of a Go toolchain new enough to build the module."""
    go = shutil.which("go")
    if go is None:
        raise GoMissing(GO_MISSING)
    try:
        out = subprocess.run(
            [go, "version"], capture_output=True, text=True, timeout=60, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise GoMissing(f"`go version` failed ({e}); {GO_MISSING}") from e
    found = parse_go_version(out)
    if found is None or found < MIN_GO:
        raise GoMissing(f"Found {out.strip()!r}, but {GO_MISSING}")
    return go


def _count_packages(go: str, module_dir: Path, env: dict[str, str]) -> int | None:
    """How many packages the build involves (an upper bound on what it compiles)."""
    try:
        out = subprocess.run(
            [go, "list", "-deps", "."],
            cwd=module_dir,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return len(out.splitlines())


def build(
    module_dir: Path = GO_MODULE_DIR,
    cache: Path | None = None,
    *,
    force: bool = False,
    jobs: int = 2,
    verbose: bool = False,
    out: TextIO | None = None,
) -> Path:
    """Build the control plane binary if the cached one is missing; return its path.

    Progress goes to ``out`` (standard error by default).
    """
    out = out if out is not None else sys.stderr
    target = binary_path(module_dir, cache)
    if target.exists() and not force:
        print(f"Control plane binary is up to date: {target}", file=out)
        return target

    with exclusive(target):
        if target.exists() and not force:  # built meanwhile by another process
            return target
        go = find_go()
        version = kubernetes_version((module_dir / "go.mod").read_text())
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(target.name + ".tmp")
        env = dict(os.environ, CGO_ENABLED="0", GOTOOLCHAIN="local")

        total = _count_packages(go, module_dir, env)
        print(
            f"Building the control plane and kubelet (k8s.io/kubernetes {version} + etcd) into {target}; "
            f"from a cold Go cache this compiles {total or 'about 2,500'} packages and takes many minutes "
            f"(Go's cache in {_go_env(go, 'GOCACHE', env)} makes later builds fast).",
            file=out,
            flush=True,
        )
        cmd = [
            go,
            "build",
            "-v",
            f"-p={jobs}",
            "-trimpath",
            # Our binary's identity is the pin, not the checkout's git state (and a
            # CI checkout without git, or owned by another user, must still build).
            "-buildvcs=false",
            f"-ldflags={version_ldflags(version)}",
            "-o",
            str(tmp),
            ".",
        ]
        try:
            compiled, elapsed = run_go(cmd, module_dir, env, out, total=total, verbose=verbose)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        tmp.replace(target)
        _prune(target)
        print(
            f"Built {target.name} in {elapsed:.0f}s ({compiled} packages compiled).",
            file=out,
            flush=True,
        )
        return target


#: The lock file beside a cached build's target (:func:`exclusive`).
LOCK_SUFFIX = ".lock"


@contextlib.contextmanager
def exclusive(target: Path) -> Iterator[None]:
    """Hold the lock of one cached build's target: another process building the same
    target (the suite's prebuild beside a test that needs the program) waits, then finds it
    built, instead of compiling it a second time into the same temporary path."""
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(target.name + LOCK_SUFFIX), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def progress_line(compiled: int, total: int | None, elapsed: float) -> str:
    """One progress line of a Go build: how far it is and, once it can tell, how long is left.

    ``go build -v`` names only the packages it compiles, not those Go's cache already
    holds, so ``total`` is an upper bound and the estimate assumes a cold cache: it can
    only overstate what is left.
    """
    if not total:
        return f"  still building… {compiled} packages compiled ({elapsed:.0f}s)"
    done = min(compiled, total)
    line = f"  still building… {done} of at most {total} packages compiled ({elapsed:.0f}s"
    # Too few packages or too little time make the rate meaningless.
    if done >= 20 and elapsed >= 10:
        left = (total - done) * elapsed / done
        line += f", at most about {_duration(left)} left"
    return line + ")"


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{max(seconds, 1):.0f}s"
    return f"{seconds / 60:.0f} min"


@suitecosts.recorded(suitecosts.GO_BUILD, lambda cmd, cwd, *a, **k: Path(cwd).name)
def run_go(
    cmd: list[str],
    cwd: Path,
    env: dict[str, str],
    out: TextIO,
    *,
    total: int | None = None,
    verbose: bool = False,
) -> tuple[int, float]:
    """Run a ``go build -v``/``go install -v`` command, printing progress.

    Returns (packages compiled, seconds); raises BuildError with the compiler's
    last lines when it fails.
    """
    started = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    compiled = 0
    tail: list[str] = []
    done = threading.Event()

    def report() -> None:
        while not done.wait(PROGRESS_INTERVAL):
            print(progress_line(compiled, total, time.monotonic() - started), file=out, flush=True)

    reporter = threading.Thread(target=report, daemon=True)
    reporter.start()
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip("\n")
            # `go build -v` prints one bare import path per package compiled;
            # anything else (compiler errors, downloads) is kept for the error message.
            if re.fullmatch(r"[\w.\-/~+]+", line):
                compiled += 1
                if verbose:
                    print(f"  {line}", file=out, flush=True)
            else:
                tail = [*tail[-29:], line]
        rc = proc.wait()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    finally:
        done.set()
        reporter.join()

    elapsed = time.monotonic() - started
    if rc != 0:
        detail = "\n".join(tail[-20:])
        raise BuildError(f"`go` failed after {elapsed:.0f}s (exit {rc}):\n{detail}")
    return compiled, elapsed


def _go_env(go: str, name: str, env: dict[str, str]) -> str:
    try:
        return subprocess.run(
            [go, "env", name], env=env, capture_output=True, text=True, timeout=60
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def _prune(current: Path) -> None:
    """Delete binaries built from older sources (each is ~150 MB)."""
    for old in current.parent.glob("k8s-*"):
        if old != current and not old.name.endswith((".tmp", LOCK_SUFFIX)):
            old.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m gpuspawner_sandbox.build",
        description="Build the sandbox's Kubernetes control plane (cached; rebuilt on change).",
    )
    parser.add_argument("--force", action="store_true", help="rebuild even if cached")
    parser.add_argument("--jobs", type=int, default=2, help="packages compiled in parallel")
    parser.add_argument("--verbose", action="store_true", help="print every package compiled")
    parser.add_argument(
        "--print-path",
        action="store_true",
        help="only print where the binary for the current sources is (or would be)",
    )
    args = parser.parse_args(argv)
    try:
        if args.print_path:
            print(binary_path())
            return 0
        path = build(force=args.force, jobs=args.jobs, verbose=args.verbose)
    except BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("Build interrupted; nothing was cached.", file=sys.stderr)
        return 130
    print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
