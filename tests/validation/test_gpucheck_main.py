"""The GPU check end to end: ``python3 -c <source> ARGS`` as the init container runs it.

A fake ``nvidia-smi`` on PATH replays recorded output (verbatim fixture bodies, on stdout and
optionally on stderr) and exit codes chosen by its arguments, and logs every call; so the real
command line, exit codes, stdout/stderr split and termination-log file are all exercised.
"""

from __future__ import annotations

import ast
import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpuspawner.validation import gpucheck
from gpuspawner.validation.command import check_command, check_source
from tests.validation.nvsmi_fixtures import (
    CHANGES,
    CORE_FIELDS,
    FIXTURES,
    HEALTH_FIELDS,
    MERGED_LIST,
    body,
    changed_name,
    derived_name,
)

NO_DEVICES = "error-no-devices__gh200_570.86.15__open-gpu-kernel-modules-774.txt"
LOADER_WARNING = "stderr-loader-warning__libnvidia-ml-no-version-information.txt"

CORE_ARGS = f"--query-gpu={','.join(CORE_FIELDS)} --format=csv,noheader,nounits"
HEALTH_ARGS = f"--query-gpu={','.join(HEALTH_FIELDS)} --format=csv,noheader,nounits"

FAKE_NVIDIA_SMI = """\
import json, sys
from pathlib import Path

here = Path(__file__).resolve().parent
args = " ".join(sys.argv[1:])
with open(here / "calls.log", "a") as log:
    log.write(args + "\\n")
scenario = json.loads((here / "scenario.json").read_text())
if args not in scenario:
    sys.stdout.write("fake nvidia-smi: no fixture for: " + args + "\\n")
    sys.exit(97)
answer = scenario[args]
def verbatim(name):
    text = Path(name).read_text()
    return text.split("# ----- verbatim output below this line -----\\n", 1)[1]
sys.stdout.write(verbatim(answer["fixture"]))
if answer.get("stderr"):
    sys.stderr.write(verbatim(answer["stderr"]))
sys.exit(answer["rc"])
"""


def _python38() -> str | None:
    candidates = [shutil.which("python3.8") or ""]
    candidates += sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.8*/bin/python3.8")))
    for candidate in candidates:
        if not candidate:
            continue
        probe = subprocess.run(
            [candidate, "-c", "import sys; print(sys.version_info[:2] == (3, 8))"],
            capture_output=True,
            text=True,
            check=False,
        )
        if probe.stdout.strip() == "True":
            return candidate
    return None


class Pod:
    """A temporary container: a bin dir with the fake nvidia-smi, and a termination log."""

    def __init__(self, tmp_path: Path) -> None:
        self.bin = tmp_path / "bin"
        self.bin.mkdir()
        self.termination_log = tmp_path / "termination-log"
        fake = self.bin / "nvidia-smi"
        fake.write_text(f"#!{sys.executable}\n{FAKE_NVIDIA_SMI}", encoding="utf-8")
        fake.chmod(0o755)

    def answer(self, answers: dict[str, tuple[str, int]], stderr: str | None = None) -> None:
        """Each run answers with its fixture on stdout, and ``stderr``'s on stderr if given."""
        scenario = {
            args: {
                "fixture": str(FIXTURES / name),
                "rc": rc,
                "stderr": str(FIXTURES / stderr) if stderr else "",
            }
            for args, (name, rc) in answers.items()
        }
        (self.bin / "scenario.json").write_text(json.dumps(scenario), encoding="utf-8")

    def healthy(
        self,
        capture: str,
        listing: str,
        overrides: dict[str, tuple[str, int]] | None = None,
        stderr: str | None = None,
    ) -> None:
        answers = {
            "-L": (listing, 0),
            CORE_ARGS: (derived_name(capture, "core"), 0),
            HEALTH_ARGS: (derived_name(capture, "health"), 0),
        }
        answers.update(overrides or {})
        self.answer(answers, stderr)

    def calls(self) -> list[str]:
        log = self.bin / "calls.log"
        return log.read_text().splitlines() if log.exists() else []

    def run(
        self,
        expected: int,
        resource: str = "nvidia.com/gpu",
        cuda: str | None = None,
        python: str | None = None,
        path: str | None = None,
        termination_log: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        command = check_command(
            expected, resource, cuda, termination_log=termination_log or str(self.termination_log)
        )
        if python:
            command[0] = python
        env = {"PATH": path if path is not None else f"{self.bin}{os.pathsep}{os.environ['PATH']}"}
        return subprocess.run(
            command, capture_output=True, text=True, env=env, timeout=60, check=False
        )

    def message(self) -> str | None:
        if not self.termination_log.exists():
            return None
        return self.termination_log.read_text(encoding="utf-8")


@pytest.fixture
def pod(tmp_path):
    return Pod(tmp_path)


def last_stderr_line(result: subprocess.CompletedProcess[str]) -> str:
    return result.stderr.strip().splitlines()[-1]


def test_healthy_gpu_passes(pod, python):
    pod.healthy("h100-80gb-hbm3_590.48.01", "list-L__h100-80gb-hbm3_590.48.01.txt")
    result = pod.run(1, cuda="12.4", python=python)
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    assert result.stdout.splitlines()[-1] == "GPU check passed."
    assert "NVIDIA H100 80GB HBM3" in result.stdout
    assert "bus 00000000:00:09.0, driver 590.48.01, 81559 MiB" in result.stdout
    assert pod.calls() == ["-L", CORE_ARGS, HEALTH_ARGS]
    assert result.stdout.splitlines()[0] == f"Using nvidia-smi at {pod.bin}/nvidia-smi (on PATH)."
    assert pod.message() == "GPU check passed.\n"


def test_a_loader_warning_on_stderr_does_not_fail_a_healthy_gpu(pod, python):
    pod.healthy(
        "h100-80gb-hbm3_590.48.01", "list-L__h100-80gb-hbm3_590.48.01.txt", stderr=LOADER_WARNING
    )
    result = pod.run(1, cuda="12.4", python=python)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == "GPU check passed."
    assert result.stdout.count("warning: nvidia-smi wrote on stderr: ") == 1
    assert "libnvidia-ml.so.1: no version information available" in result.stdout
    assert pod.message() == "GPU check passed.\n"


def test_count_mismatch_fails_with_one_line_in_stderr_and_the_termination_log(pod, python):
    pod.healthy("l40s_595.80", "list-L__l40s_595.80.txt")
    result = pod.run(2, python=python)
    assert result.returncode == gpucheck.EXIT_GPU_COUNT
    reason = last_stderr_line(result)
    assert reason.startswith("Only 1 of the 2 requested GPUs is visible")
    assert pod.message() == reason + "\n"
    assert "Traceback" not in result.stderr


def test_driver_not_loaded(pod, python):
    pod.answer({"-L": ("error-driver-not-loaded__rc9__nvidia_gpu_exporter-65.txt", 9)})
    result = pod.run(1, python=python)
    assert result.returncode == gpucheck.EXIT_NVIDIA_SMI_FAILED
    reason = last_stderr_line(result)
    assert reason.startswith("nvidia-smi failed with exit code 9 (the NVIDIA driver is not loaded")
    assert reason.endswith("Make sure that the latest NVIDIA driver is installed and running.")
    assert pod.message().strip() == reason
    assert pod.calls() == ["-L"]


def test_nvml_library_missing(pod):
    pod.answer({"-L": ("error-libnvidia-ml-not-found__rc12__nvidia_gpu_exporter-105.txt", 12)})
    result = pod.run(1)
    assert result.returncode == gpucheck.EXIT_NVIDIA_SMI_FAILED
    assert "libnvidia-ml.so) is missing in the container" in pod.message()


def test_nvidia_smi_missing(pod, python):
    empty = pod.bin.parent / "empty"
    empty.mkdir()
    interpreter = python or sys.executable  # PATH is empty: name the interpreter by path
    result = pod.run(1, python=interpreter, path=str(empty))
    assert result.returncode == gpucheck.EXIT_NO_NVIDIA_SMI
    assert last_stderr_line(result).startswith("nvidia-smi was not found in the container: ")
    assert pod.message().startswith("nvidia-smi was not found in the container: ")


def test_uncorrectable_ecc_errors_fail(pod):
    pod.healthy(
        "h100-80gb-hbm3_590.48.01",
        "list-L__h100-80gb-hbm3_590.48.01.txt",
        {HEALTH_ARGS: (changed_name_for("ecc-uncorrected-volatile-2"), 0)},
    )
    result = pod.run(1, cuda="12.4")
    assert result.returncode == gpucheck.EXIT_GPU_UNHEALTHY
    assert "has 2 uncorrectable ECC errors" in pod.message()
    assert "ECC enabled, 2 uncorrectable errors" in result.stdout


def test_old_driver_fails_for_cuda_13(pod):
    pod.healthy(
        "h100-80gb-hbm3_590.48.01",
        "list-L__h100-80gb-hbm3_590.48.01.txt",
        {CORE_ARGS: (changed_name_for("driver-535.161.08"), 0)},
    )
    result = pod.run(1, cuda="13.0")
    assert result.returncode == gpucheck.EXIT_DRIVER_TOO_OLD
    assert "needs driver 580.65.06 or newer" in pod.message()


def test_mig_devices_are_counted_by_profile(pod, python):
    pod.healthy("h100-80gb-hbm3-MIG_590.48.01", "list-L__h100-80gb-hbm3-MIG_590.48.01.txt")
    assert pod.run(4, python=python).returncode == 0
    result = pod.run(3, resource="nvidia.com/mig-1g.10gb", python=python)
    assert result.returncode == gpucheck.EXIT_GPU_COUNT
    assert pod.message().startswith(
        "Only 2 of the 3 requested MIG devices (1g.10gb) is visible (it sees a 3g.40gb MIG "
        "device, a 2g.20gb MIG device instead)"
    )


def test_a_mig_gpu_is_not_passed_as_a_whole_gpu_when_the_list_is_unreadable(pod, python):
    pod.healthy("h200-MIG_590.48.01", MERGED_LIST)
    result = pod.run(1, python=python)
    assert result.returncode == gpucheck.EXIT_UNREADABLE_OUTPUT
    assert pod.message().startswith("GPU 0 (NVIDIA H200, GPU-00000000-0000-0000-0000-000000000000)")
    assert "has MIG mode enabled or not reported" in pod.message()
    assert "warning: unexpected line in nvidia-smi -L output" in result.stdout


def test_an_unknown_error_in_a_health_field_fails(pod, python):
    pod.healthy(
        "h100-80gb-hbm3_590.48.01",
        "list-L__h100-80gb-hbm3_590.48.01.txt",
        {HEALTH_ARGS: (changed_name_for("ecc-uncorrected-volatile-unknown-error"), 0)},
    )
    result = pod.run(1, cuda="12.4", python=python)
    assert result.returncode == gpucheck.EXIT_GPU_UNHEALTHY
    assert "could not report ecc.errors.uncorrected.volatile.total" in pod.message()
    assert "[Unknown Error]" in pod.message()
    assert "OK: no uncorrectable ECC errors" not in result.stdout


@pytest.mark.parametrize("returncode", [0, 6])
def test_no_devices_quotes_nvidia_smi(pod, returncode):
    pod.answer({"-L": (NO_DEVICES, returncode)})
    result = pod.run(1)
    assert result.returncode == gpucheck.EXIT_GPU_COUNT
    assert pod.message().startswith(
        'nvidia-smi finds no GPU in this container ("No devices were found"), although 1 GPU '
        "was requested"
    )
    assert pod.calls() == ["-L"]
    assert body(NO_DEVICES).strip() in result.stdout


def test_a_driver_without_the_health_fields_falls_back_to_single_queries(pod):
    invalid = ("error-invalid-field__rc2__cohdi-37.txt", 2)
    answers = {
        "-L": ("list-L__rtx4080super_linux_595.71.05.txt", 0),
        CORE_ARGS: (derived_name("rtx4080super_linux_595.71.05", "core"), 0),
        HEALTH_ARGS: invalid,
    }
    for name in gpucheck.HEALTH_FIELDS:
        answers[f"--query-gpu=index,{name} --format=csv,noheader,nounits"] = invalid
    pod.answer(answers)
    result = pod.run(1, cuda="12.4")
    assert result.returncode == 0, result.stderr
    assert len(pod.calls()) == 3 + len(gpucheck.HEALTH_FIELDS)
    assert "warning: This nvidia-smi does not know ecc.mode.current" in result.stdout


def test_unreadable_output_is_reported_not_crashed_on(pod):
    pod.answer(
        {
            "-L": ("list-L__h200_590.48.01.txt", 0),
            CORE_ARGS: ("query-gpu-csv-noheader-nounits__8x-titanx__gpustat-5.txt", 0),
        }
    )
    result = pod.run(1)
    assert result.returncode == gpucheck.EXIT_UNREADABLE_OUTPUT
    assert "Traceback" not in result.stderr
    assert last_stderr_line(result).startswith("nvidia-smi printed output the GPU check does not")


def test_an_unwritable_termination_log_is_skipped(pod):
    pod.healthy("h200_590.48.01", "list-L__h200_590.48.01.txt")
    result = pod.run(3, termination_log=str(pod.bin.parent / "missing-dir" / "log"))
    assert result.returncode == gpucheck.EXIT_GPU_COUNT
    assert last_stderr_line(result).startswith("Only 1 of the 3 requested GPUs is visible")
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("change", "error"),
    [
        (("--expect", "two"), "argument --expect: invalid int value: 'two'"),
        (("--expect", "0"), "--expect must be at least 1"),
        (("--timeout", "soon"), "argument --timeout: invalid float value: 'soon'"),
    ],
)
def test_bad_arguments_exit_with_the_usage_code_and_write_the_termination_log(
    pod, python, change, error
):
    option, value = change
    command = check_command(1, "nvidia.com/gpu", None, termination_log=str(pod.termination_log))
    if option in command:
        command[command.index(option) + 1] = value
    else:
        command += [option, value]
    if python:
        command[0] = python
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == gpucheck.EXIT_USAGE
    assert result.stderr.startswith("usage: gpuspawner-check-gpus")
    reason = last_stderr_line(result)
    assert reason == (
        f"The GPU check was started with invalid arguments (gpuspawner-check-gpus: error: "
        f"{error}); ask an admin to check the spawner's GPU check command."
    )
    assert pod.message() == reason + "\n"
    assert "Traceback" not in result.stderr


def test_a_missing_argument_is_written_to_the_termination_log_given_with_equals(pod):
    log = pod.bin.parent / "custom-log"
    command = [sys.executable, "-c", check_source(), f"--termination-log={log}"]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == gpucheck.EXIT_USAGE
    assert "the following arguments are required: --expect" in log.read_text(encoding="utf-8")


def test_source_parses_as_python_38_and_imports_only_the_standard_library():
    tree = ast.parse(check_source(), feature_version=(3, 8))
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "relative import"
            imported.add((node.module or "").split(".")[0])
    assert imported <= sys.stdlib_module_names | {"__future__"}


def changed_name_for(change: str) -> str:
    (found,) = [c for c in CHANGES if c.name == change]
    return changed_name(found)


def test_the_console_script_runs_the_same_main(pod, monkeypatch, capsys):
    from importlib.metadata import entry_points

    (script,) = entry_points(group="console_scripts", name="gpuspawner-check-gpus")
    assert script.value == "gpuspawner.validation.gpucheck:main"
    pod.healthy("h200_590.48.01", "list-L__h200_590.48.01.txt")
    monkeypatch.setenv("PATH", f"{pod.bin}{os.pathsep}{os.environ['PATH']}")
    main = script.load()
    assert main(["--expect", "1", "--cuda", "12.4", "--termination-log", ""]) == 0
    assert capsys.readouterr().out.splitlines()[-1] == "GPU check passed."
    code = main(["--expect", "2", "--termination-log", str(pod.termination_log)])
    assert code == gpucheck.EXIT_GPU_COUNT
    assert capsys.readouterr().err.strip() == pod.message().strip()


def test_nvidia_smi_in_a_known_driver_location_is_used_and_named(pod, monkeypatch, capsys):
    # Not on PATH, but where managed clusters put it: the check finds it and says so.
    pod.healthy("h200_590.48.01", "list-L__h200_590.48.01.txt")
    empty = pod.bin.parent / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.setattr(gpucheck, "DRIVER_BIN_DIRS", (str(empty / "none"), str(pod.bin)))
    log = str(pod.termination_log)
    assert gpucheck.main(["--expect", "1", "--termination-log", log]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0] == f"Using nvidia-smi at {pod.bin}/nvidia-smi (not on PATH; found in {pod.bin})."
    assert out[-1] == "GPU check passed."
    assert pod.calls() == ["-L", CORE_ARGS, HEALTH_ARGS]


def test_nvidia_smi_missing_everywhere_names_the_places_looked_in(pod, monkeypatch, capsys):
    empty = pod.bin.parent / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    # stand-ins for the real locations, which a GPU test machine may well have
    dirs = (str(empty / "usr-local-nvidia-bin"), str(empty / "run-nvidia-driver-usr-bin"))
    monkeypatch.setattr(gpucheck, "DRIVER_BIN_DIRS", dirs)
    code = gpucheck.main(["--expect", "1", "--termination-log", str(pod.termination_log)])
    assert code == gpucheck.EXIT_NO_NVIDIA_SMI
    assert pod.message().strip() == (
        "nvidia-smi was not found in the container: the node's NVIDIA container runtime did not "
        f"mount the driver tools into it ('nvidia-smi' not on PATH nor in {dirs[0]} or "
        f"{dirs[1]}); ask an admin to check the node."
    )
    assert capsys.readouterr().err.strip() == pod.message().strip()
