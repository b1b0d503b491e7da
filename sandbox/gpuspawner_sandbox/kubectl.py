"""``kubectl`` for the local cluster: upstream's, from the control plane's own pin.

``sandbox/go/cmd/kubectl`` is ``k8s.io/kubectl``'s command at the staging version of
the ``k8s.io/kubernetes`` release the control plane is built from: a program of its
own (:data:`gpuspawner_sandbox.nodebuild.KUBECTL`), cached like the nodes' programs.
The ``kubectl`` command of this distribution (``sandbox/pyproject.toml``; ``make
setup`` puts it in ``.venv/bin``) finds the binary built from the checkout's current
sources, builds it if it is missing (the sandbox's build step, which ``up``, the demo
and the tests run, has built it already), and becomes it (exec): arguments, standard
streams, signals and the exit status are kubectl's own.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import sysconfig
from pathlib import Path

from . import build, nodebuild

NAME = "kubectl"


def shim_path() -> Path:
    """Where ``pip install`` put this distribution's ``kubectl`` command (the venv's bin)."""
    return Path(sysconfig.get_path("scripts")) / NAME


def command(path_env: str | None = None) -> str:
    """How to type this kubectl in a shell: ``kubectl`` where that name finds it, else its path.

    A ``kubectl`` of someone else's found first on PATH (or none: the venv not activated)
    would not be the one printed lines promise, so those name ours by its full path.
    """
    shim = shim_path()
    found = shutil.which(NAME, path=path_env)
    if found is not None and Path(found).resolve() == shim.resolve():
        return NAME
    return str(shim)


def typed(*args: str) -> str:
    """A kubectl command line as it is to be typed (``args`` are written as given)."""
    return " ".join([shlex.quote(command()), *args])


def usage_lines(kubeconfig: Path) -> list[str]:
    """The lines that reach the cluster from a shell, exactly as they are to be typed."""
    return [f"export KUBECONFIG={shlex.quote(str(kubeconfig))}", typed("get", "nodes")]


def main(argv: list[str] | None = None) -> int:
    """Run the cluster's kubectl with ``argv`` (default: this process's arguments)."""
    args = sys.argv[1:] if argv is None else argv
    try:
        binary = nodebuild.build_local(nodebuild.KUBECTL, out=sys.stderr)
    except build.BuildError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        # e.g. the cache was made by root (`sudo gpuspawner-sandbox up`) and is not ours
        print(
            f"error: cannot build kubectl into {build.cache_dir()}: {e.strerror}.", file=sys.stderr
        )
        return 1
    except KeyboardInterrupt:
        print("Build interrupted; nothing was cached.", file=sys.stderr)
        return 130
    # argv[0] "kubectl": kubectl names itself (help, plugins) after it.
    os.execv(binary, [NAME, *args])
    return 1  # unreachable: execv replaces this process or raises


if __name__ == "__main__":
    sys.exit(main())
