"""Record a real nvidia-smi's answers to every command line gpuspawner runs or emulates.

Run by ``scripts/gpu-checks.sh --capture FILE`` on a machine with a real NVIDIA GPU and driver.
It writes one JSON document: for each command line, its exact stdout, stderr, exit code and
duration, idle and again while a framework keeps the GPUs busy. ``scripts/import_gpu_capture.py``
turns that document into fixture files under ``tests/fixtures/nvidia-smi`` (the format of
their INDEX.md), which the GPU check's parsers and the emulated nvidia-smi are tested against.

Standard library only, apart from the optional load (PyTorch, if the interpreter has it).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuspawner.validation.gpucheck import CORE_FIELDS, HEALTH_FIELDS, query_args

CAPTURE = Path(__file__).resolve().parent.parent / "sandbox" / "go" / "nvidiasmi" / "capture.json"

# What the culler, the admin page and a user's watch ask while a notebook computes.
LOAD_FIELDS = "index,uuid,utilization.gpu,utilization.memory,memory.used,memory.total,power.draw"


def every_field() -> list[str]:
    """The field names of the recorded ALLFIELDS header the emulator is built from."""
    header = json.loads(CAPTURE.read_text())["gpu"]["header"]
    return [column.split(" [")[0].strip() for column in header.split(",")]


def idle_commands() -> dict[str, list[str]]:
    return {
        "version": ["--version"],
        "list": ["-L"],
        "table": [],
        "query-core": query_args(CORE_FIELDS),
        "query-health": query_args(("index", *HEALTH_FIELDS)),
        "query-allfields": ["--query-gpu=" + ",".join(every_field()), "--format=csv"],
        "query-invalid-field": ["--query-gpu=index,not.a.field", "--format=csv"],
        "query-compute-apps": ["--query-compute-apps=pid,process_name,used_memory", "--format=csv"],
        "q": ["-q"],
        "q-xml": ["-q", "-x"],
        "topo": ["topo", "-m"],
        "list-with-id": ["-i", "0", "-L"],
        "query-id-0": ["--query-gpu=index,uuid", "--format=csv,noheader", "-i", "0"],
        "query-id-99": ["--query-gpu=index,uuid", "--format=csv,noheader", "-i", "99"],
        "q-memory": ["-q", "-d", "MEMORY"],
        "mig-gpu-instance-profiles": ["mig", "-lgip"],
        "mig-gpu-instance-placements": ["mig", "-lgipp"],
        "dmon": ["dmon", "-c", "2", "-s", "u"],
    }


def accepted_fields(fields: list[str]) -> dict[str, object]:
    """Ask for ``fields``; drop each field this driver rejects until the query is accepted.

    A driver older than the recorded capture's refuses the newer fields one at a time (exit 2,
    'Field "x" is not a valid field to query.'), which is itself what the emulator must mimic.
    """
    rejected: list[str] = []
    remaining = list(fields)
    while remaining:
        answer = run(["--query-gpu=" + ",".join(remaining), "--format=csv"])
        if answer["exit_code"] != 2:
            return {"answer": answer, "rejected": rejected}
        text = str(answer["stdout"]) + str(answer["stderr"])
        name = text.split('Field "', 1)[1].split('"', 1)[0] if 'Field "' in text else None
        if name not in remaining:
            return {"answer": answer, "rejected": rejected}
        rejected.append(name)
        remaining.remove(name)
    return {"answer": None, "rejected": rejected}


def run(argv: list[str], timeout: float = 60) -> dict[str, object]:
    started = time.monotonic()
    try:
        done = subprocess.run(
            ["nvidia-smi", *argv], capture_output=True, text=True, timeout=timeout
        )
        out, err, rc = done.stdout, done.stderr, done.returncode
    except subprocess.TimeoutExpired as expired:
        out = (
            (expired.stdout or b"").decode(errors="replace")
            if isinstance(expired.stdout, bytes)
            else (expired.stdout or "")
        )
        err, rc = f"timed out after {timeout} s", None
    return {
        "argv": ["nvidia-smi", *argv],
        "stdout": out,
        "stderr": err,
        "exit_code": rc,
        "seconds": round(time.monotonic() - started, 3),
    }


LOAD_PROGRAM = """
import sys, time, torch
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
hold = torch.empty(int(sys.argv[2]) * 2**20, dtype=torch.uint8, device="cuda")
end = time.monotonic() + float(sys.argv[1])
print("load running", flush=True)
while time.monotonic() < end:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
print("load done", flush=True)
"""


def under_load(seconds: float, hold_mib: int) -> dict[str, object]:
    """Sample nvidia-smi while a bf16 matrix-product loop keeps GPU 0 busy."""
    load = subprocess.Popen(
        [sys.executable, "-c", LOAD_PROGRAM, str(seconds), str(hold_mib)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert load.stdout is not None
    first = load.stdout.readline()
    if "load running" not in first:
        load.kill()
        return {"error": first + load.communicate()[1][-2000:]}
    time.sleep(2)
    result: dict[str, object] = {
        "table": run([]),
        "dmon": run(["dmon", "-c", "2", "-s", "um"]),
        "query-allfields": accepted_fields(every_field()),
        "query-compute-apps": run(
            ["--query-compute-apps=pid,process_name,used_memory", "--format=csv"]
        ),
        "samples": [],
    }
    samples = result["samples"]
    assert isinstance(samples, list)
    for _ in range(6):
        samples.append(run(["--query-gpu=" + LOAD_FIELDS, "--format=csv"]))
        samples.append(run(["--query-gpu=" + LOAD_FIELDS, "--format=csv,noheader,nounits"]))
        time.sleep(0.5)
    load.wait(timeout=seconds + 60)
    time.sleep(3)
    result["after"] = run(["--query-gpu=" + LOAD_FIELDS, "--format=csv"])
    result["dmon-after"] = run(["dmon", "-c", "2", "-s", "u"])
    result["load_exit_code"] = load.returncode
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("output", type=Path, help="the JSON file to write")
    parser.add_argument("--load-seconds", type=float, default=12.0)
    parser.add_argument("--hold-mib", type=int, default=20480, help="memory the load holds")
    args = parser.parse_args()
    document: dict[str, object] = {
        "captured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": platform.node(),
        "kernel": platform.release(),
        "environment": {
            name: os.environ[name]
            for name in ("NVIDIA_VISIBLE_DEVICES", "CUDA_VISIBLE_DEVICES")
            if name in os.environ
        },
        "idle": {name: run(argv) for name, argv in idle_commands().items()},
        "allfields_accepted": accepted_fields(every_field()),
    }
    try:
        import torch  # noqa: F401

        document["load"] = under_load(args.load_seconds, args.hold_mib)
    except ImportError:
        document["load"] = {"error": "no torch in this interpreter: no load captured"}
    args.output.write_text(json.dumps(document, indent=1))
    print(f"nvidia_smi_capture: wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
