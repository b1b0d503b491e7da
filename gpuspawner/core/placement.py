"""Where the admin puts every server pod: the node selector and tolerations (pure)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Placement:
    """The node placement the admin gives every pod (KubeSpawner's settings of the same names)."""

    node_selector: Mapping[str, str]
    tolerations: Sequence[Mapping[str, Any]]
