"""Write docs/configuration.md from the help strings of GPUSpawner's own traits.

    .venv/bin/python scripts/config_reference.py > docs/configuration.md

tests/test_docs.py fails when the file is out of date.
"""

from __future__ import annotations

import inspect

from gpuspawner.spawner import GPUSpawner


def own_trait(name: str) -> bool:
    """Defined by GPUSpawner or one of gpuspawner's mixins (not inherited from KubeSpawner)."""
    return any(
        name in cls.__dict__
        for cls in GPUSpawner.__mro__
        if cls.__module__.startswith("gpuspawner.")
    )


def render() -> str:
    lines = [
        "# GPUSpawner configuration reference",
        "",
        "Generated from the traits' help strings by `scripts/config_reference.py`; do not edit by hand.",
        "Every KubeSpawner and Spawner setting applies as well (`c.KubeSpawner.*`), merged with what",
        "GPUSpawner adds.",
        "",
    ]
    for name, trait in sorted(GPUSpawner.class_traits(config=True).items()):
        if not own_trait(name):
            continue
        default = trait.default_value_repr()
        lines += [
            f"## `c.GPUSpawner.{name}`",
            "",
            f"{type(trait).__name__}, default `{default}`",
            "",
            inspect.cleandoc(trait.help),
            "",
        ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(), end="")
