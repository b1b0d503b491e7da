"""The hub's user models -> the culler's servers."""

from __future__ import annotations

import pytest

from gpuspawner.culler.hub import servers_from_user


def test_servers_from_a_user_model():
    user = {
        "kind": "user",
        "name": "alice",
        "admin": True,
        "groups": ["ml-research"],
        "servers": {
            "": {
                "name": "",
                "ready": True,
                "pending": None,
                "started": "2026-11-29T10:00:00.000000Z",
                "last_activity": "2026-11-29T11:30:00.123456Z",
                "user_options": {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"},
                "state": {"pod_name": "jupyter-alice", "namespace": "jupyterhub"},
            },
            "exp": {
                "name": "exp",
                "ready": False,
                "pending": "spawn",
                "started": None,
                "last_activity": None,
                "user_options": {"gpu_type": "h100"},
            },
            "cpu": {"name": "cpu", "ready": True, "user_options": {}},
        },
    }
    default, exp, cpu = servers_from_user(user)
    assert (default.user, default.name, default.admin, default.groups) == (
        "alice",
        "",
        True,
        frozenset({"ml-research"}),
    )
    assert (default.profile, default.gpu_type, default.gpus) == ("pytorch", "a100", 2)
    assert (default.pod, default.namespace) == ("jupyter-alice", "jupyterhub")
    assert default.last_activity - default.started == pytest.approx(5400.123456)
    # a type without a count gets the type's smallest count: at least one GPU
    assert (exp.gpu_type, exp.gpus, exp.pending, exp.ready) == ("h100", 1, "spawn", False)
    assert (cpu.gpu_type, cpu.gpus, cpu.pod) == (None, 0, None)
    del user["groups"]  # what a token without read:users:groups sees
    assert all(s.groups is None for s in servers_from_user(user))
