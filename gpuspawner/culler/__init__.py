"""The GPU-aware idle culler: a JupyterHub service (``gpuspawner-culler``).

``policy`` decides (pure); ``hub``, ``prometheus`` and ``kube`` read and act;
``app`` is the service. Nothing here imports the spawner.
"""
