"""The configuration reference: the settings gpuspawner defines, with their command-line flags.

autodoc-traits' ``autoconfigurable`` lists every ``config=True`` trait of a class,
KubeSpawner's, Spawner's and Application's included (hundreds for GPUSpawner); those
are documented by their own projects, and admins look here for what gpuspawner adds.
So a trait is shown when one of gpuspawner's classes (the class or one of its
gpuspawner mixins) defines it. Each entry also says its short command-line flags
(``--dry-run``) and, where the default is computed at start (from the environment
the hub gives a service), says so, since the default autodoc-traits prints is then
only the trait's static one.
"""

from __future__ import annotations

from typing import Any

from traitlets import MetaHasTraits, TraitType


def defined_by_gpuspawner(trait: TraitType) -> bool:
    """Whether one of gpuspawner's classes defines (or redefines) the trait."""
    owner = getattr(trait, "this_class", None)
    return owner is not None and owner.__module__.startswith("gpuspawner.")


def command_line_flags(cls: MetaHasTraits, name: str) -> list[str]:
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


def computed_default(cls: MetaHasTraits, name: str) -> bool:
    """Whether a gpuspawner class computes the default at start (``@default``)."""
    return any(
        name in klass.__dict__.get("_trait_default_generators", {})
        for klass in cls.__mro__
        if klass.__module__.startswith("gpuspawner.")
    )


def notes(cls: MetaHasTraits, name: str) -> list[str]:
    """The reStructuredText lines added below a setting's help."""
    lines = []
    flags = command_line_flags(cls, name)
    if flags:
        lines.append("Command line: " + ", ".join(f"``{flag}``" for flag in flags))
    if computed_default(cls, name):
        lines.append("The default is computed at start, as the help above says.")
    return [part for line in lines for part in ("", line)]  # one paragraph each


def _skip_inherited_trait(
    app: Any, what: str, name: str, obj: Any, skip: bool, options: Any
) -> bool | None:
    if not isinstance(obj, TraitType):
        return None  # not a trait: autodoc decides
    return None if defined_by_gpuspawner(obj) else True


def _add_notes(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    if not isinstance(obj, TraitType):
        return
    owner, _, trait_name = name.rpartition(".")
    module, _, class_name = owner.rpartition(".")
    cls = getattr(__import__(module, fromlist=[class_name]), class_name, None)
    if isinstance(cls, MetaHasTraits):
        lines.extend(notes(cls, trait_name))


def setup(app: Any) -> dict[str, Any]:
    app.connect("autodoc-skip-member", _skip_inherited_trait)
    app.connect("autodoc-process-docstring", _add_notes)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
