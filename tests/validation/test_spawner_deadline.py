"""GPUSpawner's side of the GPU check's deadline: ``validation_timeout`` reaches the check's
command, and a check that runs well past it fails the spawn with the reason.

Pods are built by KubeSpawner's own code, as in tests/hub/test_spawner.py (whose helpers these use).
"""

from __future__ import annotations

import time
from datetime import datetime, timezone

import pytest
from traitlets import TraitError
from traitlets.config import Config

from gpuspawner.hub import state as hubstate
from gpuspawner.hub.spawner import GPUCheckFailed
from gpuspawner.validation import gpucheck
from gpuspawner.validation.podstatus import OVERDUE_GRACE
from tests.hub.test_spawner import build, make_spawner

OPTIONS = {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"}


@pytest.fixture(autouse=True)
def _isolated(offline_kubeconfig):
    hubstate.reset()
    yield
    hubstate.reset()


def spawner_with(**settings):
    c = Config()
    for name, value in settings.items():
        setattr(c.GPUSpawner, name, value)
    return make_spawner(c)


def check_args(pod: dict) -> list[str]:
    (check,) = pod["spec"]["initContainers"]
    return check["command"][3:]


@pytest.mark.parametrize(
    ("settings", "seconds"), [({}, 30.0), ({"validation_timeout": 12.5}, 12.5)]
)
async def test_the_check_gets_the_spawners_deadline(settings, seconds):
    pod = await build(spawner_with(**settings), OPTIONS)
    args = check_args(pod)
    assert args[args.index("--timeout") + 1] == repr(seconds)
    assert gpucheck.parse_args(args).timeout == seconds


async def test_a_replacement_check_command_can_take_the_deadline():
    command = ["gpuspawner-check-gpus", "--expect", "{gpus}", "--timeout", "{timeout}"]
    pod = await build(spawner_with(validation_command=command, validation_timeout=20), OPTIONS)
    (check,) = pod["spec"]["initContainers"]
    assert check["command"] == ["gpuspawner-check-gpus", "--expect", "2", "--timeout", "20.0"]


def test_a_deadline_under_a_second_is_refused():
    with pytest.raises(TraitError):
        spawner_with(validation_timeout=0.5)


def running_check(pod: dict, started: float) -> dict:
    """``pod`` as the reflector shows it while its GPU check has been running since ``started``."""
    at = datetime.fromtimestamp(started, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    pod["status"] = {
        "phase": "Pending",
        "initContainerStatuses": [
            {"name": "gpu-check", "state": {"running": {"startedAt": at}}, "restartCount": 0}
        ],
    }
    return pod


async def test_a_check_stuck_past_its_deadline_fails_the_spawn_with_the_reason():
    spawner = spawner_with(validation_timeout=10)
    pod = await build(spawner, OPTIONS)
    # Within its time (and the grace for its own exit): still starting.
    assert spawner.is_pod_running(running_check(pod, time.time() - 5)) is False
    stuck = running_check(pod, time.time() - (10 + OVERDUE_GRACE + 60))
    with pytest.raises(GPUCheckFailed) as failed:
        spawner.is_pod_running(stuck)
    assert str(failed.value) == (
        "The GPU check was still running 15 seconds after its 10-second limit, so nvidia-smi is "
        "stuck in the GPU driver and cannot even be stopped; ask an admin to check the node, "
        "which may need a reboot."
    )
    assert failed.value.kind == "nvidia-smi-failed"
