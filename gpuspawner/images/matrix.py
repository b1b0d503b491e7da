"""The version matrix of the notebook images (images/matrix.yaml), loaded and checked.

Pure: takes YAML text or data, returns dataclasses or a MatrixError whose message
names the file and the field. Nothing here talks to Docker.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from packaging.requirements import Requirement
from packaging.version import InvalidVersion, Version

from ..validation.gpucheck import driver_floor, format_version, parse_version

MATRIX_RELPATH = Path("images") / "matrix.yaml"
#: The chart's pause image (``z2jh.pause_tag``): made by the sandbox, not from a Dockerfile.
PAUSE_IMAGE = "pause"


def min_driver_for_cuda(cuda: str) -> str | None:
    """The oldest Linux driver that runs CUDA ``cuda`` (e.g. "13.2" -> "580.65.06"), or None.

    The GPU check's own table (:data:`gpuspawner.validation.gpucheck.DRIVER_FLOOR_BY_CUDA`),
    which every GPU pod enforces: an image's driver floor may be higher, never lower.
    """
    version = parse_version(cuda)
    floor = driver_floor(version) if version else None
    return format_version(floor) if floor else None


#: Python of each supported base image (the frameworks' wheels are built per Python).
BASE_IMAGE_PYTHON: dict[str, str] = {"debian:trixie-slim": "3.13", "ubuntu:24.04": "3.12"}

_PROFILE_RE = re.compile(r"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$")
_IMAGE_NAME_RE = re.compile(r"^[a-z0-9]+([._-][a-z0-9]+)*$")
_CUDA_RE = re.compile(r"^\d+\.\d+$")
_DRIVER_RE = re.compile(r"^\d+(\.\d+){1,2}$")
_TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
# A PyPI project name (PEP 508), without extras or versions: the constraints pin those.
_DIST_RE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?$")

_REQUIRED_IMAGE_KEYS = (
    "profile",
    "display_name",
    "dockerfile",
    "framework",
    "framework_version",
    "cuda",
    "driver_floor",
    "require_cuda",
)
_DEFAULT_KEYS = ("base_image", "python", "jupyterhub", "jupyterlab", "notebook", "tag_template")


class MatrixError(ValueError):
    """The matrix is missing, unreadable or inconsistent; the message says where."""


@dataclass(frozen=True)
class ImageSpec:
    """One notebook image of the matrix, with the defaults filled in."""

    name: str
    profile: str
    display_name: str
    dockerfile: str
    constraints: str | None
    framework: str
    framework_version: str
    cuda: str
    driver_floor: str
    require_cuda: str
    base_image: str
    python: str
    jupyterhub: str
    jupyterlab: str
    notebook: str
    tag_template: str
    #: What the framework stage installs besides the framework (pip distribution
    #: names, each pinned in the constraints file): what `describe` reports.
    libraries: tuple[str, ...] = ()

    @property
    def tag(self) -> str:
        return self.tag_template.format(
            framework_version=self.framework_version,
            cuda=self.cuda,
            python=self.python,
            framework=self.framework,
        )

    @property
    def framework_arg(self) -> str:
        """The Dockerfile ARG that carries the framework version, e.g. TORCH_VERSION."""
        return f"{self.framework.upper()}_VERSION"

    def build_args(self) -> dict[str, str]:
        """Every version ARG of the image's Dockerfile, from the matrix."""
        return {
            "BASE_IMAGE": self.base_image,
            "PYTHON_VERSION": self.python,
            self.framework_arg: self.framework_version,
            "CUDA_VERSION": self.cuda,
            "DRIVER_FLOOR": self.driver_floor,
            "REQUIRE_CUDA": self.require_cuda,
            "JUPYTERHUB_VERSION": self.jupyterhub,
            "JUPYTERLAB_VERSION": self.jupyterlab,
            "NOTEBOOK_VERSION": self.notebook,
            "IMAGE_VERSION": self.tag,
        }


#: The name `gpuspawner-images` gives the offline rebuild of z2jh's hub image (``build k8s-hub``).
K8S_HUB_REBUILD = "k8s-hub"


@dataclass(frozen=True)
class HubSpec:
    """The hub image: zero-to-jupyterhub's hub image (k8s-hub) plus gpuspawner."""

    name: str
    dockerfile: str
    z2jh_chart: str
    #: z2jh's hub image repository; the hub image is built FROM ``<k8s_hub>:<z2jh_chart>``.
    k8s_hub: str
    #: The Dockerfile that rebuilds k8s-hub from z2jh's recipe where no registry is reachable.
    rebuild_dockerfile: str
    #: The rebuild's Debian base.
    base_image: str
    #: The JupyterHub z2jh's requirements pin; the hub image keeps it.
    jupyterhub: str
    #: z2jh's pinned hub requirements.txt (what k8s-hub ships), relative to the repository
    #: root; only the rebuild reads it.
    requirements: str

    @property
    def k8s_hub_ref(self) -> str:
        """z2jh's hub image, e.g. ``quay.io/jupyterhub/k8s-hub:4.4.0``: the hub image's FROM."""
        return f"{self.k8s_hub}:{self.z2jh_chart}"

    def build_args(self, image_tag: str) -> dict[str, str]:
        """The hub image's build arguments; `image_tag` is the tag it gets (its version label)."""
        return {
            "K8S_HUB_IMAGE": self.k8s_hub_ref,
            "JUPYTERHUB_VERSION": self.jupyterhub,
            "IMAGE_VERSION": image_tag,
        }

    def rebuild_args(self) -> dict[str, str]:
        """The offline rebuild's build arguments."""
        return {"BASE_IMAGE": self.base_image}


@dataclass(frozen=True)
class ValidationSpec:
    """The GPU check's image (``validation_image``): a Debian base with its python3, no more.

    The check's code is not in it: the spawner passes the check's source in the init
    container's command, so the image works with any gpuspawner version.
    """

    name: str
    dockerfile: str
    base_image: str
    #: The Python the base's ``python3`` package brings (checked against the base).
    python: str
    tag: str

    def build_args(self) -> dict[str, str]:
        return {
            "BASE_IMAGE": self.base_image,
            "PYTHON_VERSION": self.python,
            "IMAGE_VERSION": self.tag,
        }


@dataclass(frozen=True)
class ChartImageSpec:
    """One of zero-to-jupyterhub's other images (images/z2jh/), rebuilt where no registry is."""

    name: str
    dockerfile: str
    tag: str
    #: The Debian base it is built on; None for an image ``FROM scratch``.
    base_image: str | None = None
    #: Programs built on the host (by the sandbox) that the Dockerfile copies from
    #: ``<its directory>/<binary>`` of the build context (``build --binary NAME=PATH``).
    binaries: tuple[str, ...] = ()

    def context_path(self, binary: str) -> str:
        """Where a host-built binary lies in the build context."""
        return f"{Path(self.dockerfile).parent.as_posix()}/{binary}"


@dataclass(frozen=True)
class ChartImages:
    """zero-to-jupyterhub's images besides the hub, tagged ``<registry>/<name>:<tag>``."""

    registry: str
    images: dict[str, ChartImageSpec]
    #: The tag of the real nodes' pause image, served as the chart's pause image
    #: (made by the sandbox as an OCI archive, not from a Dockerfile).
    pause_tag: str

    def ref(self, name: str) -> str:
        return f"{self.registry}/{name}:{self.images[name].tag}"

    @property
    def pause_ref(self) -> str:
        return f"{self.registry}/{PAUSE_IMAGE}:{self.pause_tag}"


@dataclass(frozen=True)
class Matrix:
    registry: str
    images: dict[str, ImageSpec]
    hub: HubSpec
    source: str = "<matrix>"
    z2jh: ChartImages = ChartImages(registry="", images={}, pause_tag="")
    #: The GPU check's image; None when the matrix has no ``validation:`` section.
    validation: ValidationSpec | None = None

    def select(self, names: list[str] | None) -> list[ImageSpec]:
        """The named notebook images in matrix order (all when names is empty)."""
        if not names:
            return list(self.images.values())
        unknown = [n for n in names if n not in self.images]
        if unknown:
            raise MatrixError(
                f"{', '.join(unknown)} is not an image of {self.source}; "
                f"known: {', '.join(self.images)}"
            )
        return [self.images[n] for n in names]


def _str(data: dict, key: str, where: str) -> str:
    value = data.get(key)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        # YAML reads 3.10 as the float 3.1: refuse rather than guess.
        raise MatrixError(f"{where}.{key} must be a quoted string, not the number {value!r}")
    if not isinstance(value, str) or not value.strip():
        raise MatrixError(f"{where}.{key} is missing or not a string")
    return value.strip()


def _version(value: str, where: str) -> str:
    try:
        Version(value)
    except InvalidVersion:
        raise MatrixError(f"{where} = {value!r} is not a version number") from None
    return value


def parse_matrix(data: Any, source: str = "<matrix>") -> Matrix:
    """Validate parsed matrix YAML and return it with each image's defaults filled in."""
    if not isinstance(data, dict):
        raise MatrixError(f"{source}: the matrix must be a mapping")
    registry = _str(data, "registry", source).rstrip("/")
    defaults = data.get("defaults") or {}
    if not isinstance(defaults, dict):
        raise MatrixError(f"{source}: defaults must be a mapping")
    raw_images = data.get("images")
    if not isinstance(raw_images, dict) or not raw_images:
        raise MatrixError(f"{source}: images must be a non-empty mapping")

    images: dict[str, ImageSpec] = {}
    profiles: dict[str, str] = {}
    for name, raw in raw_images.items():
        where = f"{source}: images.{name}"
        if not isinstance(name, str) or not _IMAGE_NAME_RE.match(name):
            raise MatrixError(f"{where}: image names are lowercase letters, digits, '.-_'")
        if not isinstance(raw, dict):
            raise MatrixError(f"{where} must be a mapping")
        merged = {**defaults, **raw}
        values = {k: _str(merged, k, where) for k in _REQUIRED_IMAGE_KEYS + _DEFAULT_KEYS}
        constraints = merged.get("constraints")
        if constraints is not None and not isinstance(constraints, str):
            raise MatrixError(f"{where}.constraints must be a path")
        if not _PROFILE_RE.match(values["profile"]):
            raise MatrixError(
                f"{where}.profile = {values['profile']!r}: a catalog key is lowercase "
                "letters, digits and '-'"
            )
        if values["profile"] in profiles:
            raise MatrixError(
                f"{where}.profile {values['profile']!r} is also used by "
                f"images.{profiles[values['profile']]}"
            )
        profiles[values["profile"]] = name
        for key in (
            "framework_version",
            "python",
            "jupyterhub",
            "jupyterlab",
            "notebook",
            "driver_floor",
        ):
            _version(values[key], f"{where}.{key}")
        if not _CUDA_RE.match(values["cuda"]):
            raise MatrixError(f"{where}.cuda = {values['cuda']!r}: write MAJOR.MINOR, e.g. 12.9")
        if not _DRIVER_RE.match(values["driver_floor"]):
            raise MatrixError(f"{where}.driver_floor = {values['driver_floor']!r}: e.g. 580.65.06")
        libraries = merged.get("libraries") or []
        if not isinstance(libraries, list) or not all(
            isinstance(lib, str) and _DIST_RE.match(lib) for lib in libraries
        ):
            raise MatrixError(f"{where}.libraries must be a list of pip distribution names")
        spec = ImageSpec(name=name, constraints=constraints, libraries=tuple(libraries), **values)
        try:
            tag = spec.tag
        except (KeyError, IndexError, ValueError) as e:
            raise MatrixError(f"{where}.tag_template: unknown field {e}") from None
        if not _TAG_RE.match(tag):
            raise MatrixError(f"{where}: the tag {tag!r} is not a valid Docker tag")
        images[name] = spec

    raw_hub = data.get("hub")
    if not isinstance(raw_hub, dict):
        raise MatrixError(f"{source}: hub must be a mapping")
    where = f"{source}: hub"
    hub = HubSpec(
        **{
            k: _str(raw_hub, k, where)
            for k in (
                "name",
                "dockerfile",
                "z2jh_chart",
                "k8s_hub",
                "rebuild_dockerfile",
                "base_image",
                "requirements",
            )
        },
        jupyterhub=_version(_str(raw_hub, "jupyterhub", where), f"{where}.jupyterhub"),
    )
    if hub.name in images:
        raise MatrixError(f"{where}.name {hub.name!r} is also a notebook image name")
    if K8S_HUB_REBUILD in {*images, hub.name}:
        raise MatrixError(f"{source}: {K8S_HUB_REBUILD!r} is the rebuild of k8s-hub's name")
    if not _TAG_RE.match(hub.z2jh_chart):
        raise MatrixError(f"{where}.z2jh_chart {hub.z2jh_chart!r} is not a valid Docker tag")
    z2jh = parse_chart_images(data.get("z2jh"), f"{source}: z2jh", defaults.get("base_image"))
    clashes = sorted({*z2jh.images} & {*images, hub.name, K8S_HUB_REBUILD, PAUSE_IMAGE})
    if clashes:
        raise MatrixError(
            f"{source}: z2jh.images {', '.join(clashes)} clash with other image names"
        )
    validation = parse_validation(data.get("validation"), f"{source}: validation")
    if validation is not None and validation.name in {
        *images,
        hub.name,
        K8S_HUB_REBUILD,
        *z2jh.images,
    }:
        raise MatrixError(
            f"{source}: validation.name {validation.name!r} is also another image's name"
        )
    return Matrix(
        registry=registry,
        images=images,
        hub=hub,
        source=source,
        z2jh=z2jh,
        validation=validation,
    )


def parse_validation(raw: Any, where: str) -> ValidationSpec | None:
    """The matrix's ``validation:`` section (absent: none)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise MatrixError(f"{where} must be a mapping")
    values = {k: _str(raw, k, where) for k in ("name", "dockerfile", "base_image", "tag")}
    if not _IMAGE_NAME_RE.match(values["name"]):
        raise MatrixError(f"{where}.name: image names are lowercase letters, digits, '.-_'")
    if not _TAG_RE.match(values["tag"]):
        raise MatrixError(f"{where}.tag {values['tag']!r} is not a valid Docker tag")
    python = _version(_str(raw, "python", where), f"{where}.python")
    return ValidationSpec(python=python, **values)


def parse_chart_images(raw: Any, where: str, default_base: Any) -> ChartImages:
    """The matrix's ``z2jh:`` section (absent: none)."""
    if raw is None:
        return ChartImages(registry="", images={}, pause_tag="")
    if not isinstance(raw, dict) or not isinstance(raw.get("images"), dict):
        raise MatrixError(f"{where} must be a mapping with an images mapping")
    images: dict[str, ChartImageSpec] = {}
    for name, entry in raw["images"].items():
        at = f"{where}.images.{name}"
        if not isinstance(name, str) or not _IMAGE_NAME_RE.match(name):
            raise MatrixError(f"{at}: image names are lowercase letters, digits, '.-_'")
        if not isinstance(entry, dict):
            raise MatrixError(f"{at} must be a mapping")
        tag = _str(entry, "tag", at)
        if not _TAG_RE.match(tag):
            raise MatrixError(f"{at}.tag {tag!r} is not a valid Docker tag")
        binaries = entry.get("binaries") or []
        if not isinstance(binaries, list) or not all(
            isinstance(b, str) and _IMAGE_NAME_RE.match(b) for b in binaries
        ):
            raise MatrixError(f"{at}.binaries must be a list of program names")
        base = _str({"base_image": default_base, **entry}, "base_image", at)
        images[name] = ChartImageSpec(
            name=name,
            dockerfile=_str(entry, "dockerfile", at),
            tag=tag,
            base_image=None if base == "scratch" else base,
            binaries=tuple(binaries),
        )
    pause_tag = _str(raw, "pause_tag", where)
    if not _TAG_RE.match(pause_tag):
        raise MatrixError(f"{where}.pause_tag {pause_tag!r} is not a valid Docker tag")
    return ChartImages(
        registry=_str(raw, "registry", where).rstrip("/"), images=images, pause_tag=pause_tag
    )


def load_matrix(path: str | Path) -> Matrix:
    """Read and validate a matrix file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise MatrixError(f"cannot read the image matrix {path}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise MatrixError(f"{path} is not valid YAML: {e}") from None
    return parse_matrix(data, str(path))


def find_repo_root(start: str | Path) -> Path | None:
    """The nearest directory at or above `start` that holds images/matrix.yaml."""
    here = Path(start).resolve()
    for candidate in (here, *here.parents):
        if (candidate / MATRIX_RELPATH).is_file():
            return candidate
    return None


def _driver_key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split("."))


def canonical_name(name: str) -> str:
    """A distribution name as pip compares them (PEP 503): "PyYAML" -> "pyyaml"."""
    return re.sub(r"[-_.]+", "-", name).lower().strip()


def read_constraints(text: str) -> dict[str, str]:
    """`name==version` lines of a pip constraints file, names normalised."""
    pins: dict[str, str] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if "==" in line:
            name, version = line.split("==", 1)
            name = re.sub(r"\[.*\]", "", name)
            pins[re.sub(r"[-_.]+", "-", name).lower().strip()] = version.strip()
    return pins


def constraints_cuda(pins: dict[str, str]) -> str | None:
    """The CUDA MAJOR.MINOR that a constraints file pins, from its CUDA runtime wheel."""
    for name in ("cuda-toolkit", "nvidia-cuda-runtime", "nvidia-cuda-runtime-cu13",
                 "nvidia-cuda-runtime-cu12"):  # fmt: skip
        if name in pins:
            major, minor = pins[name].split(".")[:2]
            return f"{major}.{minor}"
    return None


def consistency_problems(
    matrix: Matrix,
    jupyterhub_requirement: str,
    root: Path | None = None,
) -> list[str]:
    """Everything in the matrix that disagrees with itself, the package or the repo.

    `jupyterhub_requirement` is the package's own requirement (e.g.
    "jupyterhub>=5.2,<7"). With `root`, Dockerfiles and constraints files are
    checked to exist and to pin what the matrix says.
    """
    problems: list[str] = []
    req = Requirement(jupyterhub_requirement)
    hub_version = Version(matrix.hub.jupyterhub)
    if hub_version not in req.specifier:
        problems.append(f"hub.jupyterhub {hub_version} is outside the package's requirement {req}")
    for spec in matrix.images.values():
        where = f"images.{spec.name}"
        single = Version(spec.jupyterhub)
        if single not in req.specifier:
            problems.append(
                f"{where}.jupyterhub {single} is outside the package's requirement {req}"
            )
        if (single.major, single.minor) != (hub_version.major, hub_version.minor):
            problems.append(
                f"{where}.jupyterhub {single} is not the hub's release line "
                f"{hub_version.major}.{hub_version.minor} (hub.jupyterhub {hub_version})"
            )
        lab, notebook = Version(spec.jupyterlab), Version(spec.notebook)
        # Notebook 7.N pins JupyterLab 4.N (jupyterlab>=4.N.x,<4.N+1): pip would refuse the pair.
        if (notebook.major - 3, notebook.minor) != (lab.major, lab.minor):
            problems.append(
                f"{where}.notebook {notebook} is not the release for jupyterlab {lab}: "
                f"Notebook {lab.major + 3}.{lab.minor}.x goes with JupyterLab {lab.major}.{lab.minor}"
            )
        cuda_major = int(spec.cuda.split(".")[0])
        floor = min_driver_for_cuda(spec.cuda)
        if floor is None:
            problems.append(
                f"{where}.cuda {spec.cuda}: the GPU check knows no driver floor for CUDA "
                f"{spec.cuda}"
            )
        elif _driver_key(spec.driver_floor) < _driver_key(floor):
            problems.append(
                f"{where}.driver_floor {spec.driver_floor} is below {floor}, the oldest driver "
                f"for CUDA {spec.cuda} (the GPU check's table)"
            )
        if spec.require_cuda != f"cuda>={cuda_major}.0":
            problems.append(
                f"{where}.require_cuda {spec.require_cuda!r} should be 'cuda>={cuda_major}.0' "
                "(the CUDA version its driver floor supports)"
            )
        base_python = BASE_IMAGE_PYTHON.get(spec.base_image)
        if base_python is not None and base_python != spec.python:
            problems.append(
                f"{where}.python {spec.python}: {spec.base_image} provides Python {base_python}"
            )
        if root is not None:
            problems.extend(_file_problems(spec, root))
    problems.extend(_validation_problems(matrix.validation, root))
    if root is not None:
        problems.extend(_hub_file_problems(matrix.hub, root))
        problems.extend(
            f"z2jh.images.{spec.name}.dockerfile {spec.dockerfile} does not exist"
            for spec in matrix.z2jh.images.values()
            if not (root / spec.dockerfile).is_file()
        )
    return problems


def _validation_problems(spec: ValidationSpec | None, root: Path | None) -> list[str]:
    if spec is None:
        return []
    problems = []
    base_python = BASE_IMAGE_PYTHON.get(spec.base_image)
    if base_python is not None and base_python != spec.python:
        problems.append(
            f"validation.python {spec.python}: {spec.base_image} provides Python {base_python}"
        )
    if root is not None and not (root / spec.dockerfile).is_file():
        problems.append(f"validation.dockerfile {spec.dockerfile} does not exist")
    return problems


def _hub_file_problems(hub: HubSpec, root: Path) -> list[str]:
    problems = []
    if not (root / hub.dockerfile).is_file():
        problems.append(f"hub.dockerfile {hub.dockerfile} does not exist")
    if not (root / hub.rebuild_dockerfile).is_file():
        problems.append(f"hub.rebuild_dockerfile {hub.rebuild_dockerfile} does not exist")
    # z2jh's requirements lie outside the repository; where they are absent (a bare
    # clone) the image build itself says so.
    requirements = root / hub.requirements
    if requirements.is_file():
        pinned = read_constraints(requirements.read_text()).get("jupyterhub")
        if pinned != hub.jupyterhub:
            problems.append(
                f"hub.jupyterhub {hub.jupyterhub} is not the JupyterHub z2jh's hub "
                f"requirements pin ({pinned}), which the hub image keeps"
            )
    return problems


def _file_problems(spec: ImageSpec, root: Path) -> list[str]:
    where = f"images.{spec.name}"
    problems = []
    if not (root / spec.dockerfile).is_file():
        problems.append(f"{where}.dockerfile {spec.dockerfile} does not exist")
    if spec.constraints is None:
        return problems
    path = root / spec.constraints
    if not path.is_file():
        return [*problems, f"{where}.constraints {spec.constraints} does not exist"]
    pins = read_constraints(path.read_text())
    pinned = pins.get(spec.framework)
    if pinned != spec.framework_version:
        problems.append(
            f"{spec.constraints} pins {spec.framework}=={pinned}, the matrix says "
            f"{spec.framework_version}"
        )
    cuda = constraints_cuda(pins)
    if cuda != spec.cuda:
        problems.append(f"{spec.constraints} pins CUDA runtime {cuda}, the matrix says {spec.cuda}")
    unpinned = [lib for lib in spec.libraries if canonical_name(lib) not in pins]
    if unpinned:
        problems.append(
            f"{spec.constraints} does not pin {', '.join(unpinned)} ({where}.libraries): "
            "resolve them with the framework as its header says"
        )
    return problems
