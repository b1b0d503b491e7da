import pytest

from ..conftest import FIXTURES
from .hubprocess import start_hub

OFFLINE_KUBECONFIG = str(FIXTURES / "k8s-offline" / "kubeconfig.yaml")


@pytest.fixture(scope="module")
def gpu_hub(tmp_path_factory):
    """A real hub + proxy running GPUSpawner with the pools catalog, against an unreachable API.

    Every request these tests make is refused before a pod would be created,
    so no Kubernetes API is needed; any attempt to reach it would fail at once.
    """
    catalog = FIXTURES / "catalogs" / "pools.yaml"
    hub = start_hub(
        tmp_path_factory.mktemp("hub"),
        extra_config=f"""
c.GPUSpawner.catalog_file = {str(catalog)!r}
c.JupyterHub.load_groups = {{"students": {{"users": ["sam"]}}}}
from gpuspawner import check_catalog
check_catalog(c)
""",
        env={"KUBECONFIG": OFFLINE_KUBECONFIG},
    )
    if hub.process.poll() is not None:
        pytest.fail(f"JupyterHub exited during start:\n{hub.log()[-3000:]}")
    yield hub
    hub.stop()


@pytest.fixture
def usage_store(tmp_path):
    """A migrated usage store in a fresh SQLite file (as the hub's own database would hold it)."""
    from gpuspawner.accounting.store import UsageStore

    store = UsageStore(f"sqlite:///{tmp_path / 'hub.sqlite'}")
    store.migrate()
    yield store
    store.close()
