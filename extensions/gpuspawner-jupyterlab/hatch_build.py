"""Build the labextension (npm + @jupyterlab/builder) before hatchling packs the wheel.

Skipped when the built labextension is newer than its sources, so a wheel
can be built again without Node.js once it was built here.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

SOURCES = ("package.json", "src/index.js", "src/gpustatus.js")
BUILT = Path("gpuspawner_jupyterlab") / "labextension" / "package.json"


def is_current(root: Path) -> bool:
    built = root / BUILT
    if not built.exists():
        return False
    return all(built.stat().st_mtime >= (root / s).stat().st_mtime for s in SOURCES)


class LabExtensionHook(BuildHookInterface):
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict) -> None:
        root = Path(self.root)
        if self.target_name != "wheel" or is_current(root):
            return
        npm = shutil.which("npm")
        if npm is None:
            raise RuntimeError(
                "Building gpuspawner-jupyterlab's labextension needs Node.js 18+ with npm: "
                "install them (e.g. apt-get install nodejs npm) and build again."
            )
        for args in (["install", "--no-audit", "--no-fund", "--loglevel=error"], ["run", "build"]):
            subprocess.run([npm, *args], cwd=root, check=True)
