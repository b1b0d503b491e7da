"""Property tests of the GPU check's nvidia-smi parsing: whatever nvidia-smi prints, the parsers
either read it or refuse it with ``OutputError``, and the check as a whole ends in a result or a
``CheckFailed`` with one line of reason; never another exception.

Inputs: arbitrary text and bytes, hostile pieces (markup, NUL, CR/LF, bidi overrides, 10 kB
strings, non-ASCII digits and line breaks), and real recorded outputs (``tests/fixtures/
nvidia-smi`` and, where this checkout has it, ``../shared/fixtures/nvidia-smi``) mutated.
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from gpuspawner.validation import gpucheck
from gpuspawner.validation.gpucheck import (
    CORE_FIELDS,
    HEALTH_FIELDS,
    CheckFailed,
    CheckResult,
    Collected,
    CommandResult,
    OutputError,
)
from tests.conftest import REPO
from tests.validation.nvsmi_fixtures import DELIMITER, FIXTURES

FIXTURE_DIRS = (FIXTURES, REPO.parent / "shared" / "fixtures" / "nvidia-smi")


def _recorded() -> list[str]:
    """The verbatim output of every recorded fixture in the fixture directories there are."""
    outputs = []
    for directory in FIXTURE_DIRS:
        for path in sorted(Path(directory).glob("*.txt")) if directory.is_dir() else ():
            text = path.read_text(encoding="utf-8", errors="replace")
            if DELIMITER in text:
                outputs.append(text.split(DELIMITER + "\n", 1)[-1])
    return outputs


RECORDED = _recorded()
assert len(RECORDED) > 50, "the recorded nvidia-smi outputs are missing"
RECORDED_LINES = sorted({line for text in RECORDED for line in text.splitlines()})

HOSTILE = [
    "<script>alert(1)</script>",
    '"><img src=x onerror=alert(1)>',
    "&lt;b&gt;&#0;",
    "\x00",
    "\r\n",
    "\r",
    "\n\n",
    "\u202e",  # right-to-left override
    "\u2066\u2069",  # isolates
    "\u200f",
    "\ufeff",
    "\u2028",  # line separator: a line break to str.splitlines
    "\x85",
    "\x0b\x0c\x1c",
    "Zoë 🚀",
    "٣٤",  # Arabic-Indic digits: \d matches them, nvidia-smi never prints them
    "9" * 5000,  # more digits than Python 3.11+ converts to int
    "x" * 10_240,
    "[Unknown Error]",
    "[N/A]",
    "[Not Supported]",
    "Yes",
    "No",
    "Enabled",
    ", ",
    ",",
    "GPU 0: ",
    "GPU 99999999999: NVIDIA H100 (UUID: GPU-1)",
    " (UUID: GPU-00000000-0000-0000-0000-000000000000)",
    "  MIG 1g.10gb     Device  0: (UUID: MIG-1)",
    "WARNING: infoROM is corrupted at gpu 0000:0B:00.0",
    "No devices were found",
    "Unable to determine the device handle for GPU 0000:09:00.0: Unknown Error",
    "GPU is lost",
    "Driver/library version mismatch",
]

PIECES = st.one_of(
    st.text(max_size=40),
    st.sampled_from(HOSTILE),
    st.sampled_from(RECORDED_LINES),
    st.sampled_from(["\n", ", ", " ", "."]),
)
ASSEMBLED = st.lists(PIECES, max_size=25).map("".join)
# 10 kB and more of one repeated piece
LONG = st.one_of(st.sampled_from(HOSTILE), st.text(min_size=1, max_size=12)).map(
    lambda piece: piece * (10_240 // len(piece) + 1)
)


@st.composite
def mutated(draw: st.DrawFn) -> str:
    """A real nvidia-smi output with a few edits: pieces inserted, text cut, lines moved."""
    text = draw(st.sampled_from(RECORDED))
    for _ in range(draw(st.integers(1, 4))):
        lines = text.splitlines(keepends=True)
        edit = draw(st.sampled_from(["insert", "delete", "replace", "duplicate", "swap", "cut"]))
        at = draw(st.integers(0, len(text)))
        if edit == "insert":
            text = text[:at] + draw(PIECES) + text[at:]
        elif edit == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 40)) :]
        elif edit == "replace" and text:
            at = min(at, len(text) - 1)
            text = text[:at] + draw(st.characters()) + text[at + 1 :]
        elif edit == "duplicate" and lines:
            line = draw(st.integers(0, len(lines) - 1))
            text = "".join(lines[: line + 1] + lines[line:])
        elif edit == "swap" and len(lines) > 1:
            first, second = draw(st.lists(st.integers(0, len(lines) - 1), min_size=2, max_size=2))
            lines[first], lines[second] = lines[second], lines[first]
            text = "".join(lines)
        elif edit == "cut":
            text = text[:at]
    return text


# Lines of the shapes the parsers look for, with hostile values in their fields.
CELL = st.one_of(
    st.text(max_size=20), st.sampled_from(HOSTILE), st.integers(0, 10**6).map(str), st.just("")
)
SHAPED_LINE = st.one_of(
    st.builds("GPU {}: {} (UUID: {})".format, CELL, CELL, CELL),
    st.builds("  MIG {}     Device  {}: (UUID: {})".format, CELL, CELL, CELL),
    *(st.lists(CELL, min_size=n, max_size=n).map(", ".join) for n in (2, 6, 7)),
    st.sampled_from(RECORDED_LINES),
)
SHAPED = st.lists(SHAPED_LINE, max_size=8).map("\n".join)
OUTPUT = st.one_of(st.text(), ASSEMBLED, LONG, SHAPED, mutated(), st.sampled_from(RECORDED))
RAW = st.one_of(
    st.binary(max_size=2000),
    OUTPUT.map(lambda text: text.encode("utf-8", errors="surrogatepass")),
    st.tuples(mutated(), st.binary(max_size=40), st.integers(0, 4000)).map(
        lambda t: t[0].encode()[: t[2]] + t[1] + t[0].encode()[t[2] :]
    ),
)
PROPERTIES = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.large_base_example],
)
QUERIES = (CORE_FIELDS, ("index", *HEALTH_FIELDS), ("index", "ecc.mode.current"))


def parse_all(text: str) -> None:
    """Every parser the check runs on stdout: each reads ``text`` or raises OutputError."""
    gpucheck.split_warnings(text)
    try:
        for gpu in gpucheck.parse_list(text):
            assert isinstance(gpu.index, int) and gpu.index >= 0
            assert all(isinstance(mig.index, int) for mig in gpu.mig_devices)
    except OutputError as error:
        assert str(error)
    for fields in QUERIES:
        try:
            rows = gpucheck.parse_query_csv(text, fields)
        except OutputError as error:
            assert str(error)
            continue
        for row in rows:
            assert set(row) == set(fields)
        gpucheck.merge_rows(rows)


# More digits than int() converts on Python 3.11+: once a crash (ValueError) in the -L and CSV
# parsers and in the decision.
LONG_INDEX = "9" * 5000
LIST_WITH_LONG_INDEX = f"GPU {LONG_INDEX}: NVIDIA H100 80GB HBM3 (UUID: GPU-1)\n"
CSV_WITH_LONG_INDEX = f"{LONG_INDEX}, GPU-1, NVIDIA H100, 590.48.01, 00000000:01:00.0, 81559\n"


@PROPERTIES
@given(OUTPUT)
@example(LIST_WITH_LONG_INDEX)
@example(LIST_WITH_LONG_INDEX.replace("GPU ", "  MIG 1g.10gb Device ", 1).replace("GPU-1", "MIG-1"))
@example(CSV_WITH_LONG_INDEX)
@example(CSV_WITH_LONG_INDEX.replace("590.48.01", LONG_INDEX + ".1"))
def test_any_text_parses_or_raises_output_error(text):
    parse_all(text)


@PROPERTIES
@given(RAW)
@example(LIST_WITH_LONG_INDEX.encode())
@example(b"GPU 0: NVIDIA \xff\xfe H100 (UUID: GPU-1)\r\n\x00")
def test_any_bytes_decode_and_then_parse_or_raise_output_error(data):
    text = gpucheck.decode_output(data)
    assert isinstance(text, str)
    parse_all(text)


CELLS = st.one_of(st.none(), st.text(max_size=30), st.sampled_from(HOSTILE), LONG, PIECES)


@PROPERTIES
@given(CELLS)
def test_a_cell_is_a_value_or_none_whatever_it_holds(cell):
    value = gpucheck.clean_value(cell)
    assert value is None or isinstance(value, str)
    assert isinstance(gpucheck.is_error_value(value), bool)
    number = gpucheck.parse_int(cell)
    assert number is None or (isinstance(number, int) and number >= 0)
    assert gpucheck.parse_yes_no(cell) in (True, False, None)
    version = gpucheck.parse_version(cell)
    assert version is None or all(isinstance(part, int) and part >= 0 for part in version)
    record = gpucheck.GpuRecord.from_row({name: cell for name in (*CORE_FIELDS, *HEALTH_FIELDS)})
    assert isinstance(record.label, str)


# Mostly 0, so that many examples get as far as the decision; then nvidia-smi's documented
# exit codes and some it does not document.
RETURN_CODES = st.one_of(
    st.just(0), st.just(0), st.sampled_from([1, 2, 3, 4, 6, 9, 12, 14, 15, 18, 97, 255])
)
ANSWER = st.tuples(RETURN_CODES, OUTPUT, st.one_of(st.just(""), OUTPUT))
RESOURCES = st.sampled_from(
    ["nvidia.com/gpu", "nvidia.com/gpu.shared", "nvidia.com/mig-1g.10gb", "nvidia.com/mig-3g.40gb"]
)
CUDA = st.sampled_from([None, "12.4", "13.0", "11.0", "10.2", "9.0", "14.1", "x.y", "9" * 5000])


def one_line(reason: str | None) -> str:
    assert reason and reason.strip()
    assert reason.splitlines() == [reason], repr(reason[:300])
    return reason


@PROPERTIES
@given(ANSWER, ANSWER, ANSWER, st.integers(1, 8), RESOURCES, CUDA)
def test_the_whole_check_on_any_output_ends_in_a_result_or_one_line_of_reason(
    listed, core, health, expected, resource, cuda
):
    """From nvidia-smi's answers to the decision, as ``check`` runs them (minus the processes)."""

    def run(args: list[str]) -> CommandResult:
        if args == ["-L"]:
            answer = listed
        elif args[0] == "--query-gpu=" + ",".join(CORE_FIELDS):
            answer = core
        else:
            answer = health
        returncode, stdout, stderr = answer
        return CommandResult(returncode, stdout, stderr)

    try:
        collected = gpucheck.collect(run)
    except CheckFailed as failure:
        assert failure.exit_code in gpucheck.EXIT_CODES
        one_line(failure.reason)
        return
    assert isinstance(collected, Collected)
    result = gpucheck.evaluate(
        expected,
        resource,
        collected.listing,
        collected.records,
        cuda,
        collected.warnings,
        collected.no_devices,
    )
    assert isinstance(result, CheckResult)
    assert result.ok == (result.exit_code == gpucheck.EXIT_OK)
    if result.ok:
        assert result.reason is None
    else:
        assert result.exit_code in gpucheck.EXIT_CODES
        one_line(result.reason)


@PROPERTIES
@given(st.sampled_from(["-L", "--query-gpu=index,uuid"]), RAW, RAW, st.booleans())
def test_the_deadline_reason_is_one_line_whatever_nvidia_smi_printed(args, stdout, stderr, ended):
    run = gpucheck.Unfinished([args], stdout, stderr, output_ended=ended)
    reason = one_line(gpucheck.hung_reason(30, run))
    assert reason.startswith("nvidia-smi did not finish within the GPU check's 30-second limit")
