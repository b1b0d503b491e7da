"""Our Go packages' own unit tests (`go test`), run with the rest of the suite.

Without Go they skip loudly, and fail in CI, like the other sandbox tests.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from gpuspawner_sandbox import build, testing

MODULES = {
    "sandbox/go": build.GO_MODULE_DIR,
}
PACKAGES = ("deviceplugin", "nvidiasmi")


def test_every_package_with_tests_is_run():
    with_tests = {
        p.parent.relative_to(build.GO_MODULE_DIR).as_posix()
        for p in build.GO_MODULE_DIR.rglob("*_test.go")
    }
    assert with_tests == set(PACKAGES)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_go_test_passes(module):
    try:
        go = build.find_go()
    except build.GoMissing as e:
        testing.sandbox_unavailable(str(e))
    env = dict(os.environ, CGO_ENABLED="0", GOTOOLCHAIN="local")
    proc = subprocess.run(
        # -trimpath as the binaries are built, so Go's build cache serves both (without
        # it `go test` compiles every Kubernetes package again); only packages with tests.
        [go, "test", "-count=1", "-trimpath", *[f"./{p}/" for p in PACKAGES]],
        cwd=MODULES[module],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, (
        f"go test in {module} failed:\n{proc.stdout[-4000:]}{proc.stderr[-2000:]}"
    )
    for package in PACKAGES:
        assert f"ok  \tgpuspawner/sandbox/k8s/{package}" in proc.stdout
