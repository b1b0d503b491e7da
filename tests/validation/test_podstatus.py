"""Reading the GPU check's outcome out of recorded-shape Pod objects."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gpuspawner.core.labels import VALIDATION_CONTAINER_NAME
from gpuspawner.validation import gpucheck
from gpuspawner.validation.podstatus import (
    CHECK_EXIT_CODES,
    CHECK_FAILURE_KINDS,
    NOT_STARTABLE_KIND,
    OVERDUE_GRACE,
    check_failure,
    check_failure_kind,
    check_timeout,
    describe_waiting,
    kind_of_exit_code,
    reason_for_exit_code,
)

PODS = Path(__file__).resolve().parent.parent / "fixtures" / "pods"


def pod(name: str) -> dict:
    return json.loads((PODS / f"{name}.json").read_text(encoding="utf-8"))


def test_the_fixtures_use_the_shared_container_name():
    for path in PODS.glob("*.json"):
        data = json.loads(path.read_text(encoding="utf-8"))
        assert data["spec"]["initContainers"][0]["name"] == VALIDATION_CONTAINER_NAME


@pytest.mark.parametrize(
    "name", ["gpu-check-waiting-first", "gpu-check-running", "gpu-check-succeeded"]
)
def test_no_failure_while_running_or_after_success(name):
    assert check_failure(pod(name)) is None


def test_terminated_check_gives_its_message():
    data = pod("gpu-check-terminated-message")
    assert check_failure(data) == (
        "Only 1 of the 2 requested GPUs is visible: the node's device plugin gave this container "
        "fewer GPUs than it asked for; ask an admin to check the node."
    )


def test_crashloop_gives_the_last_attempts_message():
    reason = check_failure(pod("gpu-check-crashloop"))
    assert reason.startswith("nvidia-smi failed with exit code 9 (the NVIDIA driver is not loaded")
    assert "\n" not in reason


def test_the_last_non_empty_line_of_a_message_is_used():
    data = pod("gpu-check-terminated-message")
    terminated = data["status"]["initContainerStatuses"][0]["state"]["terminated"]
    terminated["message"] = "GPU 0: something\n\nThe real reason.\n\n"
    assert check_failure(data) == "The real reason."


def test_without_a_message_the_exit_code_explains():
    reason = check_failure(pod("gpu-check-restarted-no-message"))
    assert reason == gpucheck.EXIT_CODES[gpucheck.EXIT_GPU_COUNT][1]


def test_a_missing_python3_is_named():
    reason = check_failure(pod("gpu-check-start-error"))
    assert reason.startswith(
        "The GPU check could not start because the notebook image has no python3"
    )


def test_a_separate_check_image_without_python3_is_named_with_what_to_set():
    """validation_image set to an image without python3: the reason names that image (not
    "the notebook image") and the setting, in one sentence."""
    data = pod("gpu-check-start-error")
    data["spec"]["initContainers"][0]["image"] = "nvcr.io/nvidia/cuda:12.8.1-base-ubuntu24.04"
    reason = check_failure(data)
    assert reason == (
        "The GPU check could not start because there is no python3 in its image "
        "'nvcr.io/nvidia/cuda:12.8.1-base-ubuntu24.04'; ask an admin to set validation_image to "
        "an image with python3 (docs/validation.md)."
    )
    assert check_failure_kind(data) == NOT_STARTABLE_KIND


@pytest.mark.parametrize(
    ("exit_code", "phrase"),
    [(127, "there is no python3 in"), (126, "python3 is not executable in")],
)
def test_a_separate_check_image_is_named_for_the_shells_exit_codes(exit_code, phrase):
    data = pod("gpu-check-restarted-no-message")
    data["spec"]["initContainers"][0]["image"] = "r.test/check:1"
    status = data["status"]["initContainerStatuses"][0]
    terminated = status["state"].get("terminated") or status["lastState"]["terminated"]
    terminated["exitCode"] = exit_code
    assert check_failure(data) == (
        f"The GPU check could not start because {phrase} its image 'r.test/check:1'; ask an "
        "admin to set validation_image to an image with python3 (docs/validation.md)."
    )


def test_a_hostile_check_image_name_is_quoted_and_escaped():
    data = pod("gpu-check-start-error")
    data["spec"]["initContainers"][0]["image"] = "evil\n<b>image</b>\u202e"
    reason = check_failure(data)
    assert "\n" not in reason and "\u202e" not in reason
    assert "'evil\\n<b>image</b>\\u202e'" in reason
    assert reason.count(".") == 1 + reason.count("docs/validation.md")  # one sentence


def test_other_start_errors_quote_the_runtime():
    data = pod("gpu-check-start-error")
    terminated = data["status"]["initContainerStatuses"][0]["state"]["terminated"]
    terminated["message"] = "failed to create containerd task: permission denied: unknown"
    reason = check_failure(data)
    assert reason.startswith("The GPU check container could not start")
    assert reason.endswith("permission denied: unknown")


@pytest.mark.parametrize(
    ("exit_code", "phrase"),
    [
        (gpucheck.EXIT_NO_NVIDIA_SMI, "nvidia-smi was not found"),
        (gpucheck.EXIT_DRIVER_TOO_OLD, "too old"),
        (127, "no python3"),
        (137, "killed"),
        (42, "exit code 42"),
    ],
)
def test_reasons_for_exit_codes(exit_code, phrase):
    assert phrase in reason_for_exit_code(exit_code)


def test_a_pod_without_the_check_is_ignored():
    data = pod("gpu-check-crashloop")
    assert check_failure(data, container_name="other") is None
    data["status"].pop("initContainerStatuses")
    assert check_failure(data) is None
    assert describe_waiting(data) is None


def test_a_pod_without_status_is_ignored():
    data = pod("gpu-check-running")
    del data["status"]
    assert check_failure(data) is None
    assert describe_waiting(data) is None


def test_progress_while_running():
    assert describe_waiting(pod("gpu-check-running")) == (
        "Checking the 2 allocated GPUs with nvidia-smi…"
    )


def test_progress_while_running_on_mig():
    assert describe_waiting(pod("gpu-check-running-mig")) == (
        "Checking the allocated MIG device (1g.10gb) with nvidia-smi…"
    )


def test_progress_before_the_check_starts():
    assert describe_waiting(pod("gpu-check-waiting-first")) == (
        "Preparing to check the 2 allocated GPUs with nvidia-smi…"
    )


def test_count_falls_back_to_the_label():
    data = copy.deepcopy(pod("gpu-check-running"))
    data["spec"]["initContainers"][0]["resources"] = {}
    assert describe_waiting(data) == "Checking the 2 allocated GPUs with nvidia-smi…"


@pytest.mark.parametrize(
    "name", ["gpu-check-succeeded", "gpu-check-crashloop", "gpu-check-restarted-no-message"]
)
def test_no_progress_message_after_success_or_failure(name):
    assert describe_waiting(pod(name)) is None


def test_the_exit_code_table_holds_every_check_code_and_the_runtime_codes():
    check_codes = {
        value
        for name, value in vars(gpucheck).items()
        if name.startswith("EXIT_") and isinstance(value, int) and value != gpucheck.EXIT_OK
    }
    assert set(gpucheck.EXIT_CODES) == check_codes
    assert set(CHECK_EXIT_CODES) == check_codes | {126, 127, 137}
    # the check's own entries are the check's, not copies that could drift
    for code in check_codes:
        assert CHECK_EXIT_CODES[code] is gpucheck.EXIT_CODES[code]
    kinds = [kind for kind, _ in gpucheck.EXIT_CODES.values()]
    assert len(kinds) == len(set(kinds)), "each check exit code has its own kind"
    assert CHECK_FAILURE_KINDS[-1] == "other"


@pytest.mark.parametrize(
    ("exit_code", "kind"),
    [
        (gpucheck.EXIT_GPU_COUNT, "gpu-count"),
        (gpucheck.EXIT_USAGE, "check-misconfigured"),
        (126, "check-not-startable"),
        (127, "check-not-startable"),
        (137, "check-killed"),
        (42, "other"),
    ],
)
def test_kinds_of_exit_codes(exit_code, kind):
    assert kind_of_exit_code(exit_code) == kind
    assert kind in CHECK_FAILURE_KINDS


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("gpu-check-running", None),
        ("gpu-check-succeeded", None),
        ("gpu-check-restarted-no-message", "gpu-count"),
        ("gpu-check-start-error", "check-not-startable"),
    ],
)
def test_the_kind_of_a_pods_check_failure(name, kind):
    assert check_failure_kind(pod(name)) == kind


# gpu-check-running.json's startedAt, 2026-11-29T22:41:10Z, in Unix seconds
STARTED = 1795992070.0


def running_with_timeout(*timeout: str) -> dict:
    data = pod("gpu-check-running")
    data["spec"]["initContainers"][0]["command"] += list(timeout)
    return data


def test_the_fixtures_start_time_is_the_one_the_tests_use():
    from datetime import datetime, timezone

    started = pod("gpu-check-running")["status"]["initContainerStatuses"][0]["state"]["running"]
    assert started["startedAt"] == datetime.fromtimestamp(STARTED, timezone.utc).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


@pytest.mark.parametrize(
    ("argv", "seconds"),
    [
        (("--timeout", "30.0"), 30.0),
        (("--timeout=12.5",), 12.5),
        (("--timeout", "10", "--timeout", "20"), 20.0),  # argparse's rule: the last one wins
        ((), None),  # a check without a deadline in its command: nobody can say it is overdue
        (("--timeout", "soon"), None),
        (("--timeout", "0"), None),
        (("--timeout", "inf"), None),
        (("--timeout", "nan"), None),
        (("--timeout",), None),
    ],
)
def test_the_checks_deadline_is_read_from_its_command(argv, seconds):
    assert check_timeout(running_with_timeout(*argv)) == seconds


def test_a_check_running_well_past_its_deadline_has_failed_with_the_reason():
    data = running_with_timeout("--timeout", "30.0")
    overdue = STARTED + 30 + OVERDUE_GRACE + 1
    reason = check_failure(data, now=overdue)
    assert reason == (
        "The GPU check was still running 15 seconds after its 30-second limit, so nvidia-smi is "
        "stuck in the GPU driver and cannot even be stopped; ask an admin to check the node, "
        "which may need a reboot."
    )
    assert check_failure_kind(data, now=overdue) == "nvidia-smi-failed"
    assert describe_waiting(data) is not None  # still "running" to the progress messages


@pytest.mark.parametrize(
    ("name", "argv", "now"),
    [
        # within its time, and the grace that covers its own exit and clock skew
        ("gpu-check-running", ("--timeout", "30.0"), STARTED + 30 + OVERDUE_GRACE),
        # no deadline in the command (a replacement check)
        ("gpu-check-running", (), STARTED + 10_000),
        # not running yet: the clock starts with the container
        ("gpu-check-waiting-first", ("--timeout", "30.0"), STARTED + 10_000),
        # passed: no longer running
        ("gpu-check-succeeded", ("--timeout", "30.0"), STARTED + 10_000),
    ],
)
def test_no_overdue_failure_without_a_running_check_past_its_deadline(name, argv, now):
    data = pod(name)
    data["spec"]["initContainers"][0]["command"] += list(argv)
    assert check_failure(data, now=now) is None
    assert check_failure_kind(data, now=now) is None


def test_a_terminated_failure_wins_over_the_clock():
    data = pod("gpu-check-terminated-message")
    data["spec"]["initContainers"][0]["command"] += ["--timeout", "1"]
    assert check_failure(data, now=STARTED + 10_000).startswith("Only 1 of the 2 requested GPUs")
