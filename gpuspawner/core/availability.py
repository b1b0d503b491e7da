"""A GPU type's figures across the nodes that serve it: what admission and the form decide on (pure).

The inventory (:mod:`gpuspawner.inventory.model`) counts them from nodes and
pods; the core's decisions (:mod:`gpuspawner.core.admission`,
:mod:`gpuspawner.core.profiles`) read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Any


@dataclass(frozen=True, slots=True)
class NodeFigures:
    """One node's figures for one resource."""

    node: str
    allocatable: int
    requested: int
    state: str = "ready"

    @property
    def free(self) -> int:
        return max(self.allocatable - self.requested, 0)


@dataclass(frozen=True)
class Availability:
    """A GPU type's figures across the nodes that serve it."""

    key: str
    resource: str
    display_name: str
    nodes: tuple[NodeFigures, ...]  # ready, schedulable nodes serving the type
    excluded: tuple[NodeFigures, ...] = ()  # cordoned or NotReady nodes that would serve it
    pending: int = 0  # unbound pods waiting for this resource
    #: The one namespace whose pods were counted; "" when pods of every namespace were.
    #: With one namespace, GPUs held by pods elsewhere look free (see Inventory.pods_namespace).
    pods_namespace: str = ""

    @cached_property
    def allocatable(self) -> int:
        return sum(n.allocatable for n in self.nodes)

    @cached_property
    def requested(self) -> int:
        return sum(min(n.requested, n.allocatable) for n in self.nodes)

    @cached_property
    def free(self) -> int:
        return sum(n.free for n in self.nodes)

    @cached_property
    def largest_free(self) -> int:
        """The most GPUs free on one node: the largest request that fits now."""
        return max((n.free for n in self.nodes), default=0)

    @cached_property
    def largest_node(self) -> int:
        """The most GPUs one node has: the largest request that can ever fit."""
        return max((n.allocatable for n in self.nodes), default=0)

    def fits_now(self, count: int) -> bool:
        return count <= self.largest_free

    def fits_ever(self, count: int) -> bool:
        return count <= self.largest_node

    def as_dict(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "resource": self.resource,
            "display_name": self.display_name,
            "allocatable": self.allocatable,
            "requested": self.requested,
            "free": self.free,
            "largest_free": self.largest_free,
            "largest_node": self.largest_node,
            "pending": self.pending,
            "nodes": len(self.nodes),
            "excluded_nodes": len(self.excluded),
            "pods_namespace": self.pods_namespace,
        }
