"""The suite's time table (tests/timetable.py, scripts/test_times.py), the second JupyterHub
line's selection (tests/jupyterhub_line.py) and the machine tests' ID comparison
(scripts/compare_test_ids.py)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from tests import jupyterhub_line, timetable
from tests.conftest import REPO


def _script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


test_times = _script("test_times")
compare_test_ids = _script("compare_test_ids")


# -- the plugin, in a pytest run of its own ------------------------------------------------

SAMPLE_TESTS = """
import os, time, pytest
from gpuspawner_sandbox import suitecosts

@pytest.fixture
def cluster():
    with suitecosts.step(suitecosts.REAL_NODES, "a, b"):
        time.sleep(0.05)
    yield

def test_waits_for_a_cluster(cluster):
    pass

def test_fails():
    assert False

@pytest.mark.skip(reason="not here")
def test_skipped():
    pass
"""


def run_with_time_table(
    tmp_path: Path, label: str | None, source: str = SAMPLE_TESTS
) -> subprocess.CompletedProcess:
    """pytest on ``source`` with the time table's plugin, asked for ``label`` (or not)."""
    (tmp_path / "test_sample.py").write_text(source)
    env = {
        **os.environ,
        "GPUSPAWNER_TEST_TIMES_DIR": str(tmp_path / "records"),
        "PYTHONPATH": str(REPO),
    }
    env.pop("GPUSPAWNER_SUITE_COSTS", None)
    asked = [f"--time-table={label}"] if label else []
    plugins = ["-p", "tests.timetable", "-p", "no:cacheprovider"]
    return subprocess.run(
        [sys.executable, "-m", "pytest", *plugins, *asked, "-q", str(tmp_path / "test_sample.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_run_records_each_test_its_steps_and_its_counts(tmp_path):
    proc = run_with_time_table(tmp_path, "machine")
    assert proc.returncode == 1, proc.stdout  # one test fails on purpose
    records = tmp_path / "records"
    session = json.loads((records / "machine.session.json").read_text())
    assert (session["passed"], session["failed"], session["skipped"]) == (1, 1, 1)
    assert session["exitstatus"] == 1 and session["end"] >= session["start"]
    tests = {
        t["nodeid"].rsplit("::", 1)[1]: t
        for t in json.loads((records / "machine.main.json").read_text())["tests"]
    }
    assert tests["test_fails"]["outcome"] == "failed"
    assert tests["test_skipped"]["outcome"] == "skipped"
    waited = tests["test_waits_for_a_cluster"]
    assert waited["outcome"] == "passed" and waited["setup"] >= 0.05
    (step,) = [
        json.loads(line) for line in (records / "machine.main.steps.jsonl").read_text().splitlines()
    ]
    assert step["kind"] == "real nodes start" and step["what"] == "a, b" and step["ok"]
    assert waited["start"] <= step["start"] <= waited["end"]

    # the table attaches the step to the test that waited for it, and counts the run
    table = "\n".join(
        test_times.table(test_times.read_records(records), {"machine": {"tests": 60.0}})
    )
    (slow,) = [line for line in table.splitlines() if "test_waits_for_a_cluster" in line]
    assert "real nodes start (a, b)" in slow
    assert "| real nodes start | 1 |" in table
    assert table.splitlines()[-1] == "suite: 1 passed, 1 failed, 1 skipped"


def test_without_the_option_nothing_is_recorded(tmp_path):
    proc = run_with_time_table(tmp_path, None, "def test_one():\n    pass\n")
    assert proc.returncode == 0, proc.stdout
    assert not (tmp_path / "records").exists()


def test_folders_are_the_first_level_under_tests():
    assert timetable.folder_of("tests/e2e/test_kueue.py::test_x[a/b]") == "e2e"
    assert timetable.folder_of("tests/test_docs.py::test_y") == "tests"


# -- the table, from records ----------------------------------------------------------------


def _test(nodeid: str, seconds: float, *, line: str = "machine", start: float = 0.0):
    return test_times.Test(
        nodeid=nodeid,
        line=line,
        process="main",
        folder=timetable.folder_of(nodeid),
        outcome="passed",
        setup=seconds / 2,
        call=seconds / 2,
        teardown=0.0,
        start=start,
        end=start + seconds,
        own_cpu=1.0,
        machine_cpu=2.0,
    )


def _session(label: str, passed: int, failed: int = 0):
    return test_times.Session(label, 0.0, 100.0, 1 if failed else 0, passed, failed, 0, 0)


def test_a_folder_over_its_budget_is_flagged_in_the_last_lines():
    tests = [_test("tests/e2e/test_a.py::t", 700), _test("tests/e2e/test_b.py::t", 400, start=700)]
    records = test_times.Records([_session("machine", 2)], tests, [])
    lines = test_times.table(records, {"machine": {"e2e": 900.0}})
    assert "OVER BUDGET: machine e2e: 18:20 against 15:00 (tests/suite-budget.toml)" in lines[-3:]
    assert lines[-1] == "suite: 2 passed, 0 failed, 0 skipped"
    within = test_times.table(records, {"machine": {"e2e": 1200.0}})
    assert "Suite budget: every folder within its budget." in within[-3:]


def test_a_folder_without_a_budget_is_named():
    records = test_times.Records(
        [_session("unit-6.1", 1)], [_test("tests/newfolder/test_a.py::t", 1, line="unit-6.1")], []
    )
    lines = test_times.table(records, {"unit": {}})
    assert any(line.startswith("NO BUDGET: unit-6.1 newfolder") for line in lines)


def test_both_unit_lines_share_the_unit_budget():
    figures = test_times.folder_figures(
        [
            _test("tests/core/test_a.py::t", 30, line="unit-5.5"),
            _test("tests/core/test_a.py::t", 50, line="unit-6.1"),
        ],
        {"unit": {"core": 40.0}},
    )
    assert [(f.line, f.over) for f in figures] == [("unit-5.5", False), ("unit-6.1", True)]


def test_a_step_goes_to_the_test_of_its_own_process_running_when_it_began():
    a = _test("tests/e2e/test_a.py::t", 10, start=0)
    b = _test("tests/e2e/test_b.py::t", 10, start=10)
    other = _test("tests/e2e/test_c.py::t", 20, start=0)
    other.process = "gw1"
    step = test_times.Step("Kueue deploy", "preemption off", 12.0, 19.0, True, "machine", "main")
    test_times.attach_steps([a, b, other], [step])
    assert (a.steps, b.steps, other.steps) == ([], [step], [])
    assert test_times.waited_for(b) == "Kueue deploy (preemption off) 7 s"


def test_the_committed_budget_names_every_folder_of_the_suite():
    budget = test_times.read_budget(REPO / "tests" / "suite-budget.toml")
    folders = {
        p.name for p in (REPO / "tests").iterdir() if p.is_dir() and (p / "__init__.py").is_file()
    }
    machine = {"sandbox", "images", "z2jh", "e2e", "benchmarks"}
    assert set(budget["machine"]) == machine
    assert set(budget["unit"]) == (folders - machine - {"fixtures"}) | {"tests"}


# -- the second JupyterHub line runs only what depends on it --------------------------------


def test_pure_modules_run_once_and_hub_modules_on_both_lines():
    assert not jupyterhub_line.depends_on_the_line(REPO / "tests" / "core" / "test_catalog.py")
    assert jupyterhub_line.depends_on_the_line(REPO / "tests" / "hub" / "test_spawner.py")
    # its conftest starts a jupyterhub for the folder's tests
    assert jupyterhub_line.depends_on_the_line(REPO / "tests" / "hub" / "test_pages.py")
    # subprocesses the import graph cannot see
    assert jupyterhub_line.depends_on_the_line(REPO / "tests" / "test_docs.py")
    assert not jupyterhub_line.depends_on_the_line(REPO / "tests" / "test_packaging.py")


# -- no machine test lost --------------------------------------------------------------------


def test_a_gone_test_must_be_listed_where_it_moved():
    before = ["tests/e2e/test_a.py::t1", "tests/e2e/test_a.py::t2"]
    after = ["tests/e2e/test_a.py::t1", "tests/e2e/test_b.py::t2", "tests/e2e/test_c.py::new"]
    gone, new, broken = compare_test_ids.compare(before, after, {})
    assert gone == ["tests/e2e/test_a.py::t2"] and broken == []
    assert new == ["tests/e2e/test_b.py::t2", "tests/e2e/test_c.py::new"]
    moved = {"tests/e2e/test_a.py::t2": "tests/e2e/test_b.py::t2"}
    assert compare_test_ids.compare(before, after, moved)[0] == []
    wrong = {"tests/e2e/test_a.py::t2": "tests/e2e/test_z.py::t2"}
    assert compare_test_ids.compare(before, after, wrong)[2] == [
        "tests/e2e/test_a.py::t2 -> tests/e2e/test_z.py::t2"
    ]
