"""gpuspawner: a KubeSpawner for a shared pool of GPUs."""

from . import _moved
from ._version import __version__

_moved.install()


def __getattr__(name: str):
    # Importing the spawner pulls in JupyterHub and kubernetes_asyncio; the
    # culler, image tool and sandbox import gpuspawner's core without them.
    if name == "GPUSpawner":
        from .hub.spawner import GPUSpawner

        return GPUSpawner
    if name == "check_catalog":
        from .hub.catalogcheck import check_catalog

        return check_catalog
    if name == "setup":
        from .hubsetup import setup

        return setup
    raise AttributeError(name)


__all__ = ["GPUSpawner", "__version__", "check_catalog", "setup"]
