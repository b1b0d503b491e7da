"""The hostile-input battery on a real JupyterHub (both lines: `make test` runs it on each).

Every string a user or a notebook pod controls goes through the hub's pages as
GPUSpawner and JupyterHub show it:

- **server names on pods** (``hub.jupyter.org/servername``, which the user chose):
  the spawn form's "You are using ..." line, for the user and for an admin;
- **usernames**: the home page of a user logged in under that name;
- **server names on the hub**: the home page's list of named servers;
- **user options** sent by REST and by the form: the refusal's sentence, in the
  API's JSON and on the spawn page.

Each page is opened in Debian's headless Chromium: a payload that ran would set
``window.__pwned``; the text must be shown as text (:func:`assert_escaped`).
The hub lists pods from a stand-in API server (tests/kubeapi.py) holding the
user's GPU pods, so the form shows what the user holds.
"""

from __future__ import annotations

import copy
import html as htmllib
import json
import urllib.parse

import pytest

from ..conftest import FIXTURES
from ..hub.hubprocess import start_hub
from ..kubeapi import StandInApi
from .payloads import PAYLOADS, assert_escaped

NAMESPACE = "jupyterhub"
#: The user whose pods carry the hostile server names (each holds 1 A100: over her limit of 2).
HOLDER = "mallory"


def hostile_pods() -> list[dict]:
    template = next(
        p
        for p in json.loads((FIXTURES / "gpu-pods" / "podlist.json").read_text())["items"]
        if p["metadata"]["name"] == "jupyter-carol-exp1"
    )
    pods = []
    for index, (_, value) in enumerate(PAYLOADS):
        pod = copy.deepcopy(template)
        meta = pod["metadata"]
        meta.update(name=f"jupyter-{HOLDER}-{index}", namespace=NAMESPACE, uid=f"uid-{index}")
        meta["labels"]["hub.jupyter.org/username"] = HOLDER
        meta["annotations"]["hub.jupyter.org/username"] = HOLDER
        meta["annotations"]["hub.jupyter.org/servername"] = value
        pods.append(pod)
    return pods


@pytest.fixture(scope="module")
def standin(background):
    api = StandInApi(pods=hostile_pods())
    background.run(api.start())
    yield api
    background.run(api.stop())


@pytest.fixture(scope="module")
def hub(tmp_path_factory, standin):
    workdir = tmp_path_factory.mktemp("security-hub")
    kubeconfig = standin.kubeconfig(workdir)
    catalog = FIXTURES / "catalogs" / "pools.yaml"
    hub = start_hub(
        workdir,
        extra_config=f"""
c.GPUSpawner.catalog_file = {str(catalog)!r}
c.KubeSpawner.namespace = {NAMESPACE!r}
c.GPUSpawner.form_usage_timeout = 10
c.JupyterHub.load_roles.append({{"name": "admin-ada", "users": ["ada"], "scopes": ["admin:users", "admin:servers", "access:servers"]}})
from gpuspawner import check_catalog
check_catalog(c)
""",
        env={"KUBECONFIG": str(kubeconfig)},
    )
    if hub.process.poll() is not None:
        pytest.fail(f"JupyterHub exited during start:\n{hub.log()[-3000:]}")
    yield hub
    hub.stop()


def log_in(browser, hub, name):
    context = browser.new_context()
    page = context.new_page()
    page.goto(hub.public_url + "/hub/login")
    page.fill("#username_input", name)
    page.fill("#password_input", "any")
    page.click("#login_submit")
    page.wait_for_load_state()
    return page


def as_parsed(value):
    """``value`` as a browser's DOM holds it: HTML parsing turns CR LF into LF and drops NUL in text."""
    return value.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")


def assert_nothing_ran(page):
    assert page.evaluate("() => typeof window.__pwned") == "undefined", page.url


PAGES_CHECKED: list[str] = []


@pytest.mark.hub
@pytest.mark.parametrize("viewer", [HOLDER, "ada"])
def test_server_names_from_pods_are_text_on_the_spawn_form(hub, browser, viewer):
    assert hub.api("POST", f"/users/{HOLDER}").status in (201, 409)
    page = log_in(browser, hub, viewer)
    page.goto(f"{hub.public_url}/hub/spawn/{HOLDER}/fresh")
    page.wait_for_selector("#spawn_form")
    assert_nothing_ran(page)
    source = page.content()
    assert f"You are using {len(PAYLOADS)} of your 2 GPUs" in htmllib.unescape(source)
    for _, value in PAYLOADS:
        assert_escaped(source, as_parsed(value))
    # the page as the hub sent it, NUL included
    raw = page.request.get(f"{hub.public_url}/hub/spawn/{HOLDER}/fresh").text()
    for _, value in PAYLOADS:
        assert_escaped(raw, value)
    PAGES_CHECKED.append("spawn form")
    page.context.close()


@pytest.mark.hub
@pytest.mark.parametrize(("name", "value"), PAYLOADS, ids=[n for n, _ in PAYLOADS])
def test_hostile_options_are_refused_with_a_sentence_that_shows_them_as_text(hub, name, value):
    assert hub.api("POST", "/users/opal").status in (201, 409)
    for options in (
        {"profile": value},
        {"profile": "pytorch", "gpu_type": value, "gpus": "1"},
        {"profile": "pytorch", "gpu_type": "a100", "gpus": value},
        {value: value, "profile": "pytorch", "gpus": "0", "gpu_type": {"x": [value]}},
    ):
        r = hub.api("POST", "/users/opal/server", options)
        assert r.status in (400, 403), r.body
        message = r.json()["message"]
        assert "not authorized" not in message  # GPUSpawner's refusal, not the hub's
        assert "Traceback" not in message and "Error" not in message
        assert "\x00" not in message and "\r" not in message and "\n" not in message
        assert "\u202e" not in message  # a bidi override is escaped, never shown raw
    model = hub.api("GET", "/users/opal").json()
    assert model.get("servers", {}) == {}, model


@pytest.mark.hub
def test_a_hostile_option_sent_through_the_form_page_runs_nothing(hub, browser):
    page = log_in(browser, hub, "opal")
    page.goto(f"{hub.public_url}/hub/spawn/opal")
    page.wait_for_selector("#spawn_form")
    value = dict(PAYLOADS)["attribute-breakout"]
    # a crafted form: the option's value is the payload
    page.evaluate(
        """(value) => {
            const select = document.querySelector('[name="profile-option-pytorch--gpu_type"]');
            const option = document.createElement("option");
            option.value = value; option.selected = true; select.appendChild(option);
            document.querySelector('#profile-item-pytorch').checked = true;
        }""",
        value,
    )
    page.click("#spawn_form input[type=submit], #spawn_form button[type=submit]")
    page.wait_for_load_state()
    assert_nothing_ran(page)
    assert value in page.inner_text("body")  # quoted in the refusal, as text
    PAGES_CHECKED.append("spawn refusal")
    page.context.close()


#: Usernames as typed into the login form: JupyterHub lower-cases them and refuses "/";
#: a text input drops CR and LF, and a NUL cannot be typed.
USERNAMES = [
    (n, v.lower().replace("\r", "").replace("\n", ""))
    for n, v in PAYLOADS
    if "/" not in v and "\x00" not in v
]


@pytest.mark.hub
@pytest.mark.parametrize(("name", "value"), USERNAMES, ids=[n for n, _ in USERNAMES])
def test_a_hostile_username_and_server_name_are_text_on_the_home_page(hub, browser, name, value):
    page = log_in(browser, hub, value)
    assert_nothing_ran(page)
    user = urllib.parse.quote(value, safe="")
    server = urllib.parse.quote(value[:200], safe="")
    # a named server of that name: JupyterHub 6 refuses such names itself, 5.5
    # takes them and GPUSpawner refuses the spawn (its options are wrong)
    r = hub.api("POST", f"/users/{user}/servers/{server}", {"profile": value})
    message = r.json()["message"]
    assert r.status in (400, 403), r.body
    assert "There is no profile" in message or "Invalid server_name" in message, r.body
    page.goto(f"{hub.public_url}/hub/home")
    page.wait_for_load_state()
    assert_nothing_ran(page)
    assert_escaped(page.content(), as_parsed(value))
    PAGES_CHECKED.append("home")
    page.context.close()
