"""The init container command that ships the GPU check as source."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpuspawner.validation import command, gpucheck
from gpuspawner.validation.command import check_command, check_source


def test_command_carries_the_check_source_and_arguments():
    argv = check_command(2, "nvidia.com/gpu", "12.4")
    assert argv[:2] == ["python3", "-c"]
    assert argv[2] == Path(gpucheck.__file__).read_text(encoding="utf-8")
    assert argv[3:] == ["--expect", "2", "--resource", "nvidia.com/gpu", "--cuda", "12.4"]


def test_cuda_is_left_out_when_unknown():
    argv = check_command(1, "nvidia.com/mig-1g.10gb", None)
    assert argv[3:] == ["--expect", "1", "--resource", "nvidia.com/mig-1g.10gb"]


def test_overrides():
    argv = check_command(
        1, "nvidia.com/gpu", "11.8", python="/opt/conda/bin/python", termination_log="/tmp/msg"
    )
    assert argv[0] == "/opt/conda/bin/python"
    assert argv[-2:] == ["--termination-log", "/tmp/msg"]


def test_the_arguments_are_the_ones_the_check_accepts():
    argv = check_command(3, "nvidia.com/gpu", "12.8", termination_log="/tmp/msg")
    args = gpucheck.parse_args(argv[3:])
    assert (args.expect, args.resource, args.cuda, args.termination_log) == (
        3,
        "nvidia.com/gpu",
        "12.8",
        "/tmp/msg",
    )


def test_source_is_read_once():
    command.check_source.cache_clear()
    first = check_source()
    assert check_source() is first
    assert command.check_source.cache_info().hits == 1


@pytest.mark.parametrize("expected", [0, -1])
def test_a_request_for_no_gpu_is_refused(expected):
    with pytest.raises(ValueError, match="at least 1"):
        check_command(expected, "nvidia.com/gpu", None)


def test_the_timeout_reaches_the_check_when_given():
    argv = check_command(1, "nvidia.com/gpu", None, timeout=12.5)
    assert argv[-2:] == ["--timeout", "12.5"]
    assert gpucheck.parse_args(argv[3:]).timeout == 12.5
    assert "--timeout" not in check_command(1, "nvidia.com/gpu", None)
    assert gpucheck.parse_args(["--expect", "1"]).timeout == gpucheck.DEFAULT_TIMEOUT


@pytest.mark.parametrize("timeout", [0, -1, float("nan"), float("inf")])
def test_a_timeout_that_is_no_deadline_is_refused(timeout):
    with pytest.raises(ValueError, match="timeout must be a number of seconds above 0"):
        check_command(1, "nvidia.com/gpu", None, timeout=timeout)
    with pytest.raises(gpucheck.UsageError, match="--timeout must be a number of seconds above 0"):
        gpucheck.parse_args(["--expect", "1", "--timeout", str(timeout)])
