"""Reading hub configurations in tests: lazy settings resolved, sub-configs, Helm's merge."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from traitlets.config import Config, LazyConfigValue
from traitlets.config.loader import PyFileConfigLoader

#: A parent config with a service and a role of its own, as the harness's hub config has.
PARENT_WITH_A_TESTER = (
    "c.JupyterHub.services = [{'name': 'tester'}]\n"
    "c.JupyterHub.load_roles = [{'name': 'tester', 'scopes': ['admin:users']}]\n"
)


def final(value: Any, default: Any = None) -> Any:
    """A setting as the hub will load it (a lazy value applied to the default, [] if none)."""
    if isinstance(value, LazyConfigValue):
        return copy.deepcopy(value).get_value([] if default is None else default)
    return value


def load_as_subconfig(tmp_path: Path, sub: str, parent: str = PARENT_WITH_A_TESTER) -> Config:
    """Load ``sub`` with ``load_subconfig`` after ``parent``, as the sandbox's hub config is."""
    (tmp_path / "sub.py").write_text("c = get_config()\n" + sub)
    (tmp_path / "main.py").write_text(
        f"c = get_config()\n{parent}load_subconfig({str(tmp_path / 'sub.py')!r})\n"
    )
    return PyFileConfigLoader("main.py", path=str(tmp_path)).load_config()


def helm_merged(defaults: dict, override: dict) -> dict:
    """Helm's merge of a values file over the chart's values.yaml (maps merge, the rest replaces)."""
    out = copy.deepcopy(defaults)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = helm_merged(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out
