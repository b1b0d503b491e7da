"""The sandbox cluster's shape: which nodes exist and what emulated GPUs they hold.

A topology is a small YAML file (see ``topology.yaml`` beside this module for
the default and ``docs/sandbox.md``, "Topology", for the format). Loading it
gives plain data — :class:`Topology` with :class:`NodeSpec` and
:class:`GPUSpec` — from which each real node gets its labels and taint, its
emulated driver's GPUs and its device plugin's devices.

Everything that identifies a device (GPU UUIDs, MIG UUIDs, PCI bus ids,
serials) is derived deterministically from the node name and the GPU index, so
the same topology always yields the same cluster: tests and the demo can name a
GPU by UUID across restarts.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

DEFAULT_TOPOLOGY = Path(__file__).with_name("topology.yaml")

#: The extended resource a device plugin advertises for whole GPUs (and for MIG
#: devices under the "single" strategy).
GPU_RESOURCE = "nvidia.com/gpu"
MIG_STRATEGIES = ("none", "single", "mixed")
GPU_TAINT_KEY = "nvidia.com/gpu"
#: A GPU node's settings of NVIDIA's container runtime in the topology (the
#: mapping's key), and the one it takes, spelled as in the runtime's config.toml.
RUNTIME_KEY = "nvidia-container-runtime"
ACCEPT_ENVVAR_KEY = "accept-nvidia-visible-devices-envvar-when-unprivileged"

#: Driver branch -> the CUDA version its nvidia-smi banner reports.
CUDA_FOR_DRIVER = {
    610: "13.2",
    595: "13.2",
    590: "13.1",
    580: "13.0",
    575: "12.9",
    570: "12.8",
    565: "12.7",
    560: "12.6",
    555: "12.5",
    550: "12.4",
    545: "12.3",
    535: "12.2",
    530: "12.1",
    525: "12.0",
    520: "11.8",
    515: "11.7",
    510: "11.6",
    470: "11.4",
    460: "11.2",
    450: "11.0",
    418: "10.1",
}


@dataclass(frozen=True)
class MigProfile:
    """One MIG profile of a GPU model, with the figures GFD and nvidia-smi report."""

    name: str  # e.g. "1g.10gb"
    memory_mib: int
    multiprocessors: int
    bar1_mib: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg: int
    ofa: int

    @property
    def slices(self) -> int:
        return int(self.name.split("g.", 1)[0])


@dataclass(frozen=True)
class GPUModel:
    """What a GPU model looks like to nvidia-smi and GPU feature discovery."""

    key: str
    name: str  # the name nvidia-smi prints
    family: str  # GFD nvidia.com/gpu.family
    memory_mib: int  # memory.total as nvidia-smi/NVML report it
    compute_cap: str
    power_cap_w: int
    idle_power_w: int
    ecc: bool
    mig_profiles: dict[str, MigProfile] = field(default_factory=dict)

    @property
    def product(self) -> str:
        """The GFD ``nvidia.com/gpu.product`` value: the name with spaces as dashes."""
        return self.name.replace(" ", "-")


def _profiles(*rows: tuple) -> dict[str, MigProfile]:
    return {row[0]: MigProfile(*row) for row in rows}


# Memory, SM and BAR1 figures for H100 are those of the recorded 590.48.01 MIG
# capture; A100 figures follow NVIDIA's MIG user guide tables.
GPU_MODELS: dict[str, GPUModel] = {
    m.key: m
    for m in (
        GPUModel(
            "A100-SXM4-80GB",
            "NVIDIA A100-SXM4-80GB",
            "ampere",
            81920,
            "8.0",
            500,
            59,
            True,
            _profiles(
                ("1g.10gb", 9728, 14, 16383, 1, 0, 0, 0, 0),
                ("2g.20gb", 19968, 28, 32767, 2, 1, 0, 0, 0),
                ("3g.40gb", 40192, 42, 65535, 3, 2, 0, 0, 0),
                ("4g.40gb", 40192, 56, 65535, 4, 2, 0, 0, 0),
                ("7g.80gb", 80384, 98, 131071, 7, 5, 0, 1, 1),
            ),
        ),
        GPUModel(
            "A100-SXM4-40GB",
            "NVIDIA A100-SXM4-40GB",
            "ampere",
            40960,
            "8.0",
            400,
            52,
            True,
            _profiles(
                ("1g.5gb", 4864, 14, 8191, 1, 0, 0, 0, 0),
                ("2g.10gb", 9856, 28, 16383, 2, 1, 0, 0, 0),
                ("3g.20gb", 19968, 42, 32767, 3, 2, 0, 0, 0),
                ("4g.20gb", 19968, 56, 32767, 4, 2, 0, 0, 0),
                ("7g.40gb", 40192, 98, 65535, 7, 5, 0, 1, 1),
            ),
        ),
        GPUModel(
            "H100-80GB-HBM3",
            "NVIDIA H100 80GB HBM3",
            "hopper",
            81559,
            "9.0",
            700,
            69,
            True,
            _profiles(
                ("1g.10gb", 9984, 16, 6184, 1, 1, 0, 1, 0),
                ("2g.20gb", 20096, 32, 12369, 2, 2, 0, 2, 0),
                ("3g.40gb", 40448, 60, 24739, 3, 3, 0, 3, 0),
                ("4g.40gb", 40448, 64, 32986, 4, 4, 0, 4, 0),
                ("7g.80gb", 80896, 132, 65536, 7, 7, 0, 7, 1),
            ),
        ),
        GPUModel("L40S", "NVIDIA L40S", "ada-lovelace", 46068, "8.9", 350, 34, True),
        GPUModel("L4", "NVIDIA L4", "ada-lovelace", 23034, "8.9", 72, 16, True),
        GPUModel("T4", "Tesla T4", "turing", 15360, "7.5", 70, 15, True),
    )
}

# PCI bus numbers of the 8 GPUs of an HGX H100 board, as real DGX tables show them.
_BUS_NUMBERS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
_DNS1123 = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_DRIVER = re.compile(r"^\d{3}\.\d{2,3}(\.\d{2,3})?$")
#: 1s..59s or 1m..59m: a Go duration the kubelet reads, within reason for a sync period.
_SYNC_FREQUENCY = re.compile(r"^([1-9]|[1-5][0-9])[sm]$")
#: A local cluster's nodes compute their status every second instead of the kubelet's
#: 10 s, so that a GPU's health or a device plugin's registration reaches the
#: scheduler and the hub at once; they still send it only when it changed.
NODE_STATUS_UPDATE_FREQUENCY = "1s"
#: A Kubernetes feature gate's name, as the kubelet spells them (e.g. EventedPLEG).
_FEATURE_GATE = re.compile(r"^[A-Z][A-Za-z0-9]*$")
_CPU = re.compile(r"^(\d+(?:\.\d+)?)(m?)$")
_MEMORY = re.compile(r"^(\d+(?:\.\d+)?)((?:[KMGTPE]i)|[kMGTPE])?$")
_MEMORY_FACTORS = {
    "": 1,
    **{s: 1000 ** (i + 1) for i, s in enumerate("kMGTPE")},
    **{f"{s}i": 1024 ** (i + 1) for i, s in enumerate("KMGTPE")},
}

#: The labels in the kubernetes.io and k8s.io namespaces a kubelet may give its own
#: Node (k8s.io/kubelet's pkg/apis/well_known_labels.go); it refuses to start with
#: any other there.
KUBELET_LABELS = frozenset(
    {
        "kubernetes.io/hostname",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "failure-domain.beta.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
    }
)
KUBELET_LABEL_NAMESPACES = ("kubelet.kubernetes.io", "node.kubernetes.io")


def kubelet_may_set(key: str) -> bool:
    """Whether a kubelet may register its Node with this label (its --node-labels)."""
    namespace = key.split("/", 1)[0] if "/" in key else ""
    restricted = any(
        namespace == d or namespace.endswith("." + d) for d in ("kubernetes.io", "k8s.io")
    )
    if not restricted or key in KUBELET_LABELS:
        return True
    return any(namespace == d or namespace.endswith("." + d) for d in KUBELET_LABEL_NAMESPACES)


def cpu_millicores(quantity: str) -> int:
    """A CPU quantity ("16", "1.5", "500m") in millicores; ValueError if it is none."""
    match = _CPU.match(quantity)
    if not match:
        raise ValueError(f"not a CPU quantity: {quantity!r}")
    number = float(match.group(1))
    return int(number if match.group(2) else number * 1000)


def memory_bytes(quantity: str) -> int:
    """A memory quantity ("64Gi", "512M", "1000") in bytes; ValueError if it is none."""
    match = _MEMORY.match(quantity)
    if not match:
        raise ValueError(f"not a memory quantity: {quantity!r}")
    return int(float(match.group(1)) * _MEMORY_FACTORS[match.group(2) or ""])


class TopologyError(ValueError):
    """The topology file is not valid; the message says where and why."""


def _uuid_hex(seed: str) -> str:
    digest = hashlib.sha256(seed.encode()).hexdigest()
    return f"{digest[:8]}-{digest[8:12]}-{digest[12:16]}-{digest[16:20]}-{digest[20:32]}"


def gpu_uuid(node: str, index: int) -> str:
    """The deterministic ``GPU-…`` UUID of GPU ``index`` on ``node``."""
    return f"GPU-{_uuid_hex(f'gpu/{node}/{index}')}"


def mig_uuid(node: str, index: int, mig_index: int) -> str:
    """The deterministic ``MIG-…`` UUID of a MIG device (the R470+ form)."""
    return f"MIG-{_uuid_hex(f'mig/{node}/{index}/{mig_index}')}"


@dataclass(frozen=True)
class MigDeviceSpec:
    uuid: str
    profile: MigProfile
    gi: int  # GPU instance id
    ci: int  # compute instance id
    index: int  # MIG device index on its parent GPU


@dataclass(frozen=True)
class GPUSpec:
    """One emulated physical GPU."""

    node: str
    index: int
    uuid: str
    model: GPUModel
    bus_id: str
    serial: str
    mig: tuple[MigDeviceSpec, ...] = ()
    #: GPUs with the same number share an NVLink/NVSwitch fabric.
    nvlink_domain: int = 0

    @property
    def mig_enabled(self) -> bool:
        return bool(self.mig)


@dataclass(frozen=True)
class NodeSpec:
    """One emulated node: its capacity, driver and GPUs."""

    name: str
    #: At most this much is allocatable on the real node (nodeconfig.capacity_reservation):
    #: a real node cannot advertise more than the machine has. None: the machine's.
    cpu: str | None
    memory: str | None
    #: The kubelet's maxPods.
    pods: int
    driver: str
    mig_strategy: str
    gpus: tuple[GPUSpec, ...]
    labels: dict[str, str] = field(default_factory=dict)
    #: NVIDIA's runtime setting: whether an unprivileged container's
    #: NVIDIA_VISIBLE_DEVICES is honoured (NVIDIA's default: yes).
    accept_envvar_unprivileged: bool = True
    #: The kubelet's syncFrequency, e.g. "10s" (None: the kubelet's 1m): how often
    #: it syncs each pod, and so how soon a changed ConfigMap reaches a pod's files.
    sync_frequency: str | None = None
    #: The kubelet's nodeStatusUpdateFrequency: how often it computes its node's
    #: status, and so how soon a device plugin's change (a GPU that turns unhealthy,
    #: a plugin that registers) shows in allocatable.
    node_status_update_frequency: str = NODE_STATUS_UPDATE_FREQUENCY
    #: The kubelet's featureGates (the topology's top-level ones, then the node's own).
    kubelet_feature_gates: dict[str, bool] = field(default_factory=dict)

    @property
    def model(self) -> GPUModel | None:
        return self.gpus[0].model if self.gpus else None

    @property
    def cuda_version(self) -> str:
        return cuda_version_for(self.driver)


@dataclass(frozen=True)
class Topology:
    nodes: tuple[NodeSpec, ...]

    def node(self, name: str) -> NodeSpec:
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)


def cuda_version_for(driver: str) -> str:
    """The CUDA version a driver's nvidia-smi banner shows (closest known older branch)."""
    major = int(driver.split(".", 1)[0])
    branches = sorted((b for b in CUDA_FOR_DRIVER if b <= major), reverse=True)
    return CUDA_FOR_DRIVER[branches[0]] if branches else "N/A"


def _mig_devices(node: str, index: int, model: GPUModel, layout: list[str]) -> tuple:
    devices = []
    # GPU instance ids numbered as in the recorded H100 capture (3g -> 2, 2g -> 3,
    # 1g -> 9, 10); the driver's real numbering depends on placement order.
    next_gi = {7: 0, 4: 1, 3: 2, 2: 3, 1: 9}
    for mig_index, name in enumerate(layout):
        profile = model.mig_profiles[name]
        gi = next_gi[profile.slices]
        next_gi[profile.slices] += 1
        devices.append(MigDeviceSpec(mig_uuid(node, index, mig_index), profile, gi, 0, mig_index))
    return tuple(devices)


def parse_feature_gates(raw: Any, where: str) -> dict[str, bool]:
    """A ``kubelet_feature_gates`` mapping (gate name -> true/false), checked.

    ``where`` names its place in the topology for the error ("The topology",
    "Node 'gpu-0'"). Whether the kubelet offers a gate is the kubelet's to say:
    :class:`.nodes.RealNodes` asks its ``--help`` before anything starts.
    """
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise TopologyError(
            f"{where}: 'kubelet_feature_gates' must be a mapping of gate names to true or "
            f"false, like {{EventedPLEG: true}}, not {raw!r}."
        )
    for gate, enabled in raw.items():
        if not isinstance(gate, str) or not _FEATURE_GATE.match(gate):
            raise TopologyError(
                f"{where}: {gate!r} is not a feature gate's name; gates are spelled like "
                "'EventedPLEG'."
            )
        if not isinstance(enabled, bool):
            raise TopologyError(
                f"{where}: feature gate {gate!r} must be true or false, not {enabled!r}."
            )
    return dict(raw)


def _parse_node(
    raw: Any, position: int, default_driver: str, default_gates: dict[str, bool]
) -> NodeSpec:
    if not isinstance(raw, dict):
        raise TopologyError(f"Node #{position + 1} must be a mapping, not {raw!r}.")
    unknown = set(raw) - {
        "name",
        "cpu",
        "memory",
        "pods",
        "driver",
        "gpu",
        "labels",
        "mig",
        "sync_frequency",
        "node_status_update_frequency",
        "kubelet_feature_gates",
        RUNTIME_KEY,
    }
    name = raw.get("name")
    if not isinstance(name, str) or not _DNS1123.match(name) or len(name) > 63:
        raise TopologyError(
            f"Node #{position + 1} needs a 'name' that is a lowercase DNS label, not {name!r}."
        )
    if unknown:
        raise TopologyError(f"Node {name!r} has unknown field(s): {', '.join(sorted(unknown))}.")
    driver = str(raw.get("driver", default_driver))
    if not _DRIVER.match(driver):
        raise TopologyError(
            f"Node {name!r} has driver {driver!r}; expected a version like '580.95.05'."
        )
    labels = raw.get("labels") or {}
    if not isinstance(labels, dict):
        raise TopologyError(f"Node {name!r}: 'labels' must be a mapping.")
    for key in labels:
        if not kubelet_may_set(str(key)):
            raise TopologyError(
                f"Node {name!r}: a kubelet may not give its node the label {key!r}; "
                "use one outside the kubernetes.io and k8s.io namespaces."
            )
    cpu = _quantity(name, raw, "cpu", cpu_millicores, "a positive CPU quantity like '16' or '500m'")
    memory = _quantity(name, raw, "memory", memory_bytes, "a positive memory quantity like '64Gi'")
    pods = raw.get("pods", 110)
    if not isinstance(pods, int) or pods < 1:
        raise TopologyError(f"Node {name!r}: 'pods' must be a positive integer, not {pods!r}.")
    sync_frequency = _kubelet_period(name, raw, "sync_frequency", None)
    status_frequency = _kubelet_period(
        name, raw, "node_status_update_frequency", NODE_STATUS_UPDATE_FREQUENCY
    )
    gates = {
        **default_gates,
        **parse_feature_gates(raw.get("kubelet_feature_gates"), f"Node {name!r}"),
    }

    gpus: tuple[GPUSpec, ...] = ()
    strategy = "none"
    gpu = raw.get("gpu")
    if gpu is not None:
        if not isinstance(gpu, dict) or set(gpu) - {"model", "count", "nvlink_domains"}:
            raise TopologyError(
                f"Node {name!r}: 'gpu' must be a mapping with 'model', 'count' and "
                "optionally 'nvlink_domains'."
            )
        model = GPU_MODELS.get(str(gpu.get("model")))
        if model is None:
            raise TopologyError(
                f"Node {name!r}: unknown GPU model {gpu.get('model')!r}; "
                f"known models: {', '.join(GPU_MODELS)}."
            )
        count = gpu.get("count")
        if not isinstance(count, int) or not 1 <= count <= 8:
            raise TopologyError(
                f"Node {name!r}: GPU 'count' must be an integer from 1 to 8, not {count!r}."
            )
        domains = gpu.get("nvlink_domains", 1)
        if not isinstance(domains, int) or domains < 1 or count % domains:
            raise TopologyError(
                f"Node {name!r}: 'nvlink_domains' must be a positive integer that divides "
                f"the GPU count {count}, not {domains!r}."
            )
        layouts = _parse_mig(name, raw.get("mig"), model, count)
        if layouts:
            strategy = raw["mig"].get("strategy", "mixed")
        gpus = tuple(
            GPUSpec(
                node=name,
                index=i,
                uuid=gpu_uuid(name, i),
                model=model,
                bus_id=f"00000000:{_BUS_NUMBERS[i]}:00.0",
                serial=str(int(hashlib.sha256(f"serial/{name}/{i}".encode()).hexdigest(), 16))[:13],
                mig=_mig_devices(name, i, model, layouts[i]) if layouts else (),
                # Equal consecutive groups, as boards of NVLink-connected GPUs are.
                nvlink_domain=i // (count // domains),
            )
            for i in range(count)
        )
    elif raw.get("mig") is not None:
        raise TopologyError(f"Node {name!r} has a 'mig' section but no 'gpu'.")
    accept_envvar = _parse_runtime(name, raw.get(RUNTIME_KEY), has_gpus=bool(gpus))

    return NodeSpec(
        name=name,
        cpu=cpu,
        memory=memory,
        pods=pods,
        sync_frequency=sync_frequency,
        node_status_update_frequency=status_frequency,
        kubelet_feature_gates=gates,
        driver=driver,
        mig_strategy=strategy,
        gpus=gpus,
        labels={str(k): str(v) for k, v in labels.items()},
        accept_envvar_unprivileged=accept_envvar,
    )


def _kubelet_period(node: str, raw: dict, key: str, default: str | None) -> str | None:
    """One of the kubelet's periods a node entry may set, checked; ``default`` when absent."""
    value = raw.get(key, default)
    if value is not None and not (isinstance(value, str) and _SYNC_FREQUENCY.match(value)):
        raise TopologyError(
            f"Node {node!r}: {key!r} must be a duration from 1s to 59m like '10s' or "
            f"'1m', not {value!r}."
        )
    return value


def _quantity(node: str, raw: dict, key: str, parse, what: str) -> str | None:
    """A node's optional quantity, checked with ``parse``; None when not given."""
    if raw.get(key) is None:
        return None
    value = str(raw[key])
    try:
        if parse(value) <= 0:
            raise ValueError(value)
    except ValueError:
        raise TopologyError(f"Node {node!r}: {key!r} must be {what}, not {value!r}.") from None
    return value


def _parse_runtime(node: str, raw: Any, *, has_gpus: bool) -> bool:
    """A node's NVIDIA runtime settings: whether it accepts the variable when unprivileged."""
    if raw is None:
        return True
    if not has_gpus:
        raise TopologyError(f"Node {node!r} has a {RUNTIME_KEY!r} section but no 'gpu'.")
    if not isinstance(raw, dict) or set(raw) - {ACCEPT_ENVVAR_KEY}:
        raise TopologyError(
            f"Node {node!r}: {RUNTIME_KEY!r} must be a mapping with only {ACCEPT_ENVVAR_KEY!r}."
        )
    value = raw.get(ACCEPT_ENVVAR_KEY, True)
    if not isinstance(value, bool):
        raise TopologyError(
            f"Node {node!r}: {ACCEPT_ENVVAR_KEY!r} must be true or false, not {value!r}."
        )
    return value


def _parse_mig(node: str, raw: Any, model: GPUModel, count: int) -> list[list[str]]:
    """The MIG layout of each GPU (a list of profile names per GPU), or [] without MIG."""
    if raw is None:
        return []
    if not isinstance(raw, dict) or set(raw) - {"strategy", "profiles"}:
        raise TopologyError(
            f"Node {node!r}: 'mig' must be a mapping with 'strategy' and 'profiles'."
        )
    if not model.mig_profiles:
        raise TopologyError(f"Node {node!r}: GPU model {model.key} does not support MIG.")
    strategy = raw.get("strategy", "mixed")
    if strategy not in ("single", "mixed"):
        raise TopologyError(
            f"Node {node!r}: MIG 'strategy' must be 'single' or 'mixed', not {strategy!r}."
        )
    profiles = raw.get("profiles")
    if not isinstance(profiles, dict) or not profiles:
        raise TopologyError(
            f"Node {node!r}: MIG 'profiles' must map profile names to a count per GPU, "
            "e.g. {'3g.40gb': 1, '1g.10gb': 4}."
        )
    layout: list[str] = []
    for profile, n in profiles.items():
        if profile not in model.mig_profiles:
            raise TopologyError(
                f"Node {node!r}: {model.key} has no MIG profile {profile!r}; "
                f"valid profiles: {', '.join(model.mig_profiles)}."
            )
        if not isinstance(n, int) or n < 1:
            raise TopologyError(
                f"Node {node!r}: MIG profile {profile!r} needs a positive count, not {n!r}."
            )
        layout += [profile] * n
    used = sum(model.mig_profiles[p].slices for p in layout)
    if used > 7:
        raise TopologyError(
            f"Node {node!r}: the MIG layout uses {used} compute slices per GPU; a "
            f"{model.key} has 7."
        )
    if strategy == "single" and len(profiles) != 1:
        raise TopologyError(
            f"Node {node!r}: the 'single' MIG strategy needs one profile on every GPU, "
            f"got {', '.join(profiles)}."
        )
    # Larger instances first, as `nvidia-smi mig -cgi` users usually create them.
    layout.sort(key=lambda p: -model.mig_profiles[p].slices)
    return [list(layout) for _ in range(count)]


def parse_topology(raw: Any) -> Topology:
    """Validate a parsed topology document and build the :class:`Topology`."""
    if not isinstance(raw, dict) or not isinstance(raw.get("nodes"), list) or not raw["nodes"]:
        raise TopologyError("A topology needs a non-empty 'nodes' list.")
    if "image_env" in raw:
        raise TopologyError(
            "The topology's 'image_env' is no longer read: real nodes run each image with the "
            "environment its own ENV lines set; remove it."
        )
    unknown = set(raw) - {"nodes", "driver", "kubelet_feature_gates"}
    if unknown:
        raise TopologyError(f"The topology has unknown top-level field(s): {', '.join(unknown)}.")
    driver = str(raw.get("driver", "580.95.05"))
    if not _DRIVER.match(driver):
        raise TopologyError(f"The default driver {driver!r} is not a version like '580.95.05'.")
    gates = parse_feature_gates(raw.get("kubelet_feature_gates"), "The topology")
    nodes = tuple(_parse_node(n, i, driver, gates) for i, n in enumerate(raw["nodes"]))
    seen: set[str] = set()
    for node in nodes:
        if node.name in seen:
            raise TopologyError(f"Node name {node.name!r} appears more than once.")
        seen.add(node.name)
    return Topology(nodes=nodes)


def load_topology(path: Path | str | None = None) -> Topology:
    """Load and validate a topology YAML file (the default one when ``path`` is None)."""
    path = Path(path) if path else DEFAULT_TOPOLOGY
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as e:
        raise TopologyError(f"Cannot read the topology file {path}: {e.strerror}.") from None
    except yaml.YAMLError as e:
        raise TopologyError(f"The topology file {path} is not valid YAML: {e}.") from None
    return parse_topology(raw)


def extended_resources(node: NodeSpec) -> dict[str, int]:
    """The extended resources a device plugin would advertise for ``node``."""
    if not node.gpus:
        return {}
    if node.mig_strategy == "none":
        return {GPU_RESOURCE: len(node.gpus)}
    if node.mig_strategy == "single":
        return {GPU_RESOURCE: sum(len(g.mig) for g in node.gpus)}
    counts: dict[str, int] = {}
    for gpu in node.gpus:
        for mig in gpu.mig:
            name = f"nvidia.com/mig-{mig.profile.name}"
            counts[name] = counts.get(name, 0) + 1
    return counts


def node_labels(node: NodeSpec) -> dict[str, str]:
    """The labels a real GPU node carries: kubelet's own, GFD's and the GPU operator's."""
    labels = {
        "kubernetes.io/hostname": node.name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "node.kubernetes.io/instance-type": "sandbox",
    }
    model = node.model
    if model is not None:
        drv = [*node.driver.split("."), "0"][:3]
        cuda = node.cuda_version.split(".")
        comp = model.compute_cap.split(".")
        labels.update(
            {
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.deploy.device-plugin": "true",
                "nvidia.com/gpu.deploy.gpu-feature-discovery": "true",
                "nvidia.com/gpu.product": model.product,
                "nvidia.com/gpu.count": str(len(node.gpus)),
                "nvidia.com/gpu.memory": str(model.memory_mib),
                "nvidia.com/gpu.family": model.family,
                "nvidia.com/gpu.compute.major": comp[0],
                "nvidia.com/gpu.compute.minor": comp[1],
                "nvidia.com/gpu.machine": "sandbox",
                "nvidia.com/gpu.mode": "compute",
                "nvidia.com/gpu.replicas": "1",
                "nvidia.com/gpu.sharing-strategy": "none",
                "nvidia.com/cuda.driver.major": drv[0],
                "nvidia.com/cuda.driver.minor": drv[1],
                "nvidia.com/cuda.driver.rev": drv[2],
                "nvidia.com/cuda.driver-version.major": drv[0],
                "nvidia.com/cuda.driver-version.minor": drv[1],
                "nvidia.com/cuda.driver-version.revision": drv[2],
                "nvidia.com/cuda.driver-version.full": node.driver,
                "nvidia.com/cuda.runtime.major": cuda[0],
                "nvidia.com/cuda.runtime.minor": cuda[1],
                "nvidia.com/cuda.runtime-version.major": cuda[0],
                "nvidia.com/cuda.runtime-version.minor": cuda[1],
                "nvidia.com/cuda.runtime-version.full": node.cuda_version,
                "nvidia.com/mig.capable": "true" if model.mig_profiles else "false",
                "nvidia.com/mig.strategy": node.mig_strategy,
            }
        )
        if node.mig_strategy == "single":
            profile = node.gpus[0].mig[0].profile
            labels.update(
                {
                    "nvidia.com/gpu.product": f"{model.product}-MIG-{profile.name}",
                    "nvidia.com/gpu.count": str(sum(len(g.mig) for g in node.gpus)),
                    "nvidia.com/gpu.memory": str(profile.memory_mib),
                    **_mig_labels("nvidia.com/gpu", profile),
                }
            )
        elif node.mig_strategy == "mixed":
            for resource, count in extended_resources(node).items():
                profile = model.mig_profiles[resource.split("mig-", 1)[1]]
                prefix = resource
                labels[f"{prefix}.count"] = str(count)
                labels[f"{prefix}.memory"] = str(profile.memory_mib)
                labels.update(_mig_labels(prefix, profile))
    labels.update(node.labels)
    return labels


def _mig_labels(prefix: str, profile: MigProfile) -> dict[str, str]:
    return {
        f"{prefix}.multiprocessors": str(profile.multiprocessors),
        f"{prefix}.slices.gi": str(profile.slices),
        f"{prefix}.slices.ci": str(profile.slices),
        f"{prefix}.engines.copy": str(profile.copy_engines),
        f"{prefix}.engines.decoder": str(profile.decoders),
        f"{prefix}.engines.encoder": str(profile.encoders),
        f"{prefix}.engines.jpeg": str(profile.jpeg),
        f"{prefix}.engines.ofa": str(profile.ofa),
    }


def node_taints(node: NodeSpec) -> list[dict[str, str]]:
    """GPU nodes carry the common ``nvidia.com/gpu=present:NoSchedule`` taint."""
    if not node.gpus:
        return []
    return [{"key": GPU_TAINT_KEY, "value": "present", "effect": "NoSchedule"}]
