"""Turn capture documents of ``scripts/nvidia_smi_capture.py`` into nvidia-smi fixture files.

``scripts/gpu-checks.sh --capture FILE`` records, on a machine with a real NVIDIA GPU, nvidia-smi's
exact answers to every command line gpuspawner runs or emulates (idle, under load, and after the
load). This script writes each answer as one fixture file in ``tests/fixtures/nvidia-smi/`` in
the format of that folder's INDEX.md (``# `` header lines, the delimiter line, then the output
byte for byte), named ``real__<what>__<gpu>_<driver>[__<state>].txt``, and rewrites the
"Real captures by this project" section of INDEX.md to list them.

    scripts/import_gpu_capture.py run2.json run1.json --machine "a lent H200 machine"

Give the newest document first: when several documents hold the same command, the first one's
answer is kept, so no fixture is written twice. Identifiers (GPU UUID, serial number, host name)
are kept verbatim, never masked; every file's provenance line says so.

Standard library and this repository only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from gpuspawner.validation.gpucheck import CORE_FIELDS, HEALTH_FIELDS, query_args
from tests.validation.nvsmi_fixtures import DELIMITER, FIXTURES

INDEX_START = (
    "<!-- real captures: written by scripts/import_gpu_capture.py; do not edit by hand -->"
)
INDEX_END = "<!-- end of real captures -->"

# Commands captured in more than one state get the state in their file name.
STATEFUL = {
    "table",
    "query-compute-apps",
    "query-gpu-allfields",
    "query-gpu-load-fields",
    "query-gpu-load-fields-noheader-nounits",
    "dmon",
}

STATES = {
    "idle": "idle: nothing running on the GPU",
    "load": (
        "load: scripts/nvidia_smi_capture.py's PyTorch bf16 8192x8192 matrix-product loop on "
        "GPU 0 for 12 s holding 20480 MiB (its defaults, as scripts/gpu-checks.sh runs it), "
        "sampled from 2 s after it started"
    ),
    "after": "after: about 3 s after the load process exited",
}


@dataclass(frozen=True)
class Answer:
    """One nvidia-smi run as a capture document records it."""

    state: str  # idle | load | after
    argv: tuple[str, ...]
    stdout: str
    stderr: str
    exit_code: int | None
    seconds: float | None
    rejected: tuple[str, ...] = ()  # fields dropped before this query was accepted


@dataclass(frozen=True)
class Machine:
    """What every fixture of one capture document says about where it was recorded."""

    captured_at: str
    host: str
    kernel: str
    environment: dict[str, str]
    gpu_name: str
    gpu_count: int
    driver: str
    smi_version: str
    cuda: str

    @property
    def tag(self) -> str:
        """``NVIDIA H100 80GB HBM3`` with driver 590.48.01 -> ``h100-80gb-hbm3_590.48.01``."""
        name = re.sub(r"^NVIDIA ", "", self.gpu_name).lower()
        name = re.sub(r"[^a-z0-9.]+", "-", name).strip("-")
        count = f"{self.gpu_count}x-" if self.gpu_count > 1 else ""
        return f"{count}{name}_{self.driver}"


def _answer(state: str, run: dict, rejected: tuple[str, ...] = ()) -> Answer:
    return Answer(
        state,
        tuple(run["argv"]),
        run.get("stdout") or "",
        run.get("stderr") or "",
        run.get("exit_code"),
        run.get("seconds"),
        rejected,
    )


def answers(document: dict) -> Iterator[Answer]:
    """Every nvidia-smi run a capture document holds, with the state it ran in."""
    for run in document.get("idle", {}).values():
        yield _answer("idle", run)
    accepted = document.get("allfields_accepted") or {}
    if accepted.get("answer"):
        yield _answer("idle", accepted["answer"], tuple(accepted.get("rejected", ())))
    load = document.get("load") or {}
    for key, value in load.items():
        if not isinstance(value, dict) or key == "error":
            continue
        if "answer" in value:
            if value["answer"]:
                yield _answer("load", value["answer"], tuple(value.get("rejected", ())))
        elif "argv" in value:
            yield _answer("after" if key.endswith("after") else "load", value)
    for run in load.get("samples", []):
        yield _answer("load", run)


def _value(text: str, label: str) -> str:
    match = re.search(rf"^{re.escape(label)}\s*:\s*(\S+)", text, re.M)
    return match.group(1) if match else "unknown"


def machine(document: dict) -> Machine:
    """The GPU, driver and host of a document, read from its own --version and -L answers."""
    runs = {a.argv[1:]: a for a in answers(document) if a.state == "idle"}
    version = runs.get(("--version",))
    listing = runs.get(("-L",))
    names = re.findall(r"^GPU \d+: (.+?) \(UUID:", listing.stdout if listing else "", re.M)
    text = version.stdout if version else ""
    return Machine(
        captured_at=document.get("captured_at", "unknown"),
        host=document.get("host", "unknown"),
        kernel=document.get("kernel", "unknown"),
        environment=dict(document.get("environment", {})),
        gpu_name=names[0] if names else "unknown GPU",
        gpu_count=len(names),
        driver=_value(text, "DRIVER version"),
        smi_version=_value(text, "NVIDIA-SMI version"),
        cuda=_value(text, "CUDA Version"),
    )


def _query(args: tuple[str, ...]) -> str | None:
    for arg in args:
        if arg.startswith("--query-gpu="):
            return arg.split("=", 1)[1]
    return None


def what(answer: Answer) -> tuple[str, str] | None:
    """(file name part, kind) for an answer, or None for one that is not kept."""
    args = answer.argv[1:]
    query = _query(args)
    rc = answer.exit_code
    invalid = re.match(r'Field "([^"]+)" is not a valid field to query\.', answer.stdout)
    fixed = {
        ("--version",): ("version", "nvidia-smi --version"),
        ("-L",): ("list-L", "nvidia-smi -L"),
        (): ("table", "default nvidia-smi table"),
        ("-q",): ("q", "nvidia-smi -q (full text)"),
        ("-q", "-x"): ("q-x", "nvidia-smi -q -x (full XML)"),
        ("-q", "-d", "MEMORY"): ("q-d-memory", "nvidia-smi -q -d MEMORY"),
        ("topo", "-m"): ("topo-m", "nvidia-smi topo -m"),
        ("mig", "-lgip"): ("mig-lgip", "nvidia-smi mig -lgip (GPU instance profiles)"),
        ("mig", "-lgipp"): ("mig-lgipp", "nvidia-smi mig -lgipp (GPU instance placements)"),
        (
            "--query-compute-apps=pid,process_name,used_memory",
            "--format=csv",
        ): ("query-compute-apps", "nvidia-smi --query-compute-apps CSV"),
    }
    if args in fixed:
        return fixed[args]
    if args[:1] == ("dmon",):
        return "dmon", "nvidia-smi " + " ".join(args)
    if "-L" in args and ("-i" in args or "--id" in args):
        return "error-option-i-with-L", "FAILURE: -i given with -L"
    if query is None:
        return None
    if invalid:
        return (
            f"error-invalid-field__{invalid.group(1)}",
            f"FAILURE: --query-gpu field {invalid.group(1)!r} unknown to this driver",
        )
    if "-i" in args and rc == 6:
        return "error-id-not-found", "FAILURE: -i names no GPU (No devices were found)"
    if "-i" in args:
        return "query-gpu-id", "--query-gpu with -i"
    if list(args) == query_args(CORE_FIELDS):
        return "query-gpu-core", "the GPU check's core --query-gpu (csv,noheader,nounits)"
    if list(args) == query_args(("index", *HEALTH_FIELDS)):
        return "query-gpu-health", "the GPU check's health --query-gpu (csv,noheader,nounits)"
    if len(query.split(",")) > 100:
        return (
            "query-gpu-allfields",
            "nvidia-smi --query-gpu=<every field this driver accepts> --format=csv",
        )
    noheader = any("noheader" in arg for arg in args if arg.startswith("--format"))
    name = "query-gpu-load-fields" + ("-noheader-nounits" if noheader else "")
    return name, "the --query-gpu fields the culler and admin page read while a notebook computes"


def _notes(answer: Answer, stem: str) -> str:
    notes = [f"state={STATES[answer.state]}"]
    if stem == "table":
        notes.append("the first line is the timestamp, padded with trailing spaces")
    if stem == "topo-m":
        notes.append("the header line carries ANSI escape sequences (ESC[4m, ESC[0m) and tabs")
    if answer.rejected:
        notes.append(
            "asked for every field of sandbox/go/nvidiasmi/capture.json (the 590.48.01 "
            "ALLFIELDS header), then again without each field this driver rejected "
            f"(exit 2, 'Field \"...\" is not a valid field to query.'): {', '.join(answer.rejected)}"
        )
    if answer.stdout.endswith("\n\n"):
        notes.append("the message is followed by an empty line")
    if answer.seconds is not None:
        notes.append(f"took {answer.seconds} s")
    return "; ".join(notes)


def fixture_text(answer: Answer, stem: str, kind: str, where: Machine, on: str) -> str:
    """The full text of one fixture file: header lines, delimiter, verbatim output."""
    environment = ", ".join(f"{k}={v}" for k, v in sorted(where.environment.items()))
    streams = (
        "stdout only (stderr was empty)"
        if not answer.stderr
        else "stdout, then stderr appended after it"
    )
    lines = [
        "# source: this repository's scripts/gpu-checks.sh --capture "
        "(scripts/nvidia_smi_capture.py), its capture document of "
        f"{where.captured_at}, imported by scripts/import_gpu_capture.py",
        f"# kind: {kind}",
        f"# provenance: captured by this project's scripts/gpu-checks.sh --capture on {on}, "
        f"{where.captured_at[:10]} (host {where.host!r}, kernel {where.kernel}"
        + (f", {environment}" if environment else "")
        + f"); {streams}; masked=no: the GPU UUID, serial number and host name are the real "
        "ones, kept verbatim; confidence A",
        f"# gpu: {where.gpu_name} ({where.gpu_count} GPU visible)",
        f"# driver_version: {where.driver}   nvidia-smi_version: {where.smi_version}   "
        f"cuda: {where.cuda}",
        f"# command: {' '.join(answer.argv)}",
        f"# exit_code: {answer.exit_code if answer.exit_code is not None else 'none (timed out)'}",
        f"# notes: {_notes(answer, stem)}",
        DELIMITER,
    ]
    return "\n".join(lines) + "\n" + answer.stdout + answer.stderr


@dataclass(frozen=True)
class Fixture:
    name: str
    kind: str
    command: str
    exit_code: int | None
    text: str
    stderr: str


def fixtures(documents: list[dict], on: str) -> dict[str, Fixture]:
    """File name -> fixture for every kept answer; the first document's answer wins."""
    made: dict[str, Fixture] = {}
    for document in documents:
        where = machine(document)
        for answer in answers(document):
            found = what(answer)
            if found is None:
                continue
            stem, kind = found
            state = f"__{answer.state}" if stem in STATEFUL else ""
            name = f"real__{stem}__{where.tag}{state}.txt"
            if stem not in STATEFUL and answer.state != "idle":
                continue  # one-off commands are only kept from the idle run
            if name in made:
                continue
            made[name] = Fixture(
                name,
                kind,
                " ".join(answer.argv) if len(" ".join(answer.argv)) < 120 else "(see file)",
                answer.exit_code,
                fixture_text(answer, stem, kind, where, on),
                answer.stderr,
            )
    return made


def index_section(made: dict[str, Fixture], on: str) -> str:
    """The INDEX.md section listing the real captures."""
    streams = (
        "stderr was empty for every one"
        if not any(f.stderr for f in made.values())
        else "followed by stderr where a header says so"
    )
    rows = [
        f"| `{f.name}` | {f.kind} | `{f.command}` | {f.exit_code} | A |"
        for f in sorted(made.values(), key=lambda f: f.name)
    ]
    return "\n".join(
        [
            INDEX_START,
            "## Real captures by this project",
            "",
            f"Recorded by `scripts/gpu-checks.sh --capture` on {on} and written here by "
            "`scripts/import_gpu_capture.py` (regenerate with it; it also rewrites this "
            "section). Each file's header gives the capture document's time, the host, the "
            "state (idle, under a PyTorch load, after it), the exact command and its exit code. "
            f"The body is nvidia-smi's stdout byte for byte ({streams}). "
            "Identifiers are **not masked**: the GPU UUID, serial number and host name are the "
            "real, harmless ones (the collected captures above mask theirs).",
            "",
            "| file | what | command | exit | conf. |",
            "|---|---|---|---|---|",
            *rows,
            INDEX_END,
        ]
    )


def update_index(index: str, section: str) -> str:
    """INDEX.md's text with the real-captures section replaced (or appended)."""
    if INDEX_START in index and INDEX_END in index:
        before, rest = index.split(INDEX_START, 1)
        after = rest.split(INDEX_END, 1)[1]
        return before + section + after
    return index.rstrip("\n") + "\n\n\n" + section + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("documents", nargs="+", type=Path, help="capture documents, newest first")
    parser.add_argument(
        "--machine",
        default="a machine with a real NVIDIA GPU",
        help="where the capture ran, as the provenance line should say it",
    )
    parser.add_argument("--fixtures", type=Path, default=FIXTURES, help="the fixture folder")
    args = parser.parse_args(argv)
    documents = [json.loads(path.read_text(encoding="utf-8")) for path in args.documents]
    made = fixtures(documents, args.machine)
    for fixture in made.values():
        (args.fixtures / fixture.name).write_text(fixture.text, encoding="utf-8", newline="")
    index = args.fixtures / "INDEX.md"
    index.write_text(
        update_index(index.read_text(encoding="utf-8"), index_section(made, args.machine)),
        encoding="utf-8",
    )
    print(f"import_gpu_capture: wrote {len(made)} fixtures to {args.fixtures}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
