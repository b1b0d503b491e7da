"""The service's configuration: file, flags, readable refusals, and the generated reference."""

from __future__ import annotations

import subprocess
import sys

import pytest
from traitlets.config import Config

from gpuspawner.clients.kube import NotFound, Refused
from gpuspawner.core import kueue
from gpuspawner.culler import policy
from gpuspawner.culler.app import GPUCuller

from ..conftest import REPO


def make(argv, **traits) -> GPUCuller:
    config = Config()
    config.GPUCuller.api_token = "t"
    config.GPUCuller.kubernetes = "off"
    for key, value in traits.items():
        setattr(config.GPUCuller, key, value)
    app = GPUCuller(config=config)
    app.initialize(argv)
    return app


def test_config_file_and_flags(tmp_path):
    path = tmp_path / "culler_config.py"
    path.write_text(
        "c.GPUCuller.cull_every = 5\n"
        'c.GPUCuller.timeouts = [{"min_gpus": 8, "timeout": 1800}, {"gpu_type": "none", "timeout": 28800}]\n'
        'c.GPUCuller.pressure_timeouts = {"h100": 600}\n'
        'c.GPUCuller.prometheus_url = "http://127.0.0.1:9"\n'
        'c.GPUCuller.pod_label = "exported_pod"\n'
    )
    app = make([f"--config={path}", "--dry-run", "--cull-every=7", "--GPUCuller.max_age=86400"])
    assert app.cull_every == 7  # the command line wins over the file
    assert app.dry_run is True
    assert [r.timeout for r in app.policy.rules] == [1800, 28800]
    assert app.policy.max_age == 86400
    assert app.policy.pressure_timeout_for("h100") == 600
    assert app.policy.pressure_timeout_for("a100") == 900  # pressure_timeout's default
    # the GPU window covers the longest timeout, so "idle for the whole window" is enough
    assert app.prometheus.queries.window == 28800
    assert "exported_pod" in app.prometheus.queries.fresh_query()
    assert app.pods is None  # kubernetes = off


def test_a_malformed_rule_stops_the_service_with_one_line(capfd):
    with pytest.raises(SystemExit) as e:
        make([], timeouts=[{"gpu_type": "a100", "timeout": "2h"}])
    assert e.value.code == 1
    lines = [line for line in capfd.readouterr().err.splitlines() if "CRITICAL" in line]
    assert len(lines) == 1 and "timeout must be seconds above 0" in lines[0], lines
    assert "Traceback" not in capfd.readouterr().err


def test_no_token_is_refused(capfd, monkeypatch):
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN", raising=False)
    with pytest.raises(SystemExit):
        make([], api_token="")
    assert "no API token" in capfd.readouterr().err


def test_module_and_console_script_answer_help():
    for command in (
        [sys.executable, "-m", "gpuspawner.culler", "--help"],
        [str(REPO / ".venv" / "bin" / "gpuspawner-culler"), "--help"]
        if (REPO / ".venv" / "bin" / "gpuspawner-culler").exists()
        else [sys.executable, "-m", "gpuspawner.culler", "--help-all"],
    ):
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert "--dry-run" in result.stdout


def test_z2jh_values_register_the_same_service_and_scopes():
    """The shipped configs wire the culler with gpuspawner.setup (tests/test_hubsetup.py
    shows each one's role and service); z2jh's own culler is off, and the chart keeps a
    token for ours."""
    import yaml

    from gpuspawner.culler.hubconfig import CULLER_SCOPES

    from .hubtools import shipped_culler_role

    assert shipped_culler_role()["scopes"] == list(CULLER_SCOPES)
    values = yaml.safe_load((REPO / "config" / "z2jh-values.yaml").read_text())
    assert "gpuspawner-culler" in values["hub"]["services"]
    assert "gpuspawner.setup(" in "".join(values["hub"]["extraConfig"].values())
    for forbidden in ("access:servers", "admin", "admin:users", "admin:servers"):
        assert forbidden not in CULLER_SCOPES
    assert values["cull"]["enabled"] is False  # one culler only


# --- Kueue's queue as demand (kueue_cluster_queues) ------------------------------

KUEUE_CATALOG = REPO / "tests" / "fixtures" / "catalogs" / "e2e.yaml"
A100_FLAVOR = {
    "metadata": {"name": "nvidia-a100-sxm4-80gb"},
    "spec": {"nodeLabels": {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}},
}


def gpu_queue(name: str) -> dict:
    return {
        "metadata": {"name": name},
        "spec": {
            "cohortName": "gpus",
            "resourceGroups": [
                {
                    "coveredResources": ["nvidia.com/gpu"],
                    "flavors": [
                        {
                            "name": "nvidia-a100-sxm4-80gb",
                            "resources": [{"name": "nvidia.com/gpu", "nominalQuota": 4}],
                        }
                    ],
                }
            ],
        },
    }


def job_workload(name: str, gpus: int, count: int = 1) -> dict:
    container = {"name": "c", "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
    return {
        "metadata": {"name": name, "namespace": "batch"},
        "spec": {
            "podSets": [
                {"name": "main", "count": count, "template": {"spec": {"containers": [container]}}}
            ]
        },
        "status": {"conditions": [{"type": "QuotaReserved", "status": "False"}]},
    }


def entry(
    name: str, position: int, kind: str = "Job", namespace: str = "batch"
) -> kueue.PendingEntry:
    return kueue.PendingEntry(namespace, name, kind, f"uid-{name}", "q", 100, position, position)


class FakeKueue:
    """KueueClient's reads, answered from dicts; ``fail`` raises it from every read."""

    def __init__(self, pending: dict, workloads: dict, fail: Exception | None = None):
        self.pending, self.workloads, self.fail = pending, workloads, fail
        self.reads: list[str] = []
        #: the ``limit`` of each read of pending workloads
        self.limits: list[int | None] = []
        #: namespaces whose Workloads may not be read (a namespaced Role only)
        self.refused: set[str] = set()

    def _read(self, what: str) -> None:
        self.reads.append(what)
        if self.fail is not None:
            raise self.fail

    async def resource_flavors(self):
        self._read("flavors")
        return [A100_FLAVOR]

    async def cluster_queue(self, name):
        self._read(f"cq {name}")
        if name not in self.pending:
            raise NotFound(f"ClusterQueue {name!r} not found", 404)
        return gpu_queue(name)

    async def pending_in_cluster_queue(self, name, limit=None):
        self._read(f"pending {name}")
        self.limits.append(limit)
        entries = sorted(self.pending[name], key=lambda e: e.position_in_cluster_queue)
        return entries if limit is None else entries[:limit]

    async def workload(self, namespace, name):
        self._read(f"workload {namespace}/{name}")
        if namespace in self.refused:
            raise Refused(f"workloads is forbidden in the namespace {namespace!r}", 403)
        if name not in self.workloads:
            raise NotFound(f"Workload {name!r} not found", 404)
        return self.workloads[name]


def kueue_culler(fake: FakeKueue, queues=("batch",)) -> GPUCuller:
    app = make(
        ["--log-level=INFO"], kueue_cluster_queues=list(queues), catalog_file=str(KUEUE_CATALOG)
    )
    app.pods = object()  # as if Kubernetes were read: Kueue comes through the fake
    app.kueue = fake
    return app


async def test_the_head_of_each_named_cluster_queue_is_demand_and_nothing_behind_it():
    fake = FakeKueue(
        {"batch": [entry("train", 0), entry("next", 1)]},
        {"train": job_workload("train", 4), "next": job_workload("next", 8)},
    )
    app = kueue_culler(fake)
    requests = await app._kueue_demand(app.catalog())
    assert requests == (policy.Request("a100", 4, "kueue"),)
    assert fake.reads == ["flavors", "cq batch", "pending batch", "workload batch/train"]
    assert fake.limits == [1]  # the head alone is read, however long the queue
    app._record_pressure([], policy.Pressure(requests), [])
    labels = {"gpu_type": "a100", "source": "kueue"}
    assert app.metrics.registry.get_sample_value("gpuspawner_culler_demand_gpus", labels) == 4


async def test_a_head_admitted_or_gone_since_the_list_is_no_demand():
    fake = FakeKueue({"batch": [entry("gone", 0)]}, {})
    app = kueue_culler(fake)
    assert await app._kueue_demand(app.catalog()) == ()


def logged(capfd, text: str) -> list[str]:
    return [line for line in capfd.readouterr().err.splitlines() if text in line]


async def test_kueue_failures_are_logged_once_counted_and_the_pass_goes_on(capfd):
    fake = FakeKueue({}, {}, fail=Refused("clusterqueues is forbidden", 403))
    app = kueue_culler(fake)
    for _ in range(3):
        assert await app._kueue_demand(app.catalog()) == ()
    errors = app.metrics.registry.get_sample_value(
        "gpuspawner_culler_errors_total", {"source": "kueue"}
    )
    assert errors == 3
    warned = logged(capfd, "Kueue's queue could not")
    assert len(warned) == 1 and "config/rbac-kueue.yaml" in warned[0]
    # a queue that does not exist is a failure of the read too, not an empty queue
    app = kueue_culler(FakeKueue({}, {}), queues=("nope",))
    assert await app._kueue_demand(app.catalog()) == ()
    assert app._kueue_warned


async def test_without_the_setting_or_a_catalog_kueue_is_not_read(capfd):
    fake = FakeKueue({"batch": [entry("train", 0)]}, {"train": job_workload("train", 4)})
    app = kueue_culler(fake, queues=())
    assert await app._kueue_demand(app.catalog()) == ()
    app = kueue_culler(fake)
    assert await app._kueue_demand(None) == ()
    assert await app._kueue_demand(None) == ()
    assert fake.reads == []
    assert len(logged(capfd, "catalog cannot be read")) == 1


async def test_a_head_no_catalog_type_serves_is_said_once(capfd):
    v100 = job_workload("v100", 2)
    v100["spec"]["podSets"][0]["template"]["spec"]["nodeSelector"] = {
        "nvidia.com/gpu.product": "Tesla-V100"
    }
    app = kueue_culler(FakeKueue({"batch": [entry("v100", 0)]}, {"v100": v100}))
    for _ in range(2):
        assert await app._kueue_demand(app.catalog()) == ()
    said = [line[line.index("Kueue demand:") :] for line in logged(capfd, "Kueue demand:")]
    assert said == [
        "Kueue demand: The head of ClusterQueue 'batch' ('Job' 'batch/v100'), pod set 'main', "
        "asks for 2 'nvidia.com/gpu' per pod, and ClusterQueue 'batch' has no flavor for it: "
        "not counted."
    ]


async def test_a_head_in_a_namespace_whose_workloads_may_not_be_read_leaves_the_others(capfd):
    notebook = job_workload("pod-ada", 1)
    notebook["metadata"]["namespace"] = "jupyterhub"
    fake = FakeKueue(
        {
            "batch": [entry("train", 0)],
            "notebooks": [entry("pod-ada", 0, kind="Pod", namespace="jupyterhub")],
        },
        {"train": job_workload("train", 4), "pod-ada": notebook},
    )
    fake.refused = {"batch"}
    app = kueue_culler(fake, queues=("batch", "notebooks"))
    assert await app._kueue_demand(app.catalog()) == (policy.Request("a100", 1, "kueue"),)
    errors = app.metrics.registry.get_sample_value(
        "gpuspawner_culler_errors_total", {"source": "kueue"}
    )
    assert errors == 1
    (said,) = logged(capfd, "Kueue demand:")
    assert "The Workload 'batch/train' at a queue's head may not be read" in said
