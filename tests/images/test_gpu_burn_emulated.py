"""gpu-burn-emulated (images/common): drives its container's emulated GPUs' usage files.

It runs here as the image runs it (a python3 script), on a usage directory
laid out as NVIDIA's runtime mounts it into a GPU container: one directory
per GPU UUID.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .conftest import REPO

SCRIPT = REPO / "images" / "common" / "gpu-burn-emulated"
GPUS = ("GPU-aaaa", "GPU-bbbb")


def _module():
    loader = importlib.machinery.SourceFileLoader("gpu_burn_emulated", str(SCRIPT))
    spec = importlib.util.spec_from_loader("gpu_burn_emulated", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


@pytest.fixture
def usage_dir(tmp_path):
    for uuid in GPUS:
        (tmp_path / uuid).mkdir()
    return tmp_path


def _start(usage_dir: Path, *args: str) -> subprocess.Popen:
    env = dict(os.environ, GPU_BURN_USAGE_DIR=str(usage_dir))
    return subprocess.Popen(
        [sys.executable, str(SCRIPT), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _read(usage_dir: Path, uuid: str) -> dict | None:
    try:
        return json.loads((usage_dir / uuid / "usage.json").read_text())
    except (OSError, ValueError):
        return None


def _wait_for_reports(usage_dir: Path) -> dict[str, dict]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        docs = {u: _read(usage_dir, u) for u in GPUS}
        if all(docs.values()):
            return docs
        time.sleep(0.05)
    raise AssertionError("gpu-burn-emulated wrote no usage files")


def test_the_default_directory_is_where_the_sandbox_mounts_usage():
    from gpuspawner_sandbox import gpudriver

    expected = f"{gpudriver.CONTAINER_VIEW_ROOT}/{gpudriver.USAGE_DIR}"
    assert _module().DEFAULT_USAGE_DIR == expected
    assert _module().USAGE_FILE == gpudriver.USAGE_FILE
    assert os.access(SCRIPT, os.X_OK)


def test_a_burn_reports_every_visible_gpu_busy_then_idle(usage_dir):
    proc = _start(usage_dir, "30", "60", "--fb-used-mib", "2048")
    try:
        docs = _wait_for_reports(usage_dir)
        now = time.time()
        for doc in docs.values():
            assert doc["gpu_util_percent"] == 60 and doc["fb_used_mib"] == 2048
            # A lease, renewed while it runs: a killed burn stops counting soon.
            assert now < doc["until"] <= now + _module().LEASE
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    assert "GPU-aaaa, GPU-bbbb at 60%" in out
    after = time.time()
    for uuid in GPUS:
        doc = _read(usage_dir, uuid)
        assert doc["gpu_util_percent"] == 0 and doc["until"] <= after
    # Only the files: no leftovers beside them.
    assert sorted(p.name for p in (usage_dir / GPUS[0]).iterdir()) == ["usage.json"]


def test_a_burn_ends_by_itself_and_leaves_the_gpus_idle(usage_dir):
    proc = _start(usage_dir, "0.5", "90")
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    for uuid in GPUS:
        assert _read(usage_dir, uuid)["until"] <= time.time()


def test_without_gpus_it_says_so_in_one_sentence(tmp_path):
    proc = _start(tmp_path / "absent", "10")
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert err.strip().startswith("gpu-burn-emulated: no emulated GPU is given to this container")
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["0"], "SECONDS must be a positive number of seconds, not 0."),
        (["10", "150"], "PERCENT must be between 0 and 100, not 150."),
        (["10", "50", "--fb-used-mib", "-1"], "--fb-used-mib must be 0 or more, not -1."),
        (["ten"], "invalid float value: 'ten'"),
    ],
)
def test_bad_arguments_are_refused_clearly(usage_dir, args, message):
    proc = _start(usage_dir, *args)
    _out, err = proc.communicate(timeout=30)
    assert proc.returncode == 2
    assert message in err and "Traceback" not in err
    assert all(_read(usage_dir, u) is None for u in GPUS)
