"""The venv's ``kubectl``: upstream's at the control plane's pin, and the lines printed for it.

Against running clusters: tests/sandbox/test_cli.py runs the lines ``up`` prints, and
tests/e2e/test_kubectl.py execs into a GPU notebook pod of the end-to-end stack.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from gpuspawner_sandbox import build, kubectl, nodebuild, testing

#: What `make setup` puts on the venv's PATH (sandbox/pyproject.toml's `kubectl`).
SHIM = Path(sys.executable).parent / "kubectl"


@pytest.fixture(scope="module")
def built(pytestconfig) -> Path:
    """The kubectl binary for the checkout's sources, built (with progress) if missing."""
    with testing.capture_disabled(pytestconfig):
        try:
            return nodebuild.build_local(nodebuild.KUBECTL, out=sys.stderr)
        except build.GoMissing as e:
            testing.sandbox_unavailable(str(e))
    raise AssertionError("unreachable: sandbox_unavailable raises")


def test_kubectl_is_required_at_the_pins_staging_version():
    go_mod = (build.GO_MODULE_DIR / "go.mod").read_text()
    version = build.kubernetes_version(go_mod)
    staging = "v0." + version.split(".", 1)[1]
    require = re.search(r"^require \((.*?)^\)", go_mod, re.MULTILINE | re.DOTALL).group(1)
    assert re.search(rf"^\s*k8s\.io/kubectl {re.escape(staging)}$", require, re.MULTILINE)
    assert f"k8s.io/kubectl => k8s.io/kubectl {staging}" in go_mod


def test_the_shim_runs_upstreams_kubectl_at_the_pin(built):
    out = subprocess.run(
        [str(SHIM), "version", "--client", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    version = build.kubernetes_version((build.GO_MODULE_DIR / "go.mod").read_text())
    assert json.loads(out)["clientVersion"]["gitVersion"] == version
    # kubectl's own commands and exit status come through the shim unchanged
    unknown = subprocess.run([str(SHIM), "no-such-command"], capture_output=True, text=True)
    assert unknown.returncode == 1
    assert 'unknown command "no-such-command" for "kubectl"' in unknown.stderr


def test_main_execs_the_cached_binary_as_kubectl(monkeypatch, tmp_path):
    binary = tmp_path / "kubectl"
    monkeypatch.setattr(nodebuild, "build_local", lambda program, out=None: binary)
    calls = []
    monkeypatch.setattr(os, "execv", lambda path, argv: calls.append((path, argv)))
    kubectl.main(["get", "nodes"])
    assert calls == [(binary, ["kubectl", "get", "nodes"])]


def test_a_failed_build_is_one_sentence(monkeypatch, capsys):
    def missing(program, out=None):
        raise build.GoMissing(build.GO_MISSING)

    monkeypatch.setattr(nodebuild, "build_local", missing)
    assert kubectl.main(["get", "nodes"]) == 1
    err = capsys.readouterr().err
    assert err == f"error: {build.GO_MISSING}\n"


def test_an_unwritable_cache_is_one_sentence(monkeypatch, capsys):
    def denied(program, out=None):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(nodebuild, "build_local", denied)
    assert kubectl.main([]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: cannot build kubectl into ") and "Traceback" not in err
    assert err.rstrip().endswith("Permission denied.")


def test_command_is_kubectl_only_where_that_name_finds_ours(monkeypatch, tmp_path):
    ours = tmp_path / "venv" / "bin" / "kubectl"
    other = tmp_path / "elsewhere" / "kubectl"
    for path in (ours, other):
        path.parent.mkdir(parents=True)
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755)
    monkeypatch.setattr(kubectl, "shim_path", lambda: ours)
    assert kubectl.command(f"{ours.parent}:{other.parent}") == "kubectl"
    # someone else's kubectl first on PATH, or none: ours by its full path
    assert kubectl.command(f"{other.parent}:{ours.parent}") == str(ours)
    assert kubectl.command(str(tmp_path)) == str(ours)


def test_usage_lines_work_as_typed_with_spaces_in_paths(monkeypatch, tmp_path):
    ours = tmp_path / "my venv" / "bin" / "kubectl"
    monkeypatch.setattr(kubectl, "shim_path", lambda: ours)
    monkeypatch.setenv("PATH", "/nonexistent")
    config = tmp_path / "state dir" / "admin.kubeconfig"
    assert kubectl.usage_lines(config) == [
        f"export KUBECONFIG='{config}'",
        f"'{ours}' get nodes",
    ]
    # the demo's exec line: the command quoted, the placeholder as written
    assert kubectl.typed("exec", "jupyter-<name>") == f"'{ours}' exec jupyter-<name>"


def test_the_shim_is_the_venvs_command():
    assert kubectl.shim_path() == SHIM
    assert SHIM.is_file(), "make setup (pip install -e ./sandbox) installs the kubectl command"
