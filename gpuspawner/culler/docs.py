"""The configuration reference of ``docs/culler.md``, generated from the traits' help strings.

    .venv/bin/python -m gpuspawner.culler.docs docs/culler.md

rewrites everything below the marker line of that file; tests/culler/test_app.py
fails when it is out of date.
"""

from __future__ import annotations

import inspect
import sys
from pathlib import Path

MARKER = "<!-- generated from the traits by `python -m gpuspawner.culler.docs docs/culler.md`; do not edit below -->"


def render() -> str:
    from ..services.settings import HubServiceSettings, KubernetesSettings, PrometheusSettings
    from .app import GPUCuller

    flags = {trait: flag for flag, trait in GPUCuller.aliases.items()}
    lines = ["", "| setting | type | default | flag |", "|---|---|---|---|"]
    sections = []
    for name, trait in GPUCuller.class_traits(config=True).items():
        shared = (GPUCuller, HubServiceSettings, KubernetesSettings, PrometheusSettings)
        if not any(name in cls.__dict__ for cls in shared):
            continue
        default = trait.default_value_repr()
        if name in ("hub_api_url", "api_token", "namespace", "metrics_url"):
            default = "(see below)"
        flag = flags.get(f"GPUCuller.{name}")
        flag_text = f"`--{flag}`" if flag else ""
        if name == "dry_run":
            flag_text = "`--dry-run`"
        elif name == "once":
            flag_text = "`--once`"
        lines.append(
            f"| [`{name}`](#{name.replace('_', '-')}) | {type(trait).__name__} | `{default}` | {flag_text} |"
        )
        sections += [f"### {name}", "", " ".join(inspect.cleandoc(trait.help).split()), ""]
    return "\n".join([*lines, "", *sections])


def write(path: Path) -> None:
    text = path.read_text()
    head = text.split(MARKER)[0]
    path.write_text(head + MARKER + "\n" + render())


if __name__ == "__main__":
    write(Path(sys.argv[1]))
