"""The suite's time table, recorded: what each test cost and which expensive steps it waited for.

``pytest --time-table=LABEL`` (``make test`` gives each of its three pytest runs a label:
``machine``, ``unit-6.1``, ``unit-5.5``) writes, into ``build/test-times/``:

- ``LABEL.<process>.json``, one per process that ran tests (the pytest process, or each
  pytest-xdist worker): each test's node ID, folder, outcome, set-up, call and tear-down
  seconds, start and end (``time.time()``), the CPU seconds of that process and of the
  processes it reaped during the test, and the machine's CPU seconds meanwhile
  (``/proc/stat``, so whatever ran beside is in it too);
- ``LABEL.<process>.steps.jsonl``, the expensive steps (cluster starts, Kueue deploys,
  image builds, hub starts, Helm installs, Go builds) recorded by
  :mod:`gpuspawner_sandbox.suitecosts` in that process and its subprocesses;
- ``LABEL.session.json`` from the process that reports: the run's start, end, exit status
  and its passed, failed and skipped counts.

``scripts/test_times.py`` reads them all and writes the table (``build/test-times.md``).
Nothing here times a test against a limit: the table measures, the budget is read by
people (docs/benchmarks.md, "Suite budget").
"""

from __future__ import annotations

import json
import os
import resource
import time
from pathlib import Path

import pytest

from gpuspawner_sandbox import suitecosts

#: Where the records go; ``GPUSPAWNER_TEST_TIMES_DIR`` moves them (the time table's own tests).
OUT = Path(
    os.environ.get("GPUSPAWNER_TEST_TIMES_DIR")
    or Path(__file__).resolve().parent.parent / "build" / "test-times"
)
_CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def machine_cpu_seconds() -> float:
    """All CPUs' busy seconds since boot (``/proc/stat``: every field but idle and iowait)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return 0.0
    # user nice system idle iowait irq softirq steal (guest time is already in user)
    busy = sum(fields[:3]) + sum(fields[5:8])
    return busy / _CLOCK_TICKS


def own_cpu_seconds() -> float:
    """This process's CPU seconds and those of the children it has reaped."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def folder_of(nodeid: str) -> str:
    """The test folder a node ID is in: ``tests/e2e/test_x.py::t`` -> ``e2e``; a module
    directly in ``tests/`` -> ``tests``."""
    parts = nodeid.split("::", 1)[0].split("/")
    if len(parts) >= 3 and parts[0] == "tests":
        return parts[1]
    return "tests"


class TimeTable:
    """The pytest plugin: one per process, writing that process's records at its end."""

    def __init__(self, label: str, out: Path = OUT) -> None:
        self.label = label
        self.out = out
        self.tests: dict[str, dict] = {}
        self.started = time.time()
        self.process = "main"

    def pytest_configure(self, config: pytest.Config) -> None:
        worker = getattr(config, "workerinput", None)
        if worker is not None:
            self.process = worker["workerid"]
        self.out.mkdir(parents=True, exist_ok=True)
        # The expensive steps of this process and of every subprocess it starts.
        os.environ[suitecosts.ENV] = str(self.out / f"{self.label}.{self.process}.steps.jsonl")

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem):
        record = {
            "nodeid": item.nodeid,
            "folder": folder_of(item.nodeid),
            "outcome": "passed",
            "setup": 0.0,
            "call": 0.0,
            "teardown": 0.0,
            "start": time.time(),
        }
        self.tests[item.nodeid] = record
        own, machine = own_cpu_seconds(), machine_cpu_seconds()
        yield
        record["end"] = time.time()
        record["own_cpu"] = round(own_cpu_seconds() - own, 3)
        record["machine_cpu"] = round(machine_cpu_seconds() - machine, 3)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        record = self.tests.get(report.nodeid)
        if record is None or "end" in record:  # another process's report (xdist's controller)
            return
        record[report.when] = round(report.duration, 3)
        if report.failed:
            record["outcome"] = "failed"
        elif report.skipped and record["outcome"] == "passed":
            record["outcome"] = "skipped"

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self.tests:
            path = self.out / f"{self.label}.{self.process}.json"
            path.write_text(json.dumps({"label": self.label, "tests": list(self.tests.values())}))
        if self.process != "main":
            return
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        stats = getattr(reporter, "stats", {}) if reporter is not None else {}

        summary = {
            "label": self.label,
            "start": self.started,
            "end": time.time(),
            "exitstatus": int(exitstatus),
            "passed": len([r for r in stats.get("passed", []) if r.when == "call"]),
            "failed": len(stats.get("failed", [])),
            "errors": len(stats.get("error", [])),
            "skipped": len(stats.get("skipped", [])),
        }
        (self.out / f"{self.label}.session.json").write_text(json.dumps(summary))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--time-table",
        metavar="LABEL",
        default=None,
        help="record each test's time and the expensive steps it waited for in "
        "build/test-times/LABEL.* (scripts/test_times.py makes the table)",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the time table when ``--time-table`` names a label (tests/conftest.py
    calls this; ``-p tests.timetable`` loads it as a plugin elsewhere)."""
    label = config.getoption("--time-table", default=None)
    if label:
        config.pluginmanager.register(TimeTable(label), "gpuspawner-time-table")
