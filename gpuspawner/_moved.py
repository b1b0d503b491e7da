"""Import paths of modules that moved into the layer folders, kept working.

Until 0.1 the modules sat side by side in ``gpuspawner/``; docs, configs and
admins' ``jupyterhub_config.py`` files name them there (``from
gpuspawner.hubpages import configure``, ``python -m gpuspawner.startup``).
Each old name resolves to the module at its new place, the same module object,
so nothing is loaded twice and ``python -m`` runs the new module.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from types import CodeType, ModuleType

#: Old module name -> where the module lives now.
MOVED: dict[str, str] = {
    "gpuspawner.admission": "gpuspawner.core.admission",
    "gpuspawner.catalog": "gpuspawner.core.catalog",
    "gpuspawner.labels": "gpuspawner.core.labels",
    "gpuspawner.limits": "gpuspawner.core.limits",
    "gpuspawner.options": "gpuspawner.core.options",
    "gpuspawner.podspec": "gpuspawner.core.podspec",
    "gpuspawner.profiles": "gpuspawner.core.profiles",
    "gpuspawner.serverpod": "gpuspawner.core.serverpod",
    "gpuspawner.stopnotice": "gpuspawner.core.stopreasons",
    "gpuspawner.kube": "gpuspawner.clients.kube",
    "gpuspawner.services": "gpuspawner.clients",
    "gpuspawner.services.hub": "gpuspawner.clients.hubapi",
    "gpuspawner.services.prometheus": "gpuspawner.clients.prometheus",
    "gpuspawner.services.settings": "gpuspawner.clients.settings",
    "gpuspawner.spawner": "gpuspawner.hub.spawner",
    "gpuspawner.capacity": "gpuspawner.hub.capacity",
    "gpuspawner.compat": "gpuspawner.hub.compat",
    "gpuspawner.hubpages": "gpuspawner.hub.pages",
    "gpuspawner.hubstate": "gpuspawner.hub.state",
    "gpuspawner.metrics": "gpuspawner.hub.metrics",
    "gpuspawner.serverprobe": "gpuspawner.hub.serverprobe",
    "gpuspawner.startgate": "gpuspawner.hub.startturns",
    "gpuspawner.startup": "gpuspawner.hub.catalogcheck",
    "gpuspawner.inventory.web": "gpuspawner.hub.formscript",
    "gpuspawner.culler.notices": "gpuspawner.culler.annotations",
    "gpuspawner.culler.warning": "gpuspawner.culler.warningapi",
}


class MovedModules(importlib.abc.MetaPathFinder, importlib.abc.InspectLoader):
    """Finds an old module name and hands out the module at its new place."""

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname not in MOVED:
            return None
        return importlib.util.spec_from_loader(fullname, self, is_package=False)

    def create_module(self, spec) -> ModuleType:
        return importlib.import_module(MOVED[spec.name])

    def exec_module(self, module: ModuleType) -> None:
        """Nothing to run: the module ran when it was imported at its new place."""

    def get_code(self, fullname: str) -> CodeType:
        # ``python -m <old name>``: run the new module as ``__main__`` at its own
        # place, so that its relative imports resolve there.
        source = f"import runpy\nrunpy.run_module({MOVED[fullname]!r}, run_name='__main__', alter_sys=True)\n"
        return compile(source, f"<{fullname}, moved to {MOVED[fullname]}>", "exec")

    def get_source(self, fullname: str) -> None:
        return None


def install() -> None:
    """Let the old names be imported (once per process)."""
    if not any(isinstance(finder, MovedModules) for finder in sys.meta_path):
        # ahead of the path finder, which would load a second copy of a moved
        # package's submodule (gpuspawner.services.hub) from its new folder
        sys.meta_path.insert(0, MovedModules())
