"""The hub's servers as the culler sees them: one :class:`~gpuspawner.culler.policy.Server` each.

The requests themselves go through :class:`~gpuspawner.clients.hubapi.HubClient`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..clients.hubapi import HubClient, parse_time
from ..core.options import OPTION_GPU_TYPE, OPTION_GPUS, OPTION_PROFILE, parse_count
from .policy import Server


def servers_from_user(user: Mapping[str, Any]) -> list[Server]:
    """A user model from ``GET /users`` -> one :class:`Server` per server.

    Profile, GPU type and count come from the server's ``user_options``
    (GPUSpawner's keys); the pod name and namespace from its ``state`` when the
    culler may read it (``admin:server_state``, KubeSpawner keeps them there).
    Pods read from Kubernetes override both (see ``with_pods``).
    """
    result = []
    # without read:users:groups the model has no "groups": unknown, not "none"
    groups = frozenset(user["groups"]) if "groups" in user else None
    for name, model in (user.get("servers") or {}).items():
        # user_options are whatever the user sent: only strings are read from them
        options = model.get("user_options")
        options = options if isinstance(options, Mapping) else {}
        state = model.get("state")
        state = state if isinstance(state, Mapping) else {}
        profile = options.get(OPTION_PROFILE)
        gpu_type = options.get(OPTION_GPU_TYPE)
        gpu_type = gpu_type if isinstance(gpu_type, str) and gpu_type else None
        gpus = parse_count(options.get(OPTION_GPUS))
        if gpus is None:
            # A type without a count gets the type's smallest count (at least 1).
            gpus = 1 if gpu_type else 0
        result.append(
            Server(
                user=user["name"],
                name=name,
                admin=bool(user.get("admin")),
                groups=groups,
                ready=bool(model.get("ready")),
                pending=model.get("pending"),
                started=parse_time(model.get("started")),
                last_activity=parse_time(model.get("last_activity")),
                profile=profile if isinstance(profile, str) and profile else None,
                gpu_type=gpu_type if gpus > 0 else None,
                gpus=gpus,
                pod=state.get("pod_name"),
                namespace=state.get("namespace"),
            )
        )
    return result


async def list_servers(hub: HubClient) -> list[Server]:
    """Every server of every user with an active server, read page by page."""
    servers = []
    async for user in hub.iter_users():
        servers.extend(servers_from_user(user))
    return servers
