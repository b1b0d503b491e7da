"""Every benchmark runs once in its smoke mode, and one cut short leaves nothing running.

No test ran the benchmarks, so a sandbox helper's rename broke
``benchmarks/sandbox_spawn.py`` half-way, after its nodes, Prometheus and two hubs
had started; they kept running, and the machine stayed claimed. Here each script
in ``benchmarks/`` runs as its own process with ``--smoke`` (every step once,
small), under ``reaper.py``, which reports every process the benchmark left
behind. A run passes when it exits 0, went through each of its steps, printed
its result lines and left nothing: no process, no record of running nodes or
control plane, no machine claim of its own, and (for real nodes) the host as it
was. ``--fail-after`` makes a run fail on purpose half-way (an exception, SIGTERM,
SIGINT), to show that its teardown runs on those paths too.

The benchmarks on real nodes run with the machine tests (Makefile,
MACHINE_TESTS); so do the others, which are quick.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuspawner_sandbox import controlplane, hoststate, machineclaim, nodeconfig, nodes, testing
from gpuspawner_sandbox.lifetime import alive, dying_with_us
from gpuspawner_sandbox.topology import load_topology

REPO = Path(__file__).resolve().parents[2]
BENCHMARKS = REPO / "benchmarks"
REAPER = Path(__file__).with_name("reaper.py")


def _benchlib():
    spec = importlib.util.spec_from_file_location("benchlib", BENCHMARKS / "benchlib.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


benchlib = _benchlib()

#: Each benchmark's steps in order (its --fail-after choices): a smoke run goes through all.
STEPS = {
    "spawn_overhead.py": [],
    "culler_pass.py": ["prometheus", "hub", "servers", "measured"],
    "inventory.py": ["inventory", "forms", "naive", "api-loaded", "api"],
    "real_nodes.py": ["control-plane", "nodes", "idle", "pods"],
    "sandbox_spawn.py": ["cluster", "hubs", "warm-up", "rounds", "burst-sent", "burst"],
    "kueue_spawn.py": [
        "cluster",
        "hubs",
        "warm-up",
        "rounds",
        "burst-hub-queue",
        "burst-sent",
        "burst-kueue",
    ],
    "jupyter_start_cpu.py": ["engine", "hub", "runs"],
    "admin_usage.py": ["build", "measured"],
    "usage_store.py": ["build", "sqlite", "postgres"],
}

#: Exit status of a run failed on purpose, by --fail-with.
FAILED_WITH = {"error": 1, "sigterm": 128 + 15, "sigint": 128 + 2}

#: Only a guard against a hung run (its timeout then stops it with SIGTERM); the
#: first run on a fresh clone may build the control plane, node components and
#: notebook image on the way.
HUNG_AFTER_S = 45 * 60


@dataclass
class Run:
    returncode: int
    stdout: str
    stderr: str
    #: processes the benchmark left running: {"pid", "cmdline"} each (reaper.py)
    left: list[dict]

    @property
    def steps(self) -> list[str]:
        return [
            line[len(benchlib.STEP_DONE) :]
            for line in self.stderr.splitlines()
            if line.startswith(benchlib.STEP_DONE)
        ]

    @property
    def work_dirs(self) -> list[Path]:
        return [
            Path(line[len(benchlib.WORK_DIR) :])
            for line in self.stderr.splitlines()
            if line.startswith(benchlib.WORK_DIR)
        ]

    def explain(self) -> str:
        return f"exit {self.returncode}\nstdout:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-6000:]}"


def run_benchmark(tmp_path: Path, script: str, *args: str) -> Run:
    """Run ``benchmarks/<script> --smoke <args>`` under the reaper (the ``bench`` fixture's)."""
    report = tmp_path / "left.json"
    report.unlink(missing_ok=True)
    command = [sys.executable, str(BENCHMARKS / script), "--smoke", *args]
    proc = subprocess.Popen(
        [sys.executable, str(REAPER), str(report), "--", *command],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A test run that ends early (an xdist worker killed) tells the reaper, which
        # passes SIGTERM on: the benchmark still stops what it started.
        preexec_fn=dying_with_us(),
    )
    try:
        stdout, stderr = proc.communicate(timeout=HUNG_AFTER_S)
    except subprocess.TimeoutExpired:
        proc.terminate()  # passed on: the benchmark stops what it started
        try:
            stdout, stderr = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            proc.kill()
            stdout, stderr = proc.communicate()
        pytest.fail(f"{script} hung; stderr:\n{stderr[-6000:]}")
    left = json.loads(report.read_text()) if report.exists() else [{"report": "missing"}]
    return Run(proc.returncode, stdout, stderr, left)


def mounted_under(path: Path) -> bool:
    prefix = str(path).rstrip("/") + "/"
    return any(
        line.split(" ")[4].startswith(prefix)
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
    )


@pytest.fixture
def bench(tmp_path):
    """``bench(script, *args)`` runs a benchmark's smoke run; its state is kept with the test's."""
    runs: list[Run] = []

    def run(script: str, *args: str) -> Run:
        runs.append(run_benchmark(tmp_path, script, *args))
        return runs[-1]

    yield run
    # The benchmarks keep their state (logs, etcd's data) in /tmp, where they said; moved
    # here, pytest prunes it with its own temporary directories after a few runs.
    for done in runs:
        for work in done.work_dirs:
            if work.exists() and not mounted_under(work):
                shutil.move(work, tmp_path / work.name)


def host_snapshot(cgroup_roots: list[str], state_root: Path = Path("/nonexistent")) -> dict:
    """What real nodes change on the host, less the listing of the state directory."""
    snap = hoststate.snapshot(state_root, cgroup_roots)
    snap.pop("state_root")
    return snap


def assert_nothing_left(
    run: Run, before: dict | None = None, cgroup_roots: Sequence[str] = ()
) -> None:
    """No process, record or claim of the run is left; with ``before``, the host is as it was."""
    assert run.left == [], f"left running: {run.left}\n{run.explain()}"
    for work in run.work_dirs:
        assert testing.processes_mentioning(str(work)) == [], run.explain()
        records = [
            *work.glob(f"**/{nodes.STATE_FILE}"),
            *work.glob(f"**/{controlplane.STATE_FILE}"),
        ]
        # What a new start reads to refuse ("may still run", "still running").
        assert records == [], run.explain()
    claim = machineclaim.read_claim()
    assert claim is None or not any(
        Path(claim.state_dir).is_relative_to(work) for work in run.work_dirs
    ), f"the machine is still claimed: {claim}"
    if before is not None:
        assert run.work_dirs, run.explain()
        after = host_snapshot(list(cgroup_roots), run.work_dirs[0])
        assert hoststate.differences(before, after) == [], run.explain()


def assert_smoke_run(run: Run, script: str, lines: list[str]) -> None:
    assert run.returncode == 0, run.explain()
    assert run.steps == STEPS[script], run.explain()
    for line in lines:
        assert line in run.stdout, f"{line!r} missing\n{run.explain()}"


def table_rows(stdout: str) -> dict[str, list[str]]:
    """A Markdown table's rows by their first cell."""
    rows = {}
    for line in stdout.splitlines():
        if line.startswith("| ") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells[1:]
    return rows


def default_topology_roots() -> list[str]:
    return [nodeconfig.cgroup_root(n.name) for n in load_topology(None).nodes]


def require_prometheus() -> None:
    from tests.culler.promserver import require_prometheus as required

    required()


# -- the reaper, which the other tests rely on to see leaks ------------------------------------


def test_the_reaper_reports_and_ends_what_a_command_leaves(tmp_path):
    report = tmp_path / "left.json"
    # The sleep outlives the shell that started it in the background.
    result = subprocess.run(
        [sys.executable, str(REAPER), str(report), "--", "sh", "-c", "sleep 600 & exit 3"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 3, result.stderr
    left = json.loads(report.read_text())
    assert [entry["cmdline"] for entry in left] == ["sleep 600"]
    assert not alive(left[0]["pid"])


def test_the_reaper_reports_nothing_for_a_command_that_ends_its_children(tmp_path):
    report = tmp_path / "left.json"
    result = subprocess.run(
        [sys.executable, str(REAPER), str(report), "--", "sh", "-c", "sleep 600 & kill $!; wait"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(report.read_text()) == []


# -- smoke runs ----------------------------------------------------------------------------


def test_spawn_overhead(bench):
    run = bench("spawn_overhead.py")
    assert_smoke_run(
        run,
        "spawn_overhead.py",
        [
            "| form: profile list + KubeSpawner form render |",
            "| validate: resolve options + check limits |",
            "| spawn prep, GPUSpawner (options, limits, pod manifest) |",
            "| spawn prep, KubeSpawner (equivalent profile, pod manifest) |",
            "| spawn prep, GPUSpawner, user in a group pool (reads all 200 pods) |",
            "| spawn prep, GPUSpawner, user with a GPU-hours budget (1,000 intervals in SQLite) |",
            "| budget: the usage store's read alone (one user, this week) |",
            "Added per spawn (median GPUSpawner - median KubeSpawner):",
            "Added by the budget per spawn (median with a budget - median without):",
        ],
    )
    assert_nothing_left(run)


def test_culler_pass(bench):
    require_prometheus()
    run = bench("culler_pass.py")
    assert_smoke_run(
        run,
        "culler_pass.py",
        ["20 users each with a running server; 4 of them with GPU series in Prometheus"],
    )
    rows = table_rows(run.stdout)
    # One pass: hub API requests and Prometheus queries per culler (a constant 2 with it).
    assert rows["gpuspawner-culler, with Prometheus"][1:] == ["1", "2"], run.explain()
    assert rows["gpuspawner-culler, without Prometheus"][1:] == ["1", "0"], run.explain()
    assert rows["jupyterhub-idle-culler 2.0, page size 50 (default)"][2] == "0"
    assert rows["jupyterhub-idle-culler 2.0, page size 200"][2] == "0"
    assert "- gpuspawner-culler saw 20 servers" in run.stdout, run.explain()
    assert_nothing_left(run)


def test_inventory_with_the_api_server(bench, pytestconfig):
    testing.control_plane_binary(pytestconfig)  # built first; skipped (failed in CI) without Go
    run = bench("inventory.py", "--api")
    assert_smoke_run(
        run,
        "inventory.py",
        [
            # The CPU-only pods are dropped as they arrive.
            "Cluster: 20 GPU nodes, 200 pods (90 holding GPUs, 10 waiting for GPUs, 100 "
            "CPU-only); kept by the inventory: 20 nodes, 100 pods.",
            "| form render after a pod change (ms) |",
            "| naive per request: list nodes+pods from the API server, compute (ms) |",
            "(loading the objects into the sandbox API server took",
        ],
    )
    assert_nothing_left(run)


def test_real_nodes(bench, pytestconfig):
    testing.node_binaries(
        pytestconfig
    )  # built first; skipped (failed in CI) where nodes cannot run
    roots = [nodeconfig.cgroup_root("bench-0")]
    before = host_snapshot(roots)
    run = bench("real_nodes.py", "--machine-wait", str(testing.MACHINE_WAIT))
    assert_smoke_run(
        run,
        "real_nodes.py",
        ["Per running pod (1 `sleep` pods on bench-0; shim + pause + container):"],
    )
    assert "bench-0" in table_rows(run.stdout), run.explain()
    assert_nothing_left(run, before, roots)


def test_sandbox_spawn(bench, pytestconfig):
    testing.node_binaries(pytestconfig)
    require_prometheus()
    roots = default_topology_roots()
    before = host_snapshot(roots)
    run = bench("sandbox_spawn.py", "--machine-wait", str(testing.MACHINE_WAIT))
    assert_smoke_run(
        run,
        "sandbox_spawn.py",
        [
            "Ratio of medians GPUSpawner / KubeSpawner:",
            "3 users at once (5 requests, 2 of them a second GPU server beyond the limit):",
            "- memory per running notebook on cpu-0 (its node's processes, RSS):",
        ],
    )
    rows = table_rows(run.stdout)
    assert rows["GPUSpawner (limits, nvidia-smi check)"][2] == "1", run.explain()
    assert rows["KubeSpawner (hand-written GPU settings)"][2] == "1", run.explain()
    # Both GPU users asked for a second GPU server at once: the limit of 1 held.
    assert re.search(r"refused by limit: 2,", run.stdout), run.explain()
    assert "most GPUs held by one user: 1" in run.stdout, run.explain()
    assert_nothing_left(run, before, roots)


def test_kueue_spawn(bench, pytestconfig):
    """Kueue's admission latency and a burst through it, against the hub's own queue (issue 31)."""
    testing.node_binaries(pytestconfig)
    require_prometheus()
    roots = default_topology_roots()
    before = host_snapshot(roots)
    run = bench("kueue_spawn.py", "--machine-wait", str(testing.MACHINE_WAIT))
    assert_smoke_run(
        run,
        "kueue_spawn.py",
        [
            "Added by Kueue's admission (median Kueue - median hub's queue):",
            "4 users at once on each hub in turn, 1 GPU each",
        ],
    )
    rows = table_rows(run.stdout)
    assert rows["hub's own queue (gpu_queue_enabled)"][2] == "1", run.explain()
    assert rows["Kueue (kueue_queue = gpu-notebooks)"][2] == "1", run.explain()
    # Kueue gated the Kueue hub's pod and lifted the gate: the watch timed it.
    gate = rows["Kueue's admission alone: pod created -> admission gate removed"]
    assert gate[2] == "1" and float(gate[0]) > 0, run.explain()
    # Every user of both hubs is accounted for, and each got a server.
    assert rows["ready"] == ["4", "4"], run.explain()
    assert rows["refused"] == ["0", "0"] and rows["failed"] == ["0", "0"], run.explain()
    assert float(rows["CPU-s per start: Kueue's manager pod"][1]) > 0, run.explain()
    assert_nothing_left(run, before, roots)


def test_usage_store(bench):
    """The usage store's budget reads and summaries on SQLite and a real PostgreSQL, measured."""
    run = bench("usage_store.py", "--postgres")
    line = "| summary + table: the last 12 whole months by user (the page's whole figure) |"
    assert_smoke_run(run, "usage_store.py", [line])
    assert run.stdout.count(line) == 2, run.explain()  # SQLite, then PostgreSQL
    for row in [r for r in run.stdout.splitlines() if r.startswith("| summary")]:
        assert float(row.split("|")[2]) > 0, run.explain()
    assert_nothing_left(run)


def test_admin_usage(bench):
    """The GPU page's usage section over usage_store.py's store, each view measured."""
    run = bench("admin_usage.py")
    assert_smoke_run(run, "admin_usage.py", ["| the last 12 whole months, by user |"])
    rows = table_rows(run.stdout)
    assert rows["this week, by user (the default view)"][0] == "20", run.explain()
    assert all(float(cells[-1]) > 0 for name, cells in rows.items() if name != "case")
    assert_nothing_left(run)


def test_jupyter_start_cpu(bench, matrix_jupyter_image):
    """One start of the jupyter stage on the image tests' private engine, measured."""
    run = bench("jupyter_start_cpu.py")
    assert_smoke_run(run, "jupyter_start_cpu.py", ["| image | container CPU-s, median |"])
    cells = table_rows(run.stdout)[matrix_jupyter_image]
    assert float(cells[0]) > 0 and float(cells[3]) > 0, run.explain()
    assert cells[-1] == "1", run.explain()
    assert_nothing_left(run)


@pytest.fixture
def matrix_jupyter_image() -> str:
    from gpuspawner.images.matrix import load_matrix
    from gpuspawner.images.plan import image_ref

    matrix = load_matrix(REPO / "images" / "matrix.yaml")
    return image_ref(matrix, next(iter(matrix.images.values())), stage="jupyter")


# -- runs cut short ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("script", "args", "step", "how"),
    [
        # The reported crash's place: the cluster and both hubs up. SIGTERM while the
        # burst's requests are in flight: pods starting, threads waiting on the hub.
        pytest.param("sandbox_spawn.py", [], "burst-sent", "sigterm", id="sandbox_spawn-sigterm"),
        pytest.param("real_nodes.py", [], "nodes", "error", id="real_nodes-error"),
        # Kueue deployed on the nodes and both hubs up: all of it goes with the nodes.
        pytest.param("kueue_spawn.py", [], "hubs", "error", id="kueue_spawn-error"),
        pytest.param("culler_pass.py", [], "hub", "sigint", id="culler_pass-sigint"),
        pytest.param("inventory.py", ["--api"], "api-loaded", "error", id="inventory-error"),
        # The private dockerd and the stand-in hub up.
        pytest.param("jupyter_start_cpu.py", [], "hub", "sigterm", id="jupyter_start_cpu-sigterm"),
    ],
)
def test_a_run_cut_short_leaves_nothing_running(bench, pytestconfig, script, args, step, how):
    roots: list[str] | None = None  # the real nodes' cgroups, where the run starts nodes
    if script in ("sandbox_spawn.py", "kueue_spawn.py"):
        roots = default_topology_roots()
    elif script == "real_nodes.py":
        roots = [nodeconfig.cgroup_root("bench-0")]
    if roots is not None:
        testing.node_binaries(pytestconfig)
        args = [*args, "--machine-wait", str(testing.MACHINE_WAIT)]
    if script == "inventory.py":
        testing.control_plane_binary(pytestconfig)
    if script in ("sandbox_spawn.py", "kueue_spawn.py", "culler_pass.py"):
        require_prometheus()
    before = host_snapshot(roots) if roots is not None else None
    run = bench(script, *args, "--fail-after", step, "--fail-with", how)
    assert run.returncode == FAILED_WITH[how], run.explain()
    steps = STEPS[script]
    assert run.steps == steps[: steps.index(step) + 1], run.explain()
    assert "| " not in run.stdout, run.explain()  # no results from a run cut short
    if how == "error":
        assert "InjectedFailure: --fail-after" in run.stderr, run.explain()
    else:
        assert f"Stopped by {how.upper()}; what the benchmark started is stopped." in run.stderr
    assert_nothing_left(run, before, roots or ())
