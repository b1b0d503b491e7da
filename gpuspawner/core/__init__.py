"""The pure core: decisions and the vocabulary every other layer shares.

Nothing here does I/O or imports JupyterHub, KubeSpawner or a client: each
module takes data and returns data. The hub glue (:mod:`gpuspawner.hub`), the
services (:mod:`gpuspawner.culler`, :mod:`gpuspawner.admin`,
:mod:`gpuspawner.userservice`) and the clients (:mod:`gpuspawner.clients`)
build on it. See docs/architecture.md.
"""
