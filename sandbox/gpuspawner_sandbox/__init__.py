"""A local GPU cluster: a real Kubernetes control plane and real nodes over emulated GPUs.

See docs/sandbox.md for what is real and what is emulated.
"""
