"""gpuspawner-sandbox up|down|status: readable answers, no tracebacks, nothing left behind."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gpuspawner_sandbox import cli, hoststate, nodeconfig, nodes, testing


def test_status_when_nothing_runs(tmp_path, capsys):
    assert cli.main(["--state-dir", str(tmp_path), "status"]) == 3
    assert "Not running" in capsys.readouterr().out


def test_down_when_nothing_runs(tmp_path, capsys):
    assert cli.main(["--state-dir", str(tmp_path), "down"]) == 0
    assert "Nothing was running" in capsys.readouterr().out


def test_down_never_signals_a_stranger_with_a_recorded_pid(tmp_path, capsys):
    # A pid recorded by an old sandbox may have been reused by an unrelated
    # process: `down` must leave that one alone.
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        state = {"api_url": "https://127.0.0.1:1", "admin_kubeconfig": "x", "ports": {}}
        state["pids"] = {"etcd": stranger.pid}
        (tmp_path / "controlplane.json").write_text(json.dumps(state))
        assert cli.main(["--state-dir", str(tmp_path), "status"]) == 1
        assert "etcd" in capsys.readouterr().out
        assert cli.main(["--state-dir", str(tmp_path), "down"]) == 0
        assert stranger.poll() is None
        assert not (tmp_path / "controlplane.json").exists()
    finally:
        stranger.kill()
        stranger.wait()


def run_as_printed(out: str) -> subprocess.CompletedProcess:
    """The printed ``export KUBECONFIG=…`` and ``… get nodes`` lines, run in a shell as typed."""
    lines = [
        line
        for line in out.splitlines()
        if line.startswith("export KUBECONFIG=") or line.endswith(" get nodes")
    ]
    assert len(lines) == 2, out
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    return subprocess.run(
        ["sh", "-c", "\n".join(lines)], capture_output=True, text=True, timeout=120, env=env
    )


def test_up_control_plane_only_status_down_leave_no_process(control_plane_binary, tmp_path, capsys):
    state = tmp_path / "state"
    try:
        assert cli.main(["--state-dir", str(state), "up", "--no-kubelet"]) == 0
        out = capsys.readouterr().out
        assert f"export KUBECONFIG={state / 'admin.kubeconfig'}" in out
        assert "Ready in" not in out  # no nodes
        # the venv's kubectl, as printed, reaches the API server: no nodes yet
        shown = run_as_printed(out)
        assert shown.returncode == 0 and "No resources found" in shown.stderr, shown

        assert cli.main(["--state-dir", str(state), "status"]) == 0
        status = capsys.readouterr().out
        for name in ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager"):
            assert f"{name} " in status
        assert "NOT RUNNING" not in status
        assert testing.processes_mentioning(str(state))

        # `up` again must not start a second sandbox over the first.
        assert cli.main(["--state-dir", str(state), "up", "--no-kubelet"]) == 1
        assert "already running" in capsys.readouterr().out
    finally:
        assert cli.main(["--state-dir", str(state), "down"]) == 0
    stopped = capsys.readouterr().out
    assert stopped.startswith("Stopped ") and "kube-apiserver" in stopped, stopped
    deadline = time.monotonic() + 10  # reparented components are reaped by init
    while testing.processes_mentioning(str(state)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert testing.processes_mentioning(str(state)) == []
    assert cli.main(["--state-dir", str(state), "status"]) == 3


def test_up_status_down(pytestconfig, tmp_path, capsys):
    """`up` runs the topology's nodes for real, a GPU node with its device plugin;
    `down` restores the host."""
    testing.node_binaries(pytestconfig)  # skips (fails in CI) without root, Go or runc
    topology = tmp_path / "topology.yaml"
    topology.write_text(
        "nodes:\n"
        "  - {name: cli-gpu-0, gpu: {model: A100-SXM4-80GB, count: 1}}\n"
        "  - {name: cli-cpu-0}\n"
    )
    state = tmp_path / "state"
    roots = [nodeconfig.cgroup_root(n) for n in ("cli-gpu-0", "cli-cpu-0")]
    before = hoststate.snapshot(state / "nodes", roots)
    try:
        args = ["--state-dir", str(state), "up", "--topology", str(topology)]
        args += ["--device-list-strategy", "cdi-cri"]
        assert cli.main(args) == 0
        out = capsys.readouterr().out
        assert "cli-gpu-0 Ready in" in out and "cli-cpu-0 Ready in" in out
        exporter = nodes.read_state(state)["nodes"]["cli-gpu-0"]["dcgm_exporter"]
        assert f"DCGM metrics at http://{exporter}/metrics" in out

        assert cli.main(["--state-dir", str(state), "status"]) == 0
        status = capsys.readouterr().out
        for part in ("holder", "containerd", "kubelet"):
            assert f"cli-cpu-0/{part} " in status
            assert f"cli-gpu-0/{part} " in status
        assert "cli-gpu-0/device-plugin " in status
        assert "cli-cpu-0/device-plugin" not in status
        assert "cli-gpu-0/dcgm-exporter " in status
        assert "cli-cpu-0/dcgm-exporter" not in status
        # `status` prints the lines again; as typed, the venv's kubectl lists both nodes
        shown = run_as_printed(status)
        assert shown.returncode == 0, shown.stderr
        rows = [line.split() for line in shown.stdout.splitlines()[1:]]
        assert {row[0]: row[1] for row in rows} == {"cli-gpu-0": "Ready", "cli-cpu-0": "Ready"}
        plugin = nodes.read_state(state)["nodes"]["cli-gpu-0"]["pids"]["device-plugin"]
        cmdline = Path(f"/proc/{plugin}/cmdline").read_bytes().split(b"\0")
        assert b"--device-list-strategy=cdi-cri" in cmdline
        assert "NOT RUNNING" not in status
    finally:
        assert cli.main(["--state-dir", str(state), "down"]) == 0
    out = capsys.readouterr().out
    assert "Stopped the real nodes cli-gpu-0, cli-cpu-0 and restored the host." in out
    assert hoststate.differences(before, hoststate.snapshot(state / "nodes", roots)) == []
    assert cli.main(["--state-dir", str(state), "status"]) == 3


def test_up_without_root_is_one_sentence(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(cli.os, "geteuid", lambda: 1000)
    assert cli.main(["--state-dir", str(tmp_path), "up"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: real nodes need root") and err.count("\n") == 1
    assert list(tmp_path.iterdir()) == []  # nothing built, started or written
