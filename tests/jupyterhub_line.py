"""Which tests depend on the JupyterHub line, so that the second line runs only those.

``make test`` runs the unit and hub-level tests on JupyterHub 6.1 + KubeSpawner 7.1, then
again on 5.5 + 7.0 (zero-to-jupyterhub 4.4.0's hub). The two virtualenvs differ only in
``jupyterhub`` and ``jupyterhub-kubespawner`` (.ci/jupyterhub-*.txt): a test that reaches
neither gives the same answer on both, and runs once. ``pytest --jupyterhub-line-only``
(the second line's run) deselects those and says how many.

A test module depends on the line when, by the import graph (grimp, import-linter's own),
it or a conftest.py on its path imports ``jupyterhub``, ``kubespawner`` or
:mod:`gpuspawner_sandbox.hubprocess` (which starts a ``jupyterhub``), or when it starts
Python subprocesses (``sys.executable``), whose imports the graph cannot see: those run on
both lines unless :data:`SAME_ON_EVERY_LINE` says why not.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
#: What a test must reach to depend on the JupyterHub line.
LINE_MODULES = ("jupyterhub", "kubespawner", "gpuspawner_sandbox.hubprocess")
#: Modules that start Python subprocesses yet do not depend on the line, and why.
SAME_ON_EVERY_LINE = {
    "tests.test_packaging": "its clean venv installs under .ci/jupyterhub-6.1.txt on every line",
}


def module_name(path: Path) -> str:
    """``tests/core/test_x.py`` -> ``tests.core.test_x``."""
    relative = path.resolve().relative_to(TESTS.parent).with_suffix("")
    return ".".join(relative.parts)


@functools.lru_cache(maxsize=1)
def _graph():
    import grimp

    return grimp.build_graph(
        "tests", "gpuspawner", "gpuspawner_sandbox", include_external_packages=True
    )


def reaches_the_line(module: str) -> bool:
    """Whether ``module`` imports, directly or through others, what differs between lines."""
    graph = _graph()
    return any(
        target in graph.modules and graph.chain_exists(module, target, as_packages=True)
        for target in LINE_MODULES
    )


def conftests_of(path: Path) -> list[str]:
    """The conftest modules pytest loads for a test file, from tests/ down to its folder."""
    names = []
    folder = path.resolve().parent
    while folder == TESTS or TESTS in folder.parents:
        if (folder / "conftest.py").is_file():
            names.append(module_name(folder / "conftest.py"))
        folder = folder.parent
    return names


@functools.cache
def depends_on_the_line(path: Path) -> bool:
    """Whether the test file at ``path`` can answer differently on another JupyterHub line."""
    module = module_name(path)
    if module in SAME_ON_EVERY_LINE:
        return False
    if "sys.executable" in path.read_text(encoding="utf-8"):
        return True
    return any(reaches_the_line(m) for m in [module, *conftests_of(path)])


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--jupyterhub-line-only",
        action="store_true",
        default=False,
        help="run only the tests whose answer can depend on the JupyterHub line "
        "(tests/jupyterhub_line.py); the rest ran on the first line",
    )


def select(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect, when asked, the tests that do not depend on the JupyterHub line."""
    if not config.getoption("--jupyterhub-line-only", default=False):
        return
    keep, drop = [], []
    for item in items:
        (keep if depends_on_the_line(Path(str(item.fspath))) else drop).append(item)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
