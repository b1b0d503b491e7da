"""One real control plane for the whole test session (built on first use).

Without Go the sandbox tests are skipped with a loud reason; with CI=true that
is a failure instead. See sandbox/gpuspawner_sandbox/testing.py.
"""

from __future__ import annotations

import pytest

from gpuspawner_sandbox import testing


@pytest.fixture(scope="session")
def control_plane_binary(pytestconfig):
    """The control plane binary, built (with progress shown) if needed."""
    return testing.control_plane_binary(pytestconfig)


@pytest.fixture(scope="session")
def control_plane(pytestconfig, tmp_path_factory, control_plane_binary):
    """A running etcd + API server + scheduler + controller manager, shared by the session."""
    state_dir = tmp_path_factory.mktemp("controlplane")
    with testing.running_control_plane(state_dir, pytestconfig, control_plane_binary) as cp:
        yield cp


@pytest.fixture
def namespace(control_plane):
    """A fresh namespace (default ServiceAccount ready), deleted after the test."""
    with testing.temporary_namespace(control_plane) as name:
        yield name
