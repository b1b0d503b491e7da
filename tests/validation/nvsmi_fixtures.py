"""Read the recorded nvidia-smi fixtures, and derive the ``csv,noheader,nounits`` ones.

Every fixture file is a ``# ``-header (provenance), the delimiter line, then the verbatim
output. No real capture of the exact queries the GPU check runs exists, so the
``derived__*.txt`` files are made here from the real ``--query-gpu=<every field>
--format=csv`` captures by the transformation nvidia-smi itself applies: pick the requested
columns by header name, drop the header line (``noheader``) and the unit suffixes of the
values (``nounits``). The ``changed__*.txt`` files then change exactly one cell of a derived
file to produce an error situation no capture shows.

This is deliberately independent of ``gpuspawner.validation.gpucheck`` (it never calls its
parser), so the tests compare the check against data it did not produce.

Regenerate with ``python tests/validation/nvsmi_fixtures.py`` (the tests fail when a
committed derived file no longer matches its source).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "nvidia-smi"
DELIMITER = "# ----- verbatim output below this line -----"

# The two queries the check runs, in its order (kept here on purpose rather than imported:
# the test asserts the check still asks for exactly these).
CORE_FIELDS = ("index", "uuid", "name", "driver_version", "pci.bus_id", "memory.total")
HEALTH_FIELDS = (
    "index",
    "ecc.mode.current",
    "ecc.errors.uncorrected.volatile.total",
    "retired_pages.pending",
    "remapped_rows.pending",
    "remapped_rows.failure",
    "mig.mode.current",
)
QUERIES = {"core": CORE_FIELDS, "health": HEALTH_FIELDS}

# capture key -> the ALLFIELDS capture it comes from
CAPTURES = {
    "h100-80gb-hbm3_590.48.01": "query-gpu-csv-ALLFIELDS__h100-80gb-hbm3_590.48.01__idle.txt",
    "h100-80gb-hbm3-MIG_590.48.01": (
        "query-gpu-csv-ALLFIELDS__h100-80gb-hbm3-MIG_590.48.01__idle.txt"
    ),
    "h200_590.48.01": "query-gpu-csv-ALLFIELDS__h200_590.48.01__idle.txt",
    "h200-MIG_590.48.01": "query-gpu-csv-ALLFIELDS__h200-MIG_590.48.01__load.txt",
    "l40s_595.80": "query-gpu-csv-ALLFIELDS__l40s_595.80__idle.txt",
    "rtx2080super_linux_610.57.04": (
        "query-gpu-csv-ALLFIELDS__rtx2080super_linux_610.57.04__idle.txt"
    ),
    "rtx4080super_linux_595.71.05": (
        "query-gpu-csv-ALLFIELDS__rtx4080super_linux_595.71.05__idle.txt"
    ),
}


@dataclass(frozen=True)
class Change:
    """One cell changed in a derived file to make an error situation."""

    name: str
    capture: str
    query: str
    field: str
    old: str
    new: str
    why: str


CHANGES = (
    Change(
        "ecc-uncorrected-volatile-2",
        "h100-80gb-hbm3_590.48.01",
        "health",
        "ecc.errors.uncorrected.volatile.total",
        "0",
        "2",
        "no capture with a non-zero volatile uncorrectable ECC count exists",
    ),
    Change(
        "retired-pages-pending-yes",
        "h100-80gb-hbm3_590.48.01",
        "health",
        "retired_pages.pending",
        "[N/A]",
        "Yes",
        "no CSV capture with a pending page retirement exists; on Hopper this field is really "
        "[N/A] (it uses row remapping), so this only exercises the Yes path",
    ),
    Change(
        "remapped-rows-pending-yes",
        "h100-80gb-hbm3_590.48.01",
        "health",
        "remapped_rows.pending",
        "No",
        "Yes",
        "a real A10 shows 'Pending : Yes' in -q text (leptonai/gpud), but no CSV capture does",
    ),
    Change(
        "remapped-rows-failure-yes",
        "h100-80gb-hbm3_590.48.01",
        "health",
        "remapped_rows.failure",
        "No",
        "Yes",
        "no capture with a row remapping failure exists",
    ),
    Change(
        "driver-535.161.08",
        "h100-80gb-hbm3_590.48.01",
        "core",
        "driver_version",
        "590.48.01",
        "535.161.08",
        "an older driver for the CUDA check; 535.161.08 is a real H100 driver (see "
        "q-ecc-excerpt__8x-h100-80gb-hbm3_535.161.08.txt in the shared fixture set)",
    ),
    Change(
        "ecc-uncorrected-volatile-unknown-error",
        "h100-80gb-hbm3_590.48.01",
        "health",
        "ecc.errors.uncorrected.volatile.total",
        "0",
        "[Unknown Error]",
        "nvidia-smi prints a field whose NVML call failed as the bracketed nvmlErrorString; "
        "'[Unknown Error]' (NVML_ERROR_UNKNOWN) is recorded in real --query-gpu CSV output for "
        "fan.speed (enkore/i3pystatus#850, MindMiner #627 in INDEX.md), but no capture shows "
        "it in a health field",
    ),
)

# An -L output the check cannot read: a real capture with the (derived) loader warning
# appended, as nvidia-smi's output reads when a wrapper merges stderr into stdout.
MERGED_LIST = "changed__list-L__h200_590.48.01__stderr-merged.txt"
MERGED_LIST_SOURCES = (
    "list-L__h200_590.48.01.txt",
    "stderr-loader-warning__libnvidia-ml-no-version-information.txt",
)


def read_fixture(path: Path) -> tuple[list[str], str]:
    """(header lines, verbatim body) of a fixture file: everything after the delimiter."""
    text = path.read_text(encoding="utf-8")
    head, sep, body = text.partition(DELIMITER + "\n")
    if not sep:
        raise ValueError(f"{path.name}: no delimiter line")
    return head.splitlines(), body


def body(name: str) -> str:
    """The verbatim output recorded in ``tests/fixtures/nvidia-smi/<name>``."""
    return read_fixture(FIXTURES / name)[1]


def header_value(lines: list[str], key: str) -> str:
    """The text after ``# key:`` in a fixture header."""
    for line in lines:
        if line.startswith(f"# {key}:"):
            return line[len(key) + 3 :].strip()
    raise KeyError(key)


def project(csv_text: str, fields: tuple[str, ...]) -> str:
    """Turn ``--format=csv`` output into ``--format=csv,noheader,nounits`` output of ``fields``."""
    lines = [line for line in csv_text.splitlines() if line.strip()]
    header = lines[0].split(", ")
    names = [re.sub(r" \[[^\]]+\]$", "", cell) for cell in header]
    units = {
        name: match.group(1)
        for name, cell in zip(names, header, strict=True)
        if (match := re.search(r" \[([^\]]+)\]$", cell))
    }
    out = []
    for line in lines[1:]:
        cells = dict(zip(names, line.split(", "), strict=True))
        values = []
        for name in fields:
            value = cells[name]
            unit = units.get(name)
            if unit and value.endswith(" " + unit):
                value = value[: -len(unit) - 1]
            values.append(value)
        out.append(", ".join(values))
    return "\n".join(out) + "\n"


def derived_name(capture: str, query: str) -> str:
    return f"derived__query-gpu-{query}__{capture}.txt"


def changed_name(change: Change) -> str:
    return f"changed__query-gpu-{change.query}__{change.capture}__{change.name}.txt"


def _provenance(head: list[str]) -> list[str]:
    return [line for line in head if line.startswith(("# source:", "# provenance:", "# gpu:"))]


def derive(capture: str, query: str) -> str:
    """The full text of one derived fixture file."""
    source = CAPTURES[capture]
    head, csv_text = read_fixture(FIXTURES / source)
    fields = QUERIES[query]
    return "\n".join(
        [
            *_provenance(head),
            f"# kind: DERIVED: --query-gpu {query} fields in csv,noheader,nounits form",
            f"# driver_version: {header_value(head, 'driver_version')}",
            f"# command: nvidia-smi --query-gpu={','.join(fields)} --format=csv,noheader,nounits",
            "# exit_code: 0 (as the source capture)",
            f"# notes: DERIVED, not a separate nvidia-smi run: from {source} (copied verbatim "
            "beside this file), columns picked by header name in the order above, header line "
            "dropped (noheader), the unit suffix named in a column's header removed from its "
            "values (nounits); cell text otherwise unchanged. Made by "
            "tests/validation/nvsmi_fixtures.py.",
            DELIMITER,
            project(csv_text, fields),
        ]
    )


def apply_change(change: Change) -> str:
    """The full text of one changed fixture file."""
    base = derived_name(change.capture, change.query)
    head, text = read_fixture(FIXTURES / base)
    fields = QUERIES[change.query]
    column = fields.index(change.field)
    rows = [line.split(", ") for line in text.splitlines()]
    if rows[0][column] != change.old:
        raise ValueError(f"{base}: {change.field} is {rows[0][column]!r}, not {change.old!r}")
    rows[0][column] = change.new
    kept = [line for line in head if not line.startswith(("# kind:", "# notes:"))]
    return "\n".join(
        [
            *kept,
            f"# kind: CHANGED for a test: one cell of {base}",
            f"# notes: CHANGED from {base} (itself derived from a real capture): GPU 0's "
            f"{change.field} changed from {change.old!r} to {change.new!r}; nothing else "
            f"changed. Why: {change.why}. Made by tests/validation/nvsmi_fixtures.py.",
            DELIMITER,
            "\n".join(", ".join(row) for row in rows) + "\n",
        ]
    )


def merged_list() -> str:
    """The full text of ``MERGED_LIST``: the real -L capture, then the loader warning line."""
    listing, warning = MERGED_LIST_SOURCES
    head, text = read_fixture(FIXTURES / listing)
    kept = [line for line in head if not line.startswith(("# kind:", "# notes:", "# provenance:"))]
    return "\n".join(
        [
            *kept,
            "# kind: CHANGED for a test: an -L output with a line the check does not know",
            "# provenance: CHANGED, not a recorded run: the verbatim output of "
            f"{listing} followed by the one line of {warning} (itself DERIVED from glibc's "
            "loader format), as a wrapper that merges stderr into stdout would print them",
            "# notes: pairs with derived__query-gpu-*__h200-MIG_590.48.01.txt (same board in MIG "
            "mode, same masked UUID). Made by tests/validation/nvsmi_fixtures.py.",
            DELIMITER,
            text + body(warning),
        ]
    )


def expected_files() -> dict[str, str]:
    """Every generated fixture file name -> its content."""
    files = {
        derived_name(capture, query): derive(capture, query)
        for capture in CAPTURES
        for query in QUERIES
    }
    # Changes read the derived files from disk, so write those first when regenerating.
    return files


def write_all() -> None:
    for name, text in expected_files().items():
        (FIXTURES / name).write_text(text, encoding="utf-8")
    for change in CHANGES:
        (FIXTURES / changed_name(change)).write_text(apply_change(change), encoding="utf-8")
    (FIXTURES / MERGED_LIST).write_text(merged_list(), encoding="utf-8")


if __name__ == "__main__":
    write_all()
    sys.exit(0)
