"""The GPU check's one deadline: an nvidia-smi that hangs, or cannot even be reaped, ends the check
with its reason, as the init container runs it (``python3 -c <source> ARGS``).

The fake ``nvidia-smi`` is a real process that ignores SIGTERM and sleeps for good, as one stuck in
the driver does. SIGKILL cannot be ignored, so "cannot be reaped" is emulated in the check's own
process: its ``os.kill``/``os.killpg`` do nothing, and the fake must then be left running, which
the tests check before they kill it themselves. Every fake writes its pid down, and the ``pod``
fixture kills whatever is left, so no test leaks one, whatever it fails on.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gpuspawner.validation import gpucheck
from gpuspawner.validation.command import check_command
from tests.validation.test_gpucheck_main import FAKE_NVIDIA_SMI, Pod

GPU_LINE = "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-4b2a0d7e-3b2c-4bd1-9d5b-7d0c2b7b1a10)"

# A hung nvidia-smi: "mode" says how far it gets before it hangs; "slow N" answers as recorded
# (replay.py, the main tests' fake) but only after N seconds.
HUNG_NVIDIA_SMI = f"""\
import os, signal, sys, time
from pathlib import Path

here = Path(__file__).resolve().parent
with open(here / "pids", "a") as pids:
    pids.write(str(os.getpid()) + "\\n")
signal.signal(signal.SIGTERM, signal.SIG_IGN)
mode = (here / "mode").read_text().strip()
if mode.startswith("slow "):
    time.sleep(float(mode.split()[1]))
    os.execv(sys.executable, [sys.executable, str(here / "replay.py"), *sys.argv[1:]])
if mode == "mid-output":
    print({GPU_LINE!r}, flush=True)
elif mode == "output-then-hang":
    print({GPU_LINE!r}, flush=True)
    os.close(1)
    os.close(2)
elif mode == "flood":
    for _ in range(16):  # 16 MiB, then hang: bounded, whatever the check reads
        sys.stdout.write("x" * (1 << 20))
    sys.stdout.flush()
while True:
    time.sleep(3600)
"""

# Runs the check's source as the pod does, with os.kill and os.killpg doing nothing: nvidia-smi
# then stays alive whatever the check does, like one in uninterruptible sleep in the driver.
UNKILLABLE = """\
import os, sys
os.kill = os.killpg = lambda pid, sig: None
path = os.environ["GPUCHECK_SOURCE"]
exec(compile(open(path).read(), path, "exec"), {"__name__": "__main__"})
"""

# The same, with the main thread never coming back from starting nvidia-smi (as on an exec from
# a hung mount): only the watchdog can end the check.
STUCK_START = """\
import os, subprocess, threading
subprocess.Popen = lambda *args, **kwargs: threading.Event().wait()
path = os.environ["GPUCHECK_SOURCE"]
exec(compile(open(path).read(), path, "exec"), {"__name__": "__main__"})
"""


def alive(pid: int) -> bool:
    """Whether ``pid`` is a process that has not exited (zombies have)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


class HungPod(Pod):
    """A container whose nvidia-smi hangs as ``mode`` says."""

    def __init__(self, tmp_path: Path) -> None:
        super().__init__(tmp_path)
        replay = self.bin / "replay.py"
        replay.write_text(FAKE_NVIDIA_SMI, encoding="utf-8")
        fake = self.bin / "nvidia-smi"
        fake.write_text(f"#!{sys.executable}\n{HUNG_NVIDIA_SMI}", encoding="utf-8")
        fake.chmod(0o755)

    def hang(self, mode: str) -> None:
        (self.bin / "mode").write_text(mode, encoding="utf-8")

    def pids(self) -> list[int]:
        path = self.bin / "pids"
        return [int(line) for line in path.read_text().split()] if path.exists() else []

    def check(
        self, timeout: float, wrapper: str | None = None, python: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        command = check_command(
            1, "nvidia.com/gpu", None, termination_log=str(self.termination_log), timeout=timeout
        )
        if python:
            command[0] = python
        env = {"PATH": f"{self.bin}{os.pathsep}{os.environ['PATH']}"}
        if wrapper is not None:
            command = [command[0], "-c", wrapper, *command[3:]]
            env["GPUCHECK_SOURCE"] = gpucheck.__file__
        # A guard against the old, unbounded waits, not a measurement.
        return subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=60, check=False
        )

    def kill_all(self) -> None:
        for pid in self.pids():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


@pytest.fixture
def pod(tmp_path):
    pod = HungPod(tmp_path)
    yield pod
    pod.kill_all()


def reason_of(pod: HungPod, result: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in result.stderr, result.stderr
    message = pod.message()
    assert message is not None and message.endswith("\n") and message.count("\n") == 1
    assert result.stderr.strip().splitlines()[-1] == message.strip()
    return message.strip()


HANG_THEN = "so the GPU or its driver is hung; ask an admin to check the node."


@pytest.mark.parametrize(
    ("mode", "what"),
    [
        ("before-output", "nvidia-smi -L printed nothing"),
        ("mid-output", "nvidia-smi -L stopped answering after printing 1 line"),
        ("output-then-hang", "nvidia-smi -L printed its output but never exited"),
    ],
)
def test_an_nvidia_smi_that_hangs_fails_the_check_with_the_deadline_and_how_far_it_got(
    pod, python, mode, what
):
    pod.hang(mode)
    result = pod.check(timeout=1.5, python=python)
    assert result.returncode == gpucheck.EXIT_NVIDIA_SMI_FAILED
    assert reason_of(pod, result) == (
        f"nvidia-smi did not finish within the GPU check's 1.5-second limit ({what}), {HANG_THEN}"
    )
    # killed and reaped, with SIGTERM ignored: nothing is left behind
    (pid,) = pod.pids()
    assert not alive(pid)


def test_the_deadline_is_for_the_whole_check_not_for_each_run(pod):
    # Each run answers correctly, but 3 runs of 1.2 s do not fit in 2 s together.
    pod.healthy("h200_590.48.01", "list-L__h200_590.48.01.txt")
    pod.hang("slow 1.2")
    result = pod.check(timeout=2)
    assert result.returncode == gpucheck.EXIT_NVIDIA_SMI_FAILED
    reason = reason_of(pod, result)
    assert reason.startswith("nvidia-smi did not finish within the GPU check's 2-second limit (")
    assert reason.endswith(HANG_THEN)
    assert not any(alive(pid) for pid in pod.pids())


def test_a_healthy_gpu_still_passes_within_the_deadline(pod):
    pod.healthy("h200_590.48.01", "list-L__h200_590.48.01.txt")
    pod.hang("slow 0")
    result = pod.check(timeout=30)
    assert result.returncode == 0, result.stderr
    assert pod.message() == "GPU check passed.\n"


def test_an_nvidia_smi_that_cannot_be_reaped_is_abandoned_and_the_check_still_ends(pod, python):
    pod.hang("before-output")
    result = pod.check(timeout=1, wrapper=UNKILLABLE, python=python)
    assert result.returncode == gpucheck.EXIT_NVIDIA_SMI_FAILED
    assert reason_of(pod, result) == (
        "nvidia-smi did not finish within the GPU check's 1-second limit (nvidia-smi -L printed "
        f"nothing), {HANG_THEN}"
    )
    # The check has exited and its nvidia-smi still runs: it was never waited for.
    (pid,) = pod.pids()
    assert alive(pid)


def test_the_watchdog_ends_a_check_whose_main_thread_never_comes_back(pod):
    pod.hang("before-output")
    result = pod.check(timeout=1, wrapper=STUCK_START)
    assert result.returncode == gpucheck.EXIT_NVIDIA_SMI_FAILED
    assert reason_of(pod, result) == (
        "The GPU check did not finish within its 1-second limit (it was stuck starting "
        f"nvidia-smi -L), {HANG_THEN}"
    )


def test_an_nvidia_smi_that_prints_without_end_is_stopped_at_the_output_limit(pod):
    pod.hang("flood")
    result = pod.check(timeout=30)
    assert result.returncode == gpucheck.EXIT_UNREADABLE_OUTPUT
    assert reason_of(pod, result) == (
        "nvidia-smi printed output the GPU check does not understand (nvidia-smi -L printed more "
        "than 1 MiB without finishing); ask an admin to look at the gpu-check container's log."
    )
    (pid,) = pod.pids()
    assert not alive(pid)


def test_the_runner_never_waits_without_a_limit(pod, monkeypatch):
    # In process: SIGKILL "does not take" and any unbounded wait fails the test at once.
    pod.hang("before-output")
    monkeypatch.setattr(gpucheck.os, "killpg", lambda pid, sig: None)

    def no_unbounded_wait(self, timeout=None):
        raise AssertionError(f"waited for nvidia-smi without a limit (timeout={timeout})")

    monkeypatch.setattr(subprocess.Popen, "wait", no_unbounded_wait)
    monkeypatch.setattr(subprocess.Popen, "communicate", no_unbounded_wait)
    monkeypatch.setattr(gpucheck, "ABANDONED", [])
    run = gpucheck.run_nvidia_smi(str(pod.bin / "nvidia-smi"), gpucheck.Deadline(0.5))
    with pytest.raises(gpucheck.CheckFailed) as failed:
        run(["-L"])
    assert failed.value.exit_code == gpucheck.EXIT_NVIDIA_SMI_FAILED
    assert "(nvidia-smi -L printed nothing)" in failed.value.reason
    (pid,) = pod.pids()
    assert gpucheck.ABANDONED == [pid] and alive(pid)
    monkeypatch.undo()
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)  # our child: reaped here, not left a zombie


def test_the_watchdog_writes_the_outcome_once_and_main_then_keeps_it(pod, monkeypatch):
    # In process, with the hard exit recorded instead of done.
    exits: list[int] = []
    fired = threading.Event()

    def hard_exit(code: int) -> None:
        exits.append(code)
        fired.set()

    release = threading.Event()
    monkeypatch.setattr(gpucheck, "_hard_exit", hard_exit)
    monkeypatch.setattr(gpucheck, "KILL_GRACE", 0.05)
    monkeypatch.setattr(gpucheck, "WATCHDOG_GRACE", 0.05)
    monkeypatch.setattr(gpucheck.subprocess, "Popen", lambda *args, **kwargs: release.wait())
    codes: list[int] = []
    argv = ["--expect", "1", "--timeout", "0.2", "--termination-log", str(pod.termination_log)]
    argv += ["--nvidia-smi", str(pod.bin / "nvidia-smi")]
    main = threading.Thread(target=lambda: codes.append(gpucheck.main(argv)), daemon=True)
    main.start()
    assert fired.wait(30), "the watchdog did not fire"
    written = pod.message()
    assert written == (
        "The GPU check did not finish within its 0.2-second limit (it was stuck starting "
        f"nvidia-smi -L), {HANG_THEN}\n"
    )
    release.set()  # the main thread comes back (and fails on what Popen returned)
    main.join(30)
    assert codes == [gpucheck.EXIT_NVIDIA_SMI_FAILED] and exits == codes
    assert pod.message() == written
