"""A refused spawn through the spawn form of a real JupyterHub: the page shows the sentence.

JupyterHub 6 reads the sentence from its SpawnException, 5.5 from the exception's
``jupyterhub_message`` (gpuspawner.hub.compat); the page must be the same on both.
"""

import html
import http.cookiejar
import re
import urllib.error
import urllib.parse
import urllib.request

import pytest


def logged_in(hub, name):
    """A cookie session logged in through the login form (any password: DummyAuthenticator)."""
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    with opener.open(f"{hub.public_url}/hub/login", timeout=30) as response:
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', response.read().decode()).group(1)
    body = urllib.parse.urlencode({"username": name, "password": "any", "_xsrf": xsrf})
    with opener.open(f"{hub.public_url}/hub/login", body.encode(), timeout=30) as response:
        assert response.status == 200
    return opener


def post_form(opener, url, fields):
    try:
        with opener.open(url, urllib.parse.urlencode(fields).encode(), timeout=60) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


@pytest.mark.hub
def test_a_refused_form_shows_the_sentence_and_starts_nothing(gpu_hub):
    session = logged_in(gpu_hub, "petra")
    with session.open(f"{gpu_hub.public_url}/hub/spawn", timeout=60) as response:
        form = response.read().decode()
    assert 'name="profile-option-pytorch--gpu_type"' in form  # KubeSpawner's form
    # the form's action carries the hub's _xsrf token
    action = html.unescape(re.search(r'id="spawn_form"\s+action="([^"]+)"', form).group(1))
    status, page = post_form(
        session,
        urllib.parse.urljoin(f"{gpu_hub.public_url}/hub/spawn", action),
        {
            "profile": "pytorch",
            "profile-option-pytorch--gpu_type": "v100",
            "profile-option-pytorch--gpus": "1",
        },
    )
    assert status == 400, page[-2000:]
    text = html.unescape(page)
    assert "There is no GPU type 'v100': choose 'a100', 'h100' or 'mig'." in text
    assert "Traceback" not in text and "RefusedSpawn" not in text
    assert gpu_hub.api("GET", "/users/petra").json()["servers"] == {}
    # (The hub's log does hold a traceback here: JupyterHub 5.5 and 6.1 log every failed
    # form spawn with exc_info, SpawnException included, in handlers/pages.py.)
