"""The hub glue: GPUSpawner (a KubeSpawner), hub-wide state, the hub's pages and metrics.

Everything here runs inside the JupyterHub process. It decides with
:mod:`gpuspawner.core`, sees the cluster through :mod:`gpuspawner.inventory`
and talks to Kubernetes through :mod:`gpuspawner.clients`. No service imports
it. See docs/architecture.md.
"""
