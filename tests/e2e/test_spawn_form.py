"""A data scientist's path in a real browser: the spawn form, a refusal on the form, a GPU server.

Both forms: KubeSpawner's own, whose figures the gpuspawner service keeps
current, and jupyterhub-fancy-profiles', whose labels say when they were counted.
"""

import re

import pytest

from gpuspawner.hub.formscript import LIVE_NOTE, OWN_NAMESPACE_NOTE

from .conftest import (
    browser_log_in,
    ensure_user,
    hub_with,
    pod_of,
    server_state,
    stop_server,
    wait_for,
)

TYPES = "select[name='profile-option-pytorch--gpu_type']"
COUNTS = "select[name='profile-option-pytorch--gpus']"
COUNT_NAMES = {"0": "None (CPU only)", "1": "1 GPU", "2": "2 GPUs"}


def options_of(page, select):
    """(value, text) of each option of a <select>, as the browser shows them now."""
    return page.eval_on_selector_all(
        f"{select} option", "options => options.map(o => [o.value, o.text])"
    )


def profiles_on(page):
    return page.eval_on_selector_all("input[name=profile]", "inputs => inputs.map(i => i.value)")


def availability_seen_by(page, hub):
    """The gpuspawner service's figures, fetched with the page's own login (OAuth to the service)."""
    response = page.request.get(f"{hub.public_url}/services/gpuspawner/availability")
    assert response.ok, response.text()
    return response.json()


def test_form_shows_the_users_choices_with_live_figures(browser, hub):
    page = browser_log_in(browser, hub, "dora", "/hub/spawn")
    # one profile: the e2e catalog's other image is only for the group 'licensed'
    assert profiles_on(page) == ["pytorch"]
    assert page.inner_text("label[for=profile-item-pytorch] h3") == "PyTorch"
    assert page.inner_text("label[for=profile-option-pytorch--gpu_type]") == "GPU type"
    assert page.inner_text("label[for=profile-option-pytorch--gpus]") == "Number of GPUs"

    def shown_as_the_endpoint_says():
        # the form's script relabels from the same figures the endpoint serves (polled every 10 s)
        payload = availability_seen_by(page, hub)
        if not payload["available"]:
            return None
        types = payload["types"]
        expected_types = [
            ["a100", f"NVIDIA A100 \u2014 {types['a100']['label']}"],
            ["h100", f"NVIDIA H100 \u2014 {types['h100']['label']}"],
            ["a100-1g", f"NVIDIA A100 MIG 1g.5gb \u2014 {types['a100-1g']['label']}"],
        ]
        selected = page.eval_on_selector(TYPES, "s => s.value")
        marks = types[selected]["counts"]
        # dora's limit is 2: no more is offered; a count none of the type's nodes can hold
        # now is marked as the endpoint marks it
        expected_counts = [
            [n, f"{name} ({marks[n]})" if n != "0" and marks[n] else name]
            for n, name in COUNT_NAMES.items()
        ]
        now = (options_of(page, TYPES), options_of(page, COUNTS))
        return payload if now == (expected_types, expected_counts) else None

    payload = wait_for(shown_as_the_endpoint_says, 40, what="the form's figures and counts")
    # the figures are the cluster's: 2 nodes of 4 A100, 1 node of 8 H100 (counted, not hard-coded
    # here: free GPUs change as other tests' servers come and go)
    a100 = payload["types"]["a100"]
    assert (a100["allocatable"], a100["largest_node"], a100["nodes"]) == (8, 4, 2)
    assert a100["label"] == (
        f"{a100['free']} free of 8 (at most {a100['largest_free']} on one node)"
    )
    assert payload["images"] == {"pytorch": ["a100", "h100", "a100-1g"]}
    # the hub counts its own namespace's pods (the default), and says so
    assert payload["pods_namespace"] == "jupyterhub"
    assert page.inner_text("#gpuspawner-availability") == f"{LIVE_NOTE} {OWN_NAMESPACE_NOTE}"
    # the catalog default is pre-selected: A100, no GPU
    assert page.eval_on_selector(TYPES, "s => s.value") == "a100"
    assert page.eval_on_selector(COUNTS, "s => s.value") == "0"
    page.context.close()


def test_form_refusal_is_shown_on_the_form_and_a_valid_choice_starts(browser, hub, kube):
    page = browser_log_in(browser, hub, "dora", "/hub/spawn")
    offered = page.eval_on_selector_all(f"{COUNTS} option", "options => options.map(o => o.value)")
    assert offered == ["0", "1", "2"]
    # a stale or tampered form asking for 4 A100 is refused on the server, shown on the form
    page.check("input[name=profile][value=pytorch]")
    page.select_option(TYPES, "a100")
    page.eval_on_selector(COUNTS, "s => { s.add(new Option('4 GPUs', '4')); s.value = '4'; }")
    page.click("input[type=submit], button[type=submit]")
    page.wait_for_load_state()
    text = page.inner_text("body")
    assert "You asked for 4 GPUs but your limit is 2. Ask for 2 or fewer." in text
    assert "Traceback" not in text and "KeyError" not in text
    assert server_state(hub, "dora") is None
    assert pod_of(kube, "dora") is None

    # another user's open form, never reloaded, follows the cluster (polling the service)
    watcher = browser_log_in(browser, hub, "wendy", "/hub/spawn")
    before = availability_seen_by(watcher, hub)["types"]["a100"]["free"]

    # 2 A100 fits: the spawn goes through the progress page to the notebook
    page.check("input[name=profile][value=pytorch]")
    page.select_option(TYPES, "a100")
    page.select_option(COUNTS, "2")
    page.click("input[type=submit], button[type=submit]")
    try:
        # the progress page sends the browser on to the notebook once it is ready
        page.wait_for_url("**/user/dora/**", wait_until="commit", timeout=120_000)
        wait_for(lambda: (server_state(hub, "dora") or {}).get("ready"), 60, what="dora's server")
        pod = pod_of(kube, "dora")
        assert pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "2"

        def refreshed():
            a100 = availability_seen_by(watcher, hub)["types"]["a100"]
            shown = dict(options_of(watcher, TYPES))["a100"]
            return a100["free"] == before - 2 and shown == f"NVIDIA A100 \u2014 {a100['label']}"

        wait_for(refreshed, 40, what="wendy's open form to show 2 fewer free A100s")
        assert watcher.inner_text("#gpuspawner-availability") == (
            f"{LIVE_NOTE} {OWN_NAMESPACE_NOTE}"
        )
    finally:
        stop_server(hub, "dora")
        page.context.close()
        watcher.context.close()


def test_an_image_for_one_group_exists_only_for_its_members(browser, hub, kube):
    ensure_user(hub, "lin")
    ensure_user(hub, "otto")
    r = hub.api("POST", "/groups/licensed", {"users": ["lin"]})
    assert r.status in (201, 409), r.body
    if r.status == 409:
        assert hub.api("POST", "/groups/licensed/users", {"users": ["lin"]}).status == 200

    member = browser_log_in(browser, hub, "lin", "/hub/spawn")
    other = browser_log_in(browser, hub, "otto", "/hub/spawn")
    try:
        assert profiles_on(member) == ["pytorch", "licensed"]
        assert member.inner_text("label[for=profile-item-licensed] h3") == "PyTorch (licensed)"
        assert profiles_on(other) == ["pytorch"]
        assert "licensed" not in other.content()
        # the live figures are per user as well
        assert "licensed" in wait_for(
            lambda: availability_seen_by(member, hub)["images"], 40, what="lin's figures"
        )
        assert list(
            wait_for(lambda: availability_seen_by(other, hub)["images"], 40, what="otto's figures")
        ) == ["pytorch"]
    finally:
        member.context.close()
        other.context.close()

    # asked for by REST anyway: the same 403 as an image that does not exist, and no pod
    answers = []
    for profile in ("licensed", "jax"):
        r = hub.api("POST", "/users/otto/server", {"profile": profile, "gpus": "0"})
        answers.append((r.status, r.json()["message"].replace(profile, "X")))
    assert (
        answers[0]
        == answers[1]
        == (
            403,
            "There is no profile 'X' you may use: choose one of 'pytorch' (PyTorch).",
        )
    )
    assert server_state(hub, "otto") is None and pod_of(kube, "otto") is None
    assert "asked for the image 'licensed', which is only for groups 'licensed'" in hub.log()


FANCY_CONFIG = """
from jupyterhub_fancy_profiles import setup_ui
setup_ui(c)
"""


@pytest.fixture
def fancy_hub(stack):
    """The session's hub restarted with jupyterhub-fancy-profiles' form, restored afterwards."""
    with hub_with(stack, FANCY_CONFIG) as hub:
        yield hub


def test_fancy_profiles_form_says_when_its_figures_were_counted(browser, fancy_hub):
    hub = fancy_hub
    page = browser_log_in(browser, hub, "dora", "/hub/spawn")
    try:
        # fancy-profiles' React form replaces KubeSpawner's; it reads the profile list once
        page.wait_for_selector("text=GPU type", timeout=60_000)
        text = page.inner_text("body")
        label = re.search(
            r"NVIDIA A100 \u2014 (\d+ free of 8 \(at most \d+ on one node\)) as of (\d\d:\d\d) UTC",
            text,
        )
        assert label, text
        # the figures are the cluster's, as the service counts them
        payload = availability_seen_by(page, hub)
        assert label.group(1) == payload["types"]["a100"]["label"]
        assert "counted live" not in page.content()
        assert page.query_selector("#gpuspawner-availability") is None
        assert "licensed" not in page.content()  # dora is not in the group
    finally:
        page.context.close()
