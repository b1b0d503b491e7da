"""Spawners the culler's tests run inside a real hub (imported by the hub process by name).

``SingleuserSpawner`` starts a real ``jupyterhub-singleuser`` on 127.0.0.1 and,
like KubeSpawner, keeps the name and namespace of "its pod" in its state, so the
culler matches DCGM metrics (labelled by pod) to the server.

``NoProcessSpawner`` starts nothing and reports running: 5,000 such servers
cost the hub only its database rows and proxy routes (the benchmark).
"""

import os

from jupyterhub.spawner import SimpleLocalProcessSpawner, Spawner

NAMESPACE = "culler-test"


def pod_name(user: str, server: str = "") -> str:
    return f"jupyter-{user}--{server}" if server else f"jupyter-{user}"


class SingleuserSpawner(SimpleLocalProcessSpawner):
    def get_state(self):
        state = super().get_state()
        state["pod_name"] = pod_name(self.user.name, self.name)
        state["namespace"] = NAMESPACE
        return state


class NoProcessSpawner(Spawner):
    """A server that is "running" without a process: for load tests of the hub API only."""

    async def start(self):
        # every server "is" one tiny HTTP server the benchmark runs, so that the
        # hub's check that a new server answers passes at once
        return ("127.0.0.1", int(os.environ["CULLER_BENCH_SERVER_PORT"]))

    async def poll(self):
        return None

    async def stop(self, now=False):
        return None

    def get_state(self):
        state = super().get_state()
        state["pod_name"] = pod_name(self.user.name, self.name)
        state["namespace"] = NAMESPACE
        return state
