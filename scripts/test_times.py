#!/usr/bin/env python3
"""The suite's time table: where `make test`'s time went, against each folder's budget.

Reads what ``pytest --time-table=LABEL`` recorded in ``build/test-times/`` (tests/timetable.py)
and the budgets in ``tests/suite-budget.toml``; writes ``build/test-times.md`` and prints it.
Its last lines say which folders went over their budget (or that none did), then the
whole suite's count as one line: ``suite: N passed, N failed, N skipped``.

    python scripts/test_times.py [--records build/test-times] [--out build/test-times.md]

Exit status 0 whatever the figures: a budget is for people to act on, never a timed
assertion (our machines are shared and noisy). 2 when there is nothing to read.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parent.parent
RECORDS = REPO / "build" / "test-times"
OUT = REPO / "build" / "test-times.md"
BUDGET = REPO / "tests" / "suite-budget.toml"
SLOWEST = 20


@dataclass
class Test:
    nodeid: str
    line: str
    process: str
    folder: str
    outcome: str
    setup: float
    call: float
    teardown: float
    start: float
    end: float
    own_cpu: float
    machine_cpu: float
    #: the expensive steps that ran during this test (its fixtures' set-up included)
    steps: list[Step] = field(default_factory=list)

    @property
    def total(self) -> float:
        return self.setup + self.call + self.teardown


@dataclass
class Step:
    kind: str
    what: str
    start: float
    end: float
    ok: bool
    line: str
    process: str

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass
class Session:
    label: str
    start: float
    end: float
    exitstatus: int
    passed: int
    failed: int
    errors: int
    skipped: int


@dataclass
class Records:
    sessions: list[Session]
    tests: list[Test]
    steps: list[Step]


def line_of(label: str) -> str:
    """The budget's line of a run label: ``machine``, or ``unit`` for ``unit-6.1``/``unit-5.5``."""
    return label.split("-", 1)[0]


def read_records(folder: Path) -> Records:
    """Everything the runs recorded (tests/timetable.py), steps attached to their tests."""
    sessions = [Session(**json.loads(p.read_text())) for p in sorted(folder.glob("*.session.json"))]
    tests: list[Test] = []
    steps: list[Step] = []
    for path in sorted(folder.glob("*.json")):
        if path.name.endswith(".session.json"):
            continue
        label, process = path.name[: -len(".json")].rsplit(".", 1)
        for t in json.loads(path.read_text())["tests"]:
            if "end" not in t:  # interrupted mid-test
                continue
            tests.append(
                Test(
                    nodeid=t["nodeid"],
                    line=label,
                    process=process,
                    folder=t["folder"],
                    outcome=t["outcome"],
                    setup=t["setup"],
                    call=t["call"],
                    teardown=t["teardown"],
                    start=t["start"],
                    end=t["end"],
                    own_cpu=t.get("own_cpu", 0.0),
                    machine_cpu=t.get("machine_cpu", 0.0),
                )
            )
    for path in sorted(folder.glob("*.steps.jsonl")):
        label, process = path.name[: -len(".steps.jsonl")].rsplit(".", 1)
        for raw in path.read_text().splitlines():
            try:
                s = json.loads(raw)
            except json.JSONDecodeError:  # a line cut short by a killed process
                continue
            steps.append(Step(s["kind"], s["what"], s["start"], s["end"], s["ok"], label, process))
    attach_steps(tests, steps)
    return Records(sessions, tests, steps)


def attach_steps(tests: Sequence[Test], steps: Iterable[Step]) -> None:
    """Each step goes to the test of the same run and process that was running when it
    began (one test runs at a time in a process; subprocesses write to their parent's file)."""
    by_process: dict[tuple[str, str], list[Test]] = defaultdict(list)
    for t in tests:
        by_process[(t.line, t.process)].append(t)
    for s in steps:
        for t in by_process.get((s.line, s.process), []):
            if t.start <= s.start <= t.end:
                t.steps.append(s)
                break


def read_budget(path: Path) -> dict[str, dict[str, float]]:
    """``{line: {folder: seconds}}`` from tests/suite-budget.toml."""
    data = tomllib.loads(path.read_text())
    return {line: {k: float(v) for k, v in folders.items()} for line, folders in data.items()}


def minutes(seconds: float) -> str:
    seconds = round(seconds)
    return f"{seconds // 60}:{seconds % 60:02d}"


@dataclass
class FolderFigure:
    line: str
    folder: str
    tests: int
    seconds: float
    own_cpu: float
    machine_cpu: float
    budget: float | None

    @property
    def over(self) -> bool:
        return self.budget is not None and self.seconds > self.budget


def folder_figures(
    tests: Iterable[Test], budget: Mapping[str, Mapping[str, float]]
) -> list[FolderFigure]:
    """Per run and folder: tests, seconds in them, CPU, and the folder's budget."""
    grouped: dict[tuple[str, str], list[Test]] = defaultdict(list)
    for t in tests:
        grouped[(t.line, t.folder)].append(t)
    figures = []
    for (label, folder), ts in sorted(grouped.items()):
        figures.append(
            FolderFigure(
                line=label,
                folder=folder,
                tests=len(ts),
                seconds=sum(t.total for t in ts),
                own_cpu=sum(t.own_cpu for t in ts),
                machine_cpu=sum(t.machine_cpu for t in ts),
                budget=budget.get(line_of(label), {}).get(folder),
            )
        )
    return figures


def unbudgeted(figures: Iterable[FolderFigure]) -> list[FolderFigure]:
    return [f for f in figures if f.budget is None]


def waited_for(test: Test) -> str:
    if not test.steps:
        return "nothing recorded"
    return "; ".join(
        f"{s.kind} ({s.what}) {s.seconds:.0f} s" + ("" if s.ok else ", failed")
        for s in sorted(test.steps, key=lambda s: s.start)
    )


def table(
    records: Records,
    budget: Mapping[str, Mapping[str, float]],
    started: float | None = None,
    ended: float | None = None,
) -> list[str]:
    """The time table as Markdown lines, its verdict lines last; ``started`` and ``ended``
    (epoch seconds) are the whole run's, from the first install to the table."""
    out = ["# The test suite's time table", ""]
    if started is not None and ended is not None:
        out += [
            f"The whole run (`make test`'s suite, from its start to this table): {minutes(ended - started)}.",
            "",
        ]
    out += [
        "## Runs",
        "",
        "| run | wall | passed | failed | errors | skipped | exit |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in records.sessions:
        out.append(
            f"| {s.label} | {minutes(s.end - s.start)} | {s.passed} | {s.failed} | {s.errors} "
            f"| {s.skipped} | {s.exitstatus} |"
        )
    figures = folder_figures(records.tests, budget)
    out += [
        "",
        "## Per folder",
        "",
        "Seconds spent in the folder's tests (set-up, call, tear-down; summed over a run's "
        "workers), the CPU of the test process and the children it reaped, and the whole "
        "machine's CPU meanwhile (whatever ran beside included).",
        "",
        "| run | folder | tests | time | own CPU-s | machine CPU-s | budget | |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for f in figures:
        budget_text = minutes(f.budget) if f.budget is not None else "none"
        flag = "OVER" if f.over else ("" if f.budget is not None else "no budget")
        out.append(
            f"| {f.line} | {f.folder} | {f.tests} | {minutes(f.seconds)} | {f.own_cpu:.0f} "
            f"| {f.machine_cpu:.0f} | {budget_text} | {flag} |"
        )
    slowest = sorted(records.tests, key=lambda t: t.total, reverse=True)[:SLOWEST]
    out += [
        "",
        f"## The {SLOWEST} slowest tests",
        "",
        "| test | run | time | set-up | waited for |",
        "|---|---|---|---|---|",
    ]
    for t in slowest:
        out.append(
            f"| `{t.nodeid}` | {t.line} | {minutes(t.total)} | {minutes(t.setup)} | {waited_for(t)} |"
        )
    kinds: dict[str, list[Step]] = defaultdict(list)
    for s in records.steps:
        kinds[s.kind].append(s)
    out += [
        "",
        "## Expensive steps",
        "",
        "How often each ran, its time added up (steps nest: a cluster's start includes its "
        "image's build), and in which runs.",
        "",
        "| step | times | time | runs |",
        "|---|---|---|---|",
    ]
    for kind, steps in sorted(kinds.items()):
        per_run = defaultdict(int)
        for s in steps:
            per_run[s.line] += 1
        runs = ", ".join(f"{label} {n}" for label, n in sorted(per_run.items()))
        out.append(f"| {kind} | {len(steps)} | {minutes(sum(s.seconds for s in steps))} | {runs} |")
    out += ["", "## Budget", ""]
    over = [f for f in figures if f.over]
    for f in over:
        out.append(
            f"OVER BUDGET: {f.line} {f.folder}: {minutes(f.seconds)} against "
            f"{minutes(f.budget or 0)} (tests/suite-budget.toml)"
        )
    for f in unbudgeted(figures):
        out.append(
            f"NO BUDGET: {f.line} {f.folder} ({minutes(f.seconds)}): add it to tests/suite-budget.toml"
        )
    if not over and not unbudgeted(figures):
        out.append("Suite budget: every folder within its budget.")
    passed = sum(s.passed for s in records.sessions)
    failed = sum(s.failed + s.errors for s in records.sessions)
    skipped = sum(s.skipped for s in records.sessions)
    out += ["", f"suite: {passed} passed, {failed} failed, {skipped} skipped"]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=Path, default=RECORDS)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--budget", type=Path, default=BUDGET)
    parser.add_argument("--started", type=float, help="the run's start (epoch seconds)")
    args = parser.parse_args(argv)
    if not args.records.is_dir() or not any(args.records.glob("*.session.json")):
        print(f"No time table: nothing recorded in {args.records} (pytest --time-table=LABEL).")
        return 2
    ended = time.time() if args.started is not None else None
    lines = table(read_records(args.records), read_budget(args.budget), args.started, ended)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"== the suite's time table (also in {args.out}) ==")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
