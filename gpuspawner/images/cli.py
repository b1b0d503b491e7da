"""`gpuspawner-images`: list, build, test and push the notebook images, and write
their catalog entries.

    gpuspawner-images list
    gpuspawner-images base  [--refresh] [--cache-dir DIR]
    gpuspawner-images build [NAME ...] [--catalog-out FILE]
    gpuspawner-images test  [NAME ...] [--cpu]
    gpuspawner-images push  [NAME ...]
    gpuspawner-images catalog [NAME ...] [--output FILE] [--only-built]
    gpuspawner-images facts [--json] [--catalog FILE ...]
    gpuspawner-images describe [NAME ...] [--target STAGE] [--json]
    gpuspawner-images version [--json] [--set VERSION]

Every verb reads images/matrix.yaml (found from the current directory upwards, or
--matrix). `list`, `catalog`, `facts` and `version` need no Docker engine; the others fail at
once, with one sentence, when none is reachable. `facts --json` is for programs
(the sandbox runs it rather than parse the matrix itself): the hub image, the
notebook images' stage tags and stage label, the chart's images, and the images
catalog files name (docs/images.md, "Facts for programs"). `describe` lists, for each
built notebook image, its framework, CUDA, labels and the version of every package
the matrix puts in its stage; it fails when one is missing or not the pinned version.
`version` prints the release's names, derived from the package version
(:mod:`.release`): the chart's version and appVersion and the hub image; `--set X`
rewrites every file that writes them (`_version.py`, the chart, the values files).

`build hub` builds the hub image FROM z2jh's k8s-hub image; `build k8s-hub hub`
first rebuilds k8s-hub from z2jh's recipe and tags it with quay.io's reference in
the engine, for an engine that reaches no registry (docs/images.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, TextIO

import yaml

from .._version import __version__
from ..core.catalog import CatalogError, load_catalog_file
from . import describe as desc
from . import engine
from .base import BaseError, make_base, plan_base
from .matrix import (
    K8S_HUB_REBUILD,
    MATRIX_RELPATH,
    Matrix,
    MatrixError,
    find_repo_root,
    load_matrix,
    read_constraints,
)
from .plan import (
    FULL_STAGE,
    STAGES,
    Provenance,
    base_images,
    catalog_document,
    check_names,
    dockerfile_of,
    facts_document,
    hub_ref,
    image_ref,
    image_sources,
    notebook_names,
    plan_builds,
    plan_test,
    prepuller_values,
    validation_ref,
)
from .release import VERSION_FILES, ReleaseError, release, set_version

#: Moves the default --cache-dir of `base` (the local cluster's harness reads it too).
IMAGE_CACHE_ENV = "GPUSPAWNER_IMAGE_CACHE"

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_UNUSABLE = 2


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(headers, widths, strict=True)).rstrip()]
    lines.append("  ".join("-" * w for w in widths))
    for row in rows:
        lines.append("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    return "\n".join(lines)


def format_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} GB"


def format_seconds(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m{secs:02d}s" if minutes else f"{secs}s"


def matrix_table(matrix: Matrix, registry: str | None) -> str:
    rows = [
        [
            image_ref(matrix, spec, registry),
            spec.profile,
            spec.cuda,
            f"{spec.framework} {spec.framework_version}",
            spec.python,
            f"jupyterhub {spec.jupyterhub}",
            f">= {spec.driver_floor}",
        ]
        for spec in matrix.images.values()
    ]
    hub = matrix.hub
    rows.append(
        [hub.k8s_hub_ref, f"({K8S_HUB_REBUILD})", "-", f"z2jh {hub.z2jh_chart}", "-", "-", "-"]
    )
    rows.append(
        [
            hub_ref(matrix, __version__, registry),
            "(hub)",
            "-",
            f"z2jh {hub.z2jh_chart}",
            "-",
            f"jupyterhub {hub.jupyterhub}",
            "-",
        ]
    )
    check = validation_ref(matrix, registry)
    if check is not None and matrix.validation is not None:
        rows.append([check, "(gpu check)", "-", "-", matrix.validation.python, "-", "-"])
    rows += [
        [matrix.z2jh.ref(name), "(z2jh)", "-", "-", "-", "-", "-"] for name in matrix.z2jh.images
    ]
    return format_table(
        ["IMAGE:TAG", "PROFILE", "CUDA", "FRAMEWORK", "PYTHON", "HUB", "DRIVER"], rows
    )


def build_date(environ: dict[str, str], commit_time: int | None = None) -> str:
    """An image's ``created`` label: ``SOURCE_DATE_EPOCH`` when set (reproducible builds),
    else ``commit_time`` (the image's revision's, with ``build --reproducible``), else now.

    With a fixed date, building the same sources again gives the same image ID,
    so whoever caches by image ID (the sandbox's notebook image) can skip work.
    """
    epoch = environ.get("SOURCE_DATE_EPOCH", "").strip()
    when = epoch if epoch.isdigit() else commit_time
    moment = datetime.fromtimestamp(int(when), timezone.utc) if when is not None else None
    return (moment or datetime.now(timezone.utc)).strftime("%Y-%m-%dT%H:%M:%SZ")


def _git(root: Path, *args: str) -> str | None:
    try:
        out = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return out.stdout if out.returncode == 0 else None


def image_provenance(
    root: Path, sources: tuple[str, ...], environ: dict[str, str], reproducible: bool
) -> Provenance:
    """An image's revision: the last commit that changed one of its ``sources``, with
    ``-dirty`` when they have changes not committed; and its build date (:func:`build_date`)."""
    last = (_git(root, "log", "-1", "--format=%h %ct", "--abbrev=12", "--", *sources) or "").split()
    if len(last) != 2 or not last[1].isdigit():
        return Provenance("unknown", build_date(environ))
    changed = _git(root, "status", "--porcelain", "--", *sources)
    revision = f"{last[0]}-dirty" if changed else last[0]
    return Provenance(revision, build_date(environ, int(last[1]) if reproducible else None))


def _commented(text: str) -> str:
    return "".join(f"# {line}\n" if line else "#\n" for line in text.splitlines())


def _write_catalog(
    document: dict[str, Any],
    output: str | None,
    out: TextIO,
    prepuller: dict[str, Any] | None = None,
) -> None:
    text = (
        "# Catalog entries written by gpuspawner-images from images/matrix.yaml.\n"
        "# Merge them into the catalog file; GPU types and limits are the admin's.\n"
        + yaml.safe_dump(document, sort_keys=False, width=100)
    )
    if prepuller is not None:
        # Commented out, so that the output stays a valid catalog file.
        text += (
            "\n# For zero-to-jupyterhub's values (config/z2jh-values.yaml), so that its image\n"
            "# puller pulls these images on the (tainted) GPU nodes too; --z2jh prints it alone:\n"
            + _commented(yaml.safe_dump(prepuller, sort_keys=False, width=100))
        )
    if output is None or output == "-":
        out.write(text)
    else:
        Path(output).write_text(text)
        print(f"wrote {len(document['images'])} catalog entries to {output}", file=out)


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--matrix", help=f"the version matrix (default: {MATRIX_RELPATH} above the cwd)"
    )
    common.add_argument("--registry", help="registry/namespace to tag with (default: the matrix's)")
    parser = argparse.ArgumentParser(
        prog="gpuspawner-images",
        description="Build, test and push gpuspawner's CUDA notebook images from images/matrix.yaml.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    sub.add_parser("list", parents=[common], help="show the matrix: image, tag, CUDA, framework")
    base = sub.add_parser(
        "base",
        parents=[common],
        help="make the matrix's Debian base images from Debian's packages (debootstrap)",
    )
    base.add_argument(
        "--cache-dir",
        metavar="DIR",
        help=f"where the root filesystems are cached (default: ${IMAGE_CACHE_ENV}, else "
        ".cache/images in the repository)",
    )
    base.add_argument("--refresh", action="store_true", help="run debootstrap again")
    b = sub.add_parser(
        "build", parents=[common], help="build images (all notebook images by default)"
    )
    b.add_argument("names", nargs="*", metavar="NAME")
    b.add_argument("--no-cache", action="store_true", help="do not reuse cached layers")
    b.add_argument("--pull", action="store_true", help="pull a newer base image first")
    b.add_argument("--catalog-out", metavar="FILE", help="write catalog entries for what was built")
    b.add_argument(
        "--reproducible",
        action="store_true",
        help="date each image by its revision's commit (not now), so that the same sources "
        "give the same image ID (SOURCE_DATE_EPOCH, when set, dates them all)",
    )
    b.add_argument(
        "--target",
        choices=STAGES,
        default=FULL_STAGE,
        help=f"stop the notebook images at this stage (default: {FULL_STAGE}, the full image; "
        "jupyter: JupyterLab without the framework)",
    )
    b.add_argument(
        "--network",
        metavar="MODE",
        help="network of the build's RUN steps (e.g. host, for an engine without a bridge)",
    )
    b.add_argument(
        "--hub-requirements",
        metavar="FILE",
        help="z2jh's pinned hub requirements.txt for the k8s-hub rebuild (default: the "
        "matrix's hub.requirements)",
    )
    b.add_argument(
        "--binary",
        action="append",
        default=[],
        metavar="NAME=PATH",
        help="a host-built program z2jh's images copy (the matrix's z2jh.images.*.binaries)",
    )
    t = sub.add_parser("test", parents=[common], help="run the GPU smoke test in built images")
    t.add_argument("names", nargs="*", metavar="NAME")
    t.add_argument("--cpu", action="store_true", help="CPU-only mode even if GPUs are available")
    t.add_argument(
        "--target",
        choices=STAGES,
        default=FULL_STAGE,
        help="the stage built with build --target (smaller stages are started and must turn healthy)",
    )
    p = sub.add_parser("push", parents=[common], help="push built images to the registry")
    p.add_argument("names", nargs="*", metavar="NAME")
    p.add_argument(
        "--target", choices=STAGES, default=FULL_STAGE, help="the stage built with build --target"
    )
    c = sub.add_parser(
        "catalog", parents=[common], help="print/write the catalog's images: entries"
    )
    c.add_argument("names", nargs="*", metavar="NAME")
    c.add_argument("--output", "-o", metavar="FILE", help="write to FILE instead of stdout")
    c.add_argument(
        "--only-built", action="store_true", help="only images the Docker engine has built"
    )
    c.add_argument(
        "--z2jh",
        action="store_true",
        help="print only the zero-to-jupyterhub values that pre-pull these images on GPU nodes",
    )
    f = sub.add_parser(
        "facts",
        parents=[common],
        help="what other programs need to know about the images (hub image and tag, stage "
        "tags and label, the chart's images, a catalog's images); --json for programs",
        description="Print, from the matrix and the package version, the hub image "
        "(hub.ref, tagged with the package version), each notebook image's reference per "
        "stage (notebook_images[].refs), the label a stage build carries (stage_label), "
        "zero-to-jupyterhub's other images (chart_images; dockerfile null for the pause "
        "image, which is not built from a Dockerfile) and, with --catalog, the image "
        "references each catalog file names (catalogs: {FILE: [REF, ...]}). YAML for "
        "people; --json prints the same document as JSON. No Docker engine is needed.",
    )
    f.add_argument("--json", action="store_true", help="print JSON (default: YAML)")
    d = sub.add_parser(
        "describe",
        parents=[common],
        help="list each built notebook image's framework, CUDA, labels and the installed "
        "version of every package the matrix puts in it",
        description="For each built notebook image (all by default), run python in a "
        "throwaway container (no network, entry point replaced) and list the version "
        "installed of each package the matrix puts in its stage: the server's (jupyterhub, "
        "jupyterlab, notebook) and, in the framework stage, the framework and the image's "
        "libraries, beside the version the matrix or the constraints file pins. Exits 1 "
        "when an image is not built or a package is missing or another version.",
    )
    d.add_argument("names", nargs="*", metavar="NAME")
    d.add_argument(
        "--target",
        choices=STAGES,
        default=FULL_STAGE,
        help="the stage built with build --target (the jupyter stage carries no framework "
        "and no libraries, so only the server's packages are expected there)",
    )
    d.add_argument("--json", action="store_true", help="print JSON for programs")
    v = sub.add_parser(
        "version",
        parents=[common],
        help="the release's names: package version, chart version and appVersion, hub image",
    )
    v.add_argument("--json", action="store_true", help="print JSON for programs")
    v.add_argument(
        "--set",
        metavar="VERSION",
        help="make VERSION (PEP 440) the release: rewrite gpuspawner/_version.py and every "
        "literal derived from it (the chart's version and appVersion, the hub image tags)",
    )
    f.add_argument(
        "--catalog",
        action="append",
        default=[],
        metavar="FILE",
        help="also list the images this catalog file names, read and checked as the "
        "spawner reads it (repeatable)",
    )
    return parser


def _load(args: argparse.Namespace) -> tuple[Matrix, Path]:
    if args.matrix:
        path = Path(args.matrix)
        root = path.resolve().parent.parent
    else:
        found = find_repo_root(Path.cwd())
        if found is None:
            raise MatrixError(
                f"no {MATRIX_RELPATH} here or in any parent directory; run from the "
                "gpuspawner repository or pass --matrix"
            )
        root, path = found, found / MATRIX_RELPATH
    return load_matrix(path), root


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    out = sys.stdout if out is None else out
    args = _parser().parse_args(argv)
    try:
        matrix, root = _load(args)
        names = list(getattr(args, "names", []) or [])
        check_names(matrix, names)
        return VERBS[args.verb](args, matrix, root, names, out)
    except (MatrixError, CatalogError, engine.EngineUnavailable, BaseError, ReleaseError) as e:
        print(f"gpuspawner-images: {e}", file=sys.stderr)
        return EXIT_UNUSABLE
    except OSError as e:
        print(f"gpuspawner-images: cannot write {e.filename}: {e.strerror}.", file=sys.stderr)
        return EXIT_UNUSABLE
    except KeyboardInterrupt:
        print("gpuspawner-images: interrupted.", file=sys.stderr)
        return EXIT_FAILED


def cmd_list(args, matrix: Matrix, root: Path, names: list[str], out: TextIO) -> int:
    print(matrix_table(matrix, args.registry), file=out)
    return EXIT_OK


def _hub_requirements(args: argparse.Namespace, matrix: Matrix, root: Path) -> str:
    path = Path(args.hub_requirements or root / matrix.hub.requirements)
    return str(path)


def parse_binaries(values: list[str]) -> dict[str, str]:
    """``--binary NAME=PATH`` arguments as {name: path}."""
    found = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise MatrixError(f"--binary {value!r}: write NAME=PATH, e.g. k8s=/path/to/k8s")
        found[name] = path
    return found


def cmd_base(args, matrix: Matrix, root: Path, names: list[str], out: TextIO) -> int:
    plans = [plan_base(image) for image in base_images(matrix)]
    client = engine.connect()
    cache = Path(args.cache_dir or os.environ.get(IMAGE_CACHE_ENV) or root / ".cache" / "images")
    for plan in plans:
        print(f"==> making {plan.image} from Debian {plan.suite}", file=out, flush=True)
        image_id = make_base(
            client,
            plan,
            cache,
            lambda line, image=plan.image: print(f"[{image}] {line}", file=out, flush=True),
            refresh=args.refresh,
        )
        print(f"==> {plan.image} is {image_id}", file=out, flush=True)
    return EXIT_OK


def cmd_build(args, matrix: Matrix, root: Path, names: list[str], out: TextIO) -> int:
    client = engine.connect()
    steps = plan_builds(
        matrix,
        names,
        context=str(root),
        registry=args.registry,
        provenance={
            name: image_provenance(
                root,
                image_sources(matrix, name, (root / dockerfile_of(matrix, name)).read_text()),
                dict(os.environ),
                args.reproducible,
            )
            for name in names or list(matrix.images)
        },
        package_version=__version__,
        stage=args.target,
        hub_requirements=_hub_requirements(args, matrix, root),
        binaries=parse_binaries(args.binary),
    )
    results: list[engine.BuildResult] = []
    failures: list[tuple[str, str]] = []
    base = matrix.hub.k8s_hub_ref
    if any(s.name == matrix.hub.name and s.pull_base for s in steps) and not (
        engine.image_exists(client, base)
    ):
        # Said before the engine dials out, so that an offline build's failure is explained.
        print(
            f"==> {base} is not in the engine: the hub's build pulls it (where no registry "
            f"is reachable, build {K8S_HUB_REBUILD} {matrix.hub.name} instead)",
            file=out,
            flush=True,
        )
    for step in steps:
        stage = f" (stage {step.target})" if step.target else ""
        print(f"==> building {step.refs[0]} from {step.dockerfile}{stage}", file=out, flush=True)
        try:
            results.append(
                engine.build(
                    client,
                    step,
                    lambda line, name=step.name: print(f"[{name}] {line}", file=out, flush=True),
                    nocache=args.no_cache,
                    pull=args.pull and step.pull_base,
                    network_mode=args.network,
                )
            )
        except engine.EngineError as e:
            failures.append((step.name, str(e)))
            print(f"==> {step.name} FAILED: {e}", file=out)
    rows = [
        [
            r.step.refs[0],
            r.step.cuda or "-",
            format_size(r.size_bytes),
            format_seconds(r.seconds),
            "ok",
        ]
        for r in results
    ]
    rows += [[name, "-", "-", "-", f"FAILED: {why[:60]}"] for name, why in failures]
    print("\n" + format_table(["IMAGE", "CUDA", "SIZE", "TIME", "RESULT"], rows), file=out)
    built = [r.step.name for r in results if r.step.name in matrix.images]
    if args.catalog_out and built:
        _write_catalog(catalog_document(matrix, built, args.registry), args.catalog_out, out)
    return EXIT_FAILED if failures else EXIT_OK


def cmd_test(args, matrix: Matrix, root: Path, names: list[str], out: TextIO) -> int:
    client = engine.connect()
    gpu = engine.has_nvidia_runtime(client.info())
    failed = 0
    rows = []
    for spec in matrix.select(notebook_names(matrix, names)):
        run = plan_test(
            image_ref(matrix, spec, args.registry, args.target),
            gpu,
            cpu_only=args.cpu,
            stage=args.target,
        )
        print(f"==> testing {run.image}: {run.reason}", file=out, flush=True)
        try:
            result = engine.run_test(client, run)
        except engine.EngineError as e:
            failed += 1
            rows.append([run.image, run.mode, f"FAILED: {e}"])
            continue
        print(result.output.rstrip(), file=out)
        failed += not result.ok
        rows.append(
            [run.image, run.mode, "pass" if result.ok else f"FAIL (exit {result.exit_code})"]
        )
    print("\n" + format_table(["IMAGE", "MODE", "RESULT"], rows), file=out)
    return EXIT_FAILED if failed else EXIT_OK


def cmd_push(args, matrix: Matrix, root: Path, names: list[str], out: TextIO) -> int:
    if K8S_HUB_REBUILD in names:
        raise MatrixError(
            f"{K8S_HUB_REBUILD} is tagged with z2jh's own reference "
            f"({matrix.hub.k8s_hub_ref}) for the local engine only: it is never pushed"
        )
    client = engine.connect()
    steps = plan_builds(
        matrix,
        names,
        context=str(root),
        registry=args.registry,
        package_version=__version__,
        stage=args.target,
    )
    failed = 0
    for step in steps:
        for ref in step.refs:
            print(f"==> pushing {ref}", file=out)
            try:
                digest = engine.push(client, ref, lambda line: print(f"  {line}", file=out))
            except engine.EngineError as e:
                failed += 1
                print(f"==> {ref} FAILED: {e}", file=out)
                continue
            print(f"==> pushed {ref} {digest}".rstrip(), file=out)
    return EXIT_FAILED if failed else EXIT_OK


def cmd_catalog(args, matrix: Matrix, root: Path, names: list[str], out: TextIO) -> int:
    selected = [s.name for s in matrix.select(notebook_names(matrix, names))]
    if args.only_built:
        client = engine.connect()
        selected = [
            n
            for n in selected
            if engine.image_exists(client, image_ref(matrix, matrix.images[n], args.registry))
        ]
        if not selected:
            print("gpuspawner-images: none of these images is built yet.", file=sys.stderr)
            return EXIT_FAILED
    prepuller = prepuller_values(matrix, selected, args.registry)
    if args.z2jh:
        text = yaml.safe_dump(prepuller, sort_keys=False, width=100)
        if args.output and args.output != "-":
            Path(args.output).write_text(text)
        else:
            out.write(text)
        return EXIT_OK
    _write_catalog(catalog_document(matrix, selected, args.registry), args.output, out, prepuller)
    return EXIT_OK


def cmd_facts(args, matrix: Matrix, root: Path, names: list[str], out: TextIO) -> int:
    document = facts_document(matrix, __version__, args.registry)
    if args.catalog:
        document["catalogs"] = {
            path: sorted({spec.image for spec in load_catalog_file(path).images.values()})
            for path in args.catalog
        }
    if args.json:
        out.write(json.dumps(document, indent=2) + "\n")
    else:
        out.write(yaml.safe_dump(document, sort_keys=False, width=100))
    return EXIT_OK


def _pins(root: Path, constraints: str | None) -> dict[str, str]:
    if constraints is None:
        return {}
    try:
        return read_constraints((root / constraints).read_text())
    except OSError:
        # Then a library may have any version: describe still says what is installed.
        return {}


def describe_one(client: Any, matrix: Matrix, root: Path, name: str, args) -> desc.Description:
    spec = matrix.images[name]
    ref = image_ref(matrix, spec, args.registry, args.target)
    labels = engine.image_labels(client, ref)
    if labels is None:
        return desc.failed(spec, ref, args.target, "not built (run gpuspawner-images build)")
    expected = desc.expected_packages(spec, args.target, _pins(root, spec.constraints))
    try:
        code, output = engine.run_python(client, ref, desc.probe_command(expected))
    except engine.EngineError as e:
        return desc.failed(spec, ref, args.target, str(e))
    try:
        answer = desc.parse_probe(output)
    except desc.ProbeError as e:
        return desc.failed(spec, ref, args.target, f"python exited with {code}: {e}")
    return desc.describe(spec, ref, args.target, labels, expected, answer)


def format_description(d: desc.Description) -> str:
    c = desc.clean
    lines = [f"==> {d.image} ({d.name}, stage {d.stage})"]
    if d.error:
        return "\n".join([*lines, f"    {c(d.error)}"])
    lines.append(
        f"    framework {c(d.framework or '-')}  CUDA {c(d.cuda or '-')}  "
        f"Python {c(d.python or '-')}"
    )
    lines += [f"    label {c(k)}={c(v)}" for k, v in sorted(d.labels.items())]
    rows = [
        [p.name, p.role, c(p.installed or "-"), p.expected or "-", p.status.upper()]
        for p in d.packages
    ]
    if rows:
        table = format_table(["PACKAGE", "ROLE", "INSTALLED", "EXPECTED", "STATUS"], rows)
        lines += ["    " + line for line in table.splitlines()]
    return "\n".join(lines)


def cmd_describe(args, matrix: Matrix, root: Path, names: list[str], out: TextIO) -> int:
    client = engine.connect()
    selected = [s.name for s in matrix.select(notebook_names(matrix, names))]
    found = [describe_one(client, matrix, root, name, args) for name in selected]
    if args.json:
        out.write(json.dumps(desc.as_json(found), indent=2) + "\n")
    else:
        print("\n\n".join(format_description(d) for d in found), file=out)
    wrong = [line for d in found for line in desc.problems(d)]
    for line in wrong:
        print(f"gpuspawner-images: {desc.clean(line)}", file=sys.stderr)
    return EXIT_FAILED if wrong else EXIT_OK


def _set_version(root: Path, new: str, out: TextIO) -> None:
    missing = [path for path in VERSION_FILES if not (root / path).is_file()]
    if missing:
        raise ReleaseError(f"{', '.join(missing)} missing under {root}: nothing was changed.")
    texts = {path: (root / path).read_text() for path in VERSION_FILES}
    changed = set_version(texts, __version__, new)
    for path, text in changed.items():
        if text != texts[path]:
            (root / path).write_text(text)
            print(f"wrote {path}", file=out)


def cmd_version(args, matrix: Matrix, root: Path, names: list[str], out: TextIO) -> int:
    if args.set:
        _set_version(root, args.set, out)
    version = args.set or __version__
    names_of = release(version)
    document = {
        "package": names_of.package,
        "chart_version": names_of.chart_version,
        "app_version": names_of.app_version,
        "hub_image": hub_ref(matrix, version, args.registry),
        "k8s_hub": matrix.hub.k8s_hub_ref,
    }
    if args.json:
        out.write(json.dumps(document, indent=2) + "\n")
    else:
        out.write("".join(f"{key}: {value}\n" for key, value in document.items()))
    return EXIT_OK


VERBS = {
    "list": cmd_list,
    "base": cmd_base,
    "build": cmd_build,
    "test": cmd_test,
    "push": cmd_push,
    "catalog": cmd_catalog,
    "facts": cmd_facts,
    "describe": cmd_describe,
    "version": cmd_version,
}


if __name__ == "__main__":
    sys.exit(main())
