"""The GPU-aware idle culler: a JupyterHub service (``gpuspawner-culler``).

``policy`` decides (pure); ``pods`` reads GPUSpawner's pods (through
:mod:`gpuspawner.core.serverpod`); ``hub`` and ``prometheus`` turn the shared
clients' answers (:mod:`gpuspawner.clients`) into the policy's input; the pods
are listed with :mod:`gpuspawner.clients.kube`; ``app`` is the service. Nothing here
imports the spawner.
"""
