"""scripts/import_gpu_capture.py: capture documents become fixture files, byte for byte."""

from __future__ import annotations

import importlib.util
import json
import sys

import pytest

from gpuspawner.validation.gpucheck import CORE_FIELDS, query_args
from tests.conftest import REPO
from tests.validation.nvsmi_fixtures import DELIMITER, FIXTURES, read_fixture

_spec = importlib.util.spec_from_file_location(
    "import_gpu_capture", REPO / "scripts" / "import_gpu_capture.py"
)
assert _spec is not None and _spec.loader is not None
importer = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = importer  # dataclasses look their module up there
_spec.loader.exec_module(importer)

HEADER_KEYS = (
    "source",
    "kind",
    "provenance",
    "gpu",
    "driver_version",
    "command",
    "exit_code",
    "notes",
)


def run(argv, stdout, exit_code=0, stderr=""):
    return {"argv": ["nvidia-smi", *argv], "stdout": stdout, "stderr": stderr,
            "exit_code": exit_code, "seconds": 0.02}  # fmt: skip


VERSION = (
    "NVIDIA-SMI version  : 580.159.04\nNVML version        : 580.159\n"
    "DRIVER version      : 580.159.04\nCUDA Version        : 13.0\n"
)
LISTING = "GPU 0: NVIDIA H200 (UUID: GPU-52b0c693-a3d5-f989-2ab8-cda89f0e8b18)\n"
TABLE = "Fri Dec  4 15:19:39 2026       \n+---+\n"


def document(captured_at, table=TABLE, **idle):
    return {
        "captured_at": captured_at,
        "host": "vm",
        "kernel": "6.18",
        "environment": {"NVIDIA_VISIBLE_DEVICES": "0"},
        "idle": {
            "version": run(["--version"], VERSION),
            "list": run(["-L"], LISTING),
            "table": run([], table),
            **idle,
        },
        "load": {
            "table": run([], table.replace("0%", "99%")),
            "samples": [
                run(["--query-gpu=index,utilization.gpu", "--format=csv"], "index, u\n0, 99 %\n"),
                run(["--query-gpu=index,utilization.gpu", "--format=csv"], "index, u\n0, 98 %\n"),
            ],
        },
    }


def test_each_answer_becomes_one_named_file_with_the_output_verbatim():
    core = run(query_args(CORE_FIELDS), "0, GPU-x, NVIDIA H200, 580.159.04, 0:6.0, 143771\n")
    doc = document(
        "2026-12-04T15:19:39Z",
        core=core,
        bad=run(["-i", "0", "-L"], "ERROR: Option -i is not valid\n\n", 2),
        odd=run(["--help-query-gpu"], "not a command the importer knows\n"),
    )
    made = importer.fixtures([doc], "a lent H200 machine")
    assert sorted(made) == [
        "real__error-option-i-with-L__h200_580.159.04.txt",
        "real__list-L__h200_580.159.04.txt",
        "real__query-gpu-core__h200_580.159.04.txt",
        "real__query-gpu-load-fields__h200_580.159.04__load.txt",
        "real__table__h200_580.159.04__idle.txt",
        "real__table__h200_580.159.04__load.txt",
        "real__version__h200_580.159.04.txt",
    ]
    head, _, output = made["real__table__h200_580.159.04__idle.txt"].text.partition(
        DELIMITER + "\n"
    )
    assert output == TABLE  # the timestamp line's trailing spaces kept
    assert [line.split(":")[0][2:] for line in head.splitlines()] == list(HEADER_KEYS)
    assert "# command: nvidia-smi -i 0 -L\n# exit_code: 2\n" in (
        made["real__error-option-i-with-L__h200_580.159.04.txt"].text
    )
    # Of several samples of one command, the first is kept.
    assert made["real__query-gpu-load-fields__h200_580.159.04__load.txt"].text.endswith("99 %\n")


def test_the_first_document_wins_and_identifiers_are_kept_and_said_to_be():
    newer = document("2026-12-04T15:19:39Z", table="new\n")
    older = document("2026-12-04T15:18:33Z", table="old\n")
    made = importer.fixtures([newer, older], "a lent H200 machine")
    text = made["real__table__h200_580.159.04__idle.txt"].text
    assert text.endswith(DELIMITER + "\nnew\n")
    assert "capture document of 2026-12-04T15:19:39Z" in text
    assert "masked=no" in text
    assert (
        "GPU-52b0c693-a3d5-f989-2ab8-cda89f0e8b18" in made["real__list-L__h200_580.159.04.txt"].text
    )


def test_stderr_is_appended_after_stdout_and_said_so():
    doc = document("2026-12-04T15:19:39Z")
    doc["idle"]["list"] = run(["-L"], LISTING, stderr="warning\n")
    text = importer.fixtures([doc], "m")["real__list-L__h200_580.159.04.txt"].text
    assert text.endswith(LISTING + "warning\n")
    assert "stdout, then stderr appended after it" in text


def test_an_accepted_allfields_query_names_the_fields_the_driver_rejected():
    doc = document("2026-12-04T15:19:39Z")
    fields = ",".join(f"f{n}" for n in range(150))
    doc["allfields_accepted"] = {
        "answer": run([f"--query-gpu={fields}", "--format=csv"], "f0, f1\n"),
        "rejected": ["edpp_multiplier"],
    }
    made = importer.fixtures([doc], "m")
    text = made["real__query-gpu-allfields__h200_580.159.04__idle.txt"].text
    assert "without each field this driver rejected" in text
    assert "edpp_multiplier" in text


def test_main_writes_the_files_and_rewrites_its_index_section(tmp_path):
    (tmp_path / "INDEX.md").write_text("# INDEX\n\nkept\n", encoding="utf-8")
    path = tmp_path / "capture.json"
    path.write_text(json.dumps(document("2026-12-04T15:19:39Z")), encoding="utf-8")
    for _ in range(2):
        assert importer.main([str(path), "--fixtures", str(tmp_path), "--machine", "m"]) == 0
    index = (tmp_path / "INDEX.md").read_text(encoding="utf-8")
    assert index.startswith("# INDEX\n\nkept\n")
    assert index.count("## Real captures by this project") == 1
    assert (tmp_path / "real__version__h200_580.159.04.txt").read_text().endswith(VERSION)


REAL = sorted(FIXTURES.glob("real__*.txt"))


def test_the_real_captures_are_there_and_listed_in_the_index():
    assert len(REAL) >= 20
    index = (FIXTURES / "INDEX.md").read_text(encoding="utf-8")
    section = index.split(importer.INDEX_START, 1)[1].split(importer.INDEX_END, 1)[0]
    assert sorted(
        line.split("`")[1] for line in section.splitlines() if line.startswith("| `")
    ) == [path.name for path in REAL]


@pytest.mark.parametrize("path", REAL, ids=lambda path: path.name)
def test_every_real_capture_has_the_index_header(path):
    head, _ = read_fixture(path)
    assert [line.split(":")[0][2:] for line in head] == list(HEADER_KEYS)
    assert "confidence A" in head[2] and "masked=no" in head[2]
