"""gpuspawner-jupyterlab: gpuspawner-culler's warning and this server's GPU load, inside JupyterLab.

The server part (``/gpuspawner/warning`` and ``/gpuspawner/gpu-status`` on this
server) asks the culler's ``/api/warning`` and ``/api/gpu-status`` with the
server's own hub token; the lab part polls them, shows a JupyterLab
notification once per warning (with the culler's "Keep for 1 h" choices, posted
to ``/gpuspawner/keep`` and forwarded to its ``/api/keep``), and a status-bar item (with a panel of the last
hour) for this server's GPUs.
"""

from __future__ import annotations

__version__ = "0.1.0"


def _jupyter_labextension_paths() -> list[dict]:
    return [{"src": "labextension", "dest": "gpuspawner-jupyterlab"}]


def _jupyter_server_extension_points() -> list[dict]:
    return [{"module": "gpuspawner_jupyterlab"}]


def _load_jupyter_server_extension(serverapp) -> None:
    from .handlers import setup_handlers

    setup_handlers(serverapp)
