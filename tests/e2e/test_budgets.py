"""GPU-hours budgets on real nodes: refusals through the form and the REST API, and a start.

A second hub on the session's cluster runs the e2e catalog plus a daily budget
(``limits.gpu_hours``) and an idle-timeout choice on PyTorch, with its usage store
in a SQLite file this module fills beforehand through the real
:class:`~gpuspawner.accounting.store.UsageStore`: 'bea' has spent her budget, 'bo'
has 6 minutes of his left, and 'cleo' (group 'budgeters') has most of hers.
"""

import time

import pytest
import yaml

from gpuspawner.accounting.store import UsageStore
from gpuspawner.core.labels import ANNOTATION_CHARGE_GROUP, ANNOTATION_IDLE_TIMEOUT
from gpuspawner.core.usage import Interval

from .conftest import (
    E2E_CATALOG,
    browser_log_in,
    ensure_user,
    pod_of,
    server_state,
    stop_server,
    wait_ready,
)

HOUR = 3600.0
TYPES = "select[name='profile-option-pytorch--gpu_type']"
COUNTS = "select[name='profile-option-pytorch--gpus']"
IDLE = "input[name='profile-option-pytorch--idle_timeout']"
#: GPU-hours used in the current period, before the hub starts.
USED = {"bea": 1.0, "bo": 1.9, "cleo": 0.5}


def budget_catalog() -> dict:
    """The e2e catalog with a daily budget whose period began 12 hours ago (whatever the time)."""
    raw = yaml.safe_load(E2E_CATALOG.read_text())
    reset = time.gmtime(time.time() - 12 * HOUR)
    raw["limits"]["gpu_hours"] = {
        "period": "day",
        "reset": f"{reset.tm_hour:02d}:{reset.tm_min:02d}",
        "min_session": "15m",
        "users": {"bea": 1, "bo": 2},
        "groups": {"budgeters": 10},
    }
    raw["images"]["pytorch"]["idle_timeout"] = {"min": "30m", "max": "8h", "default": "1h"}
    return raw


@pytest.fixture(scope="module")
def budget_hub(stack, tmp_path_factory):
    folder = tmp_path_factory.mktemp("budgets")
    url = f"sqlite:///{folder / 'usage.sqlite'}"
    store = UsageStore(url)
    store.migrate()
    end = time.time() - HOUR
    for user, hours in USED.items():
        store.open(
            Interval(
                uid=f"e2e-budget-{user}",
                user=user,
                server="",
                charge_group="",
                gpu_type="a100",
                image="pytorch",
                gpus=1,
                units=1.0,
                start=end - hours * HOUR,
                end=None,
            )
        )
        assert store.close(f"e2e-budget-{user}", end, "pod")
    store.close()
    catalog = folder / "catalog.yaml"
    catalog.write_text(yaml.safe_dump(budget_catalog()))
    hub = stack.start_second_hub(
        "hub-budgets",
        f"c.GPUSpawner.catalog_file = {str(catalog)!r}\nc.GPUSpawner.accounting_db_url = {url!r}\n",
    )
    try:
        yield hub
    finally:
        hub.stop()


def test_a_spent_budget_is_shown_and_refused_on_the_form(budget_hub, browser, kube):
    hub = budget_hub
    ensure_user(hub, "bea")
    page = browser_log_in(browser, hub, "bea", "/hub/spawn")
    try:
        assert page.inner_text("#gpuspawner-budget").startswith(
            "1 of 1 GPU-hours used today; resets "
        )
        # the idle-timeout field sits in PyTorch's block, with the image's bounds (minutes)
        field = page.locator(f"label[for=profile-item-pytorch] {IDLE}")
        assert (field.get_attribute("min"), field.get_attribute("max")) == ("30", "480")
        assert field.input_value() == "60"
        page.check("input[name=profile][value=pytorch]")
        page.select_option(TYPES, "a100")
        page.select_option(COUNTS, "1")
        page.click("input[type=submit], button[type=submit]")
        page.wait_for_load_state()
        text = page.inner_text("body")
        assert "You have used all 1 of your GPU-hours today; your budget resets " in text
        assert "Traceback" not in text
    finally:
        page.context.close()
    assert server_state(hub, "bea") is None and pod_of(kube, "bea") is None
    # the same through REST
    r = hub.api("POST", "/users/bea/server", {"profile": "pytorch", "gpu_type": "a100"})
    assert r.status == 403, r.body
    assert r.json()["message"].startswith("You have used all 1 of your GPU-hours today")


def test_a_budget_too_short_for_the_request_is_a_403_through_rest(budget_hub, kube):
    hub = budget_hub
    ensure_user(hub, "bo")
    r = hub.api("POST", "/users/bo/server", {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"})
    assert r.status == 403, r.body
    message = r.json()["message"]
    assert message.startswith(
        "The 0.1 GPU-hours left of your budget today would run 2 × NVIDIA A100"
    )
    assert "less than 15 min" in message and "choose fewer GPUs, or wait until" in message
    assert server_state(hub, "bo") is None and pod_of(kube, "bo") is None
    # a server without GPUs needs no budget
    r = hub.api("POST", "/users/bo/server", {"profile": "pytorch", "gpus": "0"})
    assert r.status in (201, 202), r.body
    try:
        wait_ready(hub, "bo")
    finally:
        stop_server(hub, "bo")


def test_a_start_within_the_budget_carries_its_charge_group_and_idle_timeout(budget_hub, kube):
    hub = budget_hub
    ensure_user(hub, "cleo")
    r = hub.api("POST", "/groups/budgeters", {"users": ["cleo"]})
    assert r.status in (201, 409), r.body
    r = hub.api(
        "POST",
        "/users/cleo/server",
        {"profile": "pytorch", "gpu_type": "a100", "gpus": "1", "idle_timeout": "45m"},
    )
    assert r.status in (201, 202), r.body
    try:
        wait_ready(hub, "cleo")
        annotations = pod_of(kube, "cleo")["metadata"]["annotations"]
        assert annotations[ANNOTATION_CHARGE_GROUP] == "budgeters"
        assert annotations[ANNOTATION_IDLE_TIMEOUT] == "2700"
    finally:
        stop_server(hub, "cleo")
    # outside the image's bounds: one sentence, no pod
    r = hub.api(
        "POST", "/users/cleo/server", {"profile": "pytorch", "gpus": "1", "idle_timeout": 5}
    )
    assert r.status == 400, r.body
    assert "30" in r.json()["message"] and "480" in r.json()["message"]
