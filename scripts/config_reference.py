"""Write the configuration references of the spawner, the culler and the admin service.

    .venv/bin/python scripts/config_reference.py          # rewrite all three
    .venv/bin/python scripts/config_reference.py --check  # exit 1 if one is out of date

Each reference is generated the same way, from the help strings of the
traits gpuspawner defines (inherited KubeSpawner, Spawner and Application
settings are left out), below the marker line of its page:
docs/configuration.md (``c.GPUSpawner``), docs/culler.md (``c.GPUCuller``),
docs/admin.md (``c.GPUAdmin``) and docs/userservice.md (``c.UserService``). tests/test_docs.py fails when one is out of date.
"""

from __future__ import annotations

import inspect
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
MARKER = (
    "<!-- generated from the traits by `python scripts/config_reference.py`; do not edit below -->"
)


@dataclass(frozen=True)
class Reference:
    page: str  # relative to the repository
    module: str
    name: str  # the configurable class, as admins write it: c.<name>.<setting>

    def cls(self) -> Any:
        return getattr(__import__(self.module, fromlist=[self.name]), self.name)


REFERENCES = (
    Reference("docs/configuration.md", "gpuspawner.hub.spawner", "GPUSpawner"),
    Reference("docs/culler.md", "gpuspawner.culler.app", "GPUCuller"),
    Reference("docs/admin.md", "gpuspawner.admin.service", "GPUAdmin"),
    Reference("docs/userservice.md", "gpuspawner.userservice.app", "UserService"),
)


def _ours(cls: Any) -> list[type]:
    return [c for c in cls.__mro__ if c.__module__.startswith("gpuspawner.")]


def own_traits(cls: Any) -> dict[str, Any]:
    """The config traits defined by gpuspawner's classes (the class and its gpuspawner mixins)."""
    ours = _ours(cls)
    return {
        name: trait
        for name, trait in sorted(cls.class_traits(config=True).items())
        if any(name in c.__dict__ for c in ours)
    }


def _dynamic_default(cls: Any, name: str) -> bool:
    """The default is computed at start (from the environment), so its help says what it is."""
    return any(name in c.__dict__.get("_trait_default_generators", {}) for c in _ours(cls))


def command_line_flags(cls: Any, name: str) -> list[str]:
    """The short command-line forms of a setting (``--cull-every``, ``--dry-run``)."""
    found = [
        f"--{alias}"
        for alias, target in (getattr(cls, "aliases", None) or {}).items()
        if target == f"{cls.__name__}.{name}"
    ]
    for flag, (config, _) in (getattr(cls, "flags", None) or {}).items():
        if dict(config.get(cls.__name__, {})) == {name: True}:
            found.append(f"--{flag}")
    return found


def render(reference: Reference) -> str:
    cls = reference.cls()
    traits = own_traits(cls)
    any_flags = any(command_line_flags(cls, name) for name in traits)
    head = "| setting | type | default |" + (" flag |" if any_flags else "")
    rule = "|---|---|---|" + ("---|" if any_flags else "")
    rows, sections = [head, rule], []
    for name, trait in traits.items():
        default = "(see below)" if _dynamic_default(cls, name) else trait.default_value_repr()
        kind = type(trait).__name__
        row = f"| [`{name}`](#{name.replace('_', '-')}) | {kind} | `{default}` |"
        if any_flags:
            row += " " + ", ".join(f"`{f}`" for f in command_line_flags(cls, name)) + " |"
        rows.append(row)
        sections += [
            f"### {name}",
            "",
            f"`c.{reference.name}.{name}` — {kind}, default `{default}`",
            "",
            inspect.cleandoc(trait.help),
            "",
        ]
    return "\n".join(["", *rows, "", *sections])


def current(reference: Reference) -> tuple[Path, str, str]:
    """(path, the page as it is, the page as it should be)."""
    path = REPO / reference.page
    text = path.read_text()
    if MARKER not in text:
        raise SystemExit(f"{reference.page} has no marker line: add {MARKER}")
    head = text.split(MARKER, 1)[0]
    return path, text, head + MARKER + "\n" + render(reference)


def main(argv: list[str]) -> int:
    stale = []
    for reference in REFERENCES:
        path, text, wanted = current(reference)
        if text == wanted:
            continue
        stale.append(reference.page)
        if "--check" not in argv:
            path.write_text(wanted)
    if "--check" in argv and stale:
        print(f"out of date: {', '.join(stale)}; run: python scripts/config_reference.py")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
