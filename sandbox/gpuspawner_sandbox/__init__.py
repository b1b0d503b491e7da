"""A local GPU cluster: a real Kubernetes control plane with emulated GPU nodes.

See docs/sandbox.md for what is real and what is emulated.
"""
