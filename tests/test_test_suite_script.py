"""scripts/test-suite.sh, `make test`'s pytest runs, with a stand-in for each venv's pytest.

The stand-in records how it was called and exits with the code the test gives
its venv and half, so the script's handling of failures and of pytest's exit 5
(nothing collected) is what is tested.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from .conftest import REPO

SCRIPT = REPO / "scripts" / "test-suite.sh"

STAND_IN = """#!/bin/sh
venv=$(basename "$(dirname "$(dirname "$0")")")
echo "$venv $*" >> "$CALLS"
echo "output of $venv $*"
case "$*" in
  *" tests/e2e"*) exit "${RC_REAL:-0}" ;;
esac
eval "exit \\${RC_$venv:-0}"
"""


def run_script(tmp_path: Path, **env: str) -> tuple[subprocess.CompletedProcess, list[str]]:
    for venv in ("v61", "v55"):
        pytest = tmp_path / venv / "bin" / "pytest"
        pytest.parent.mkdir(parents=True, exist_ok=True)
        pytest.write_text(STAND_IN)
        pytest.chmod(0o755)
    calls = tmp_path / "calls"
    full_env = {
        "PATH": os.environ["PATH"],
        "VENV": str(tmp_path / "v61"),
        "VENV_JH55": str(tmp_path / "v55"),
        "LOGS": str(tmp_path / "logs"),
        "CALLS": str(calls),
        **env,
    }
    proc = subprocess.run(
        ["sh", str(SCRIPT)], env=full_env, capture_output=True, text=True, timeout=60
    )
    return proc, calls.read_text().splitlines() if calls.exists() else []


def test_both_halves_and_both_lines_run_and_their_output_is_shown(tmp_path):
    proc, calls = run_script(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    real = [c for c in calls if " tests/e2e" in c]
    assert real == ["v61 --durations=30 tests/e2e tests/images tests/sandbox tests/z2jh"]
    unit61 = [c for c in calls if c.startswith("v61") and c not in real]
    assert len(unit61) == 1
    for part in ("e2e", "images", "sandbox", "z2jh"):
        assert f"--ignore=tests/{part}" in unit61[0]
    unit55 = [c for c in calls if c.startswith("v55")]
    assert len(unit55) == 1 and "--ignore=tests/e2e" in unit55[0]
    # the background half's output is printed after the foreground's, not lost
    assert f"output of {unit61[0]}" in proc.stdout
    assert f"output of {unit55[0]}" in proc.stdout
    assert proc.stdout.index("output of v61 --durations=30 tests/e2e") < proc.stdout.index(
        f"output of {unit55[0]}"
    )
    assert "all passed" in proc.stdout


def test_a_failure_in_either_half_fails_the_run(tmp_path):
    proc, _ = run_script(tmp_path, RC_REAL="1")
    assert proc.returncode == 1
    assert "FAILED: real nodes, Docker, Helm (pytest exit 1)" in proc.stdout

    proc, calls = run_script(tmp_path / "b", RC_v55="1")
    assert proc.returncode == 1
    assert "FAILED: unit and hub-level, JupyterHub 5.5" in proc.stdout
    # the 6.1 line still ran to its end
    assert any(c.startswith("v61") and "--ignore=tests/e2e" in c for c in calls)


def test_a_run_that_collects_no_test_fails(tmp_path):
    proc, _ = run_script(tmp_path, RC_v55="5")
    assert proc.returncode == 1
    assert "pytest collected no tests (unit and hub-level, JupyterHub 5.5): failing" in proc.stdout

    proc, _ = run_script(tmp_path / "b", RC_REAL="5")
    assert proc.returncode == 1
    assert "pytest collected no tests (real nodes, Docker, Helm): failing" in proc.stdout


def test_a_chosen_subset_runs_alone_on_both_lines(tmp_path):
    proc, calls = run_script(
        tmp_path, PYTEST_ARGS="tests/test_catalog.py -k x", PYTEST_ARGS_JH55="tests/test_catalog.py"
    )
    assert proc.returncode == 0, proc.stdout
    assert calls == [
        "v61 --durations=30 tests/test_catalog.py -k x",
        "v55 -rs tests/test_catalog.py",
    ]
    proc, _ = run_script(tmp_path / "b", PYTEST_ARGS="tests/test_catalog.py", RC_v61="5")
    assert proc.returncode == 1
    assert "pytest collected no tests (JupyterHub 6.1): failing" in proc.stdout
