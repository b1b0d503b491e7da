"""Tests for gpuspawner.hub.pages: the home page's lines, and the hub config they need."""

import pytest
from markupsafe import Markup
from traitlets.config import Config

from gpuspawner.core import stopreasons
from gpuspawner.hub import pages as hubpages

from ..hubconfigs import load_as_subconfig
from ..security.payloads import PAYLOADS, assert_escaped

AT = 1_800_000_000.0


class OrmSpawner:
    def __init__(self, name, state):
        self.name = name
        self.state = state


class Spawner:
    def __init__(self, active, warning=None):
        self.active = active
        self.ready = active
        self._warning = warning

    def cull_warning(self):
        return self._warning


class OrmUser:
    def __init__(self, spawners):
        self.orm_spawners = spawners


class User:
    def __init__(self, orm_spawners, loaded):
        self.name = "carol"
        self.orm_user = OrmUser(orm_spawners)
        self.spawners = loaded


def test_stopped_servers_show_their_notice_and_running_ones_their_warning():
    notice = {"reason": "admin", "at": AT}
    warning = stopreasons.CullWarning("idle", AT, server="run")
    user = User(
        {
            "": OrmSpawner("", {stopreasons.STATE_KEY: notice}),
            "<b>": OrmSpawner("<b>", {stopreasons.STATE_KEY: notice}),
            "run": OrmSpawner("run", {stopreasons.STATE_KEY: notice}),  # being started again
            "junk": OrmSpawner("junk", {stopreasons.STATE_KEY: "junk"}),
            "none": OrmSpawner("none", None),
        },
        {"run": Spawner(True, warning), "": Spawner(False)},
    )
    lines = hubpages.user_notices(user)
    assert len(lines) == 3
    assert "Your server was stopped" in lines[0]
    assert "Your server &#39;&lt;b&gt;&#39; was stopped" in lines[1]
    assert "gpuspawner-warning" in lines[2] and "will be stopped" in lines[2]


def test_a_notebook_kueue_preempted_shows_why_on_the_home_page():
    notice = {"reason": stopreasons.REASON_PREEMPTED, "at": AT, "held": "1 × NVIDIA A100"}
    user = User({"train": OrmSpawner("train", {stopreasons.STATE_KEY: notice})}, {})
    (line,) = hubpages.user_notices(user)
    assert "Your server &#39;train&#39; (1 × NVIDIA A100) was stopped at <time" in line
    assert "because it was preempted for queued work (Kueue gave its GPUs to " in line


def test_a_page_never_fails_because_of_the_lines():
    class Broken:
        name = "x"

        @property
        def orm_user(self):
            raise RuntimeError("db gone")

    assert hubpages.page_notices(None)() == []
    assert hubpages.page_notices(Broken())() == []


def test_configure_adds_the_template_path_and_vars_once():
    c = Config()
    c.JupyterHub.template_paths = ["/site/templates"]
    c.JupyterHub.template_vars = {"site": "x"}
    hubpages.configure(c)
    hubpages.configure(c)
    assert c.JupyterHub.template_paths == [hubpages.TEMPLATE_PATH, "/site/templates"]
    assert c.JupyterHub.template_vars["gpuspawner_notices"] is hubpages.page_notices
    assert c.JupyterHub.template_vars["site"] == "x"


def test_configure_in_a_sub_config_keeps_the_parents_settings(tmp_path):
    c = load_as_subconfig(
        tmp_path,
        "from gpuspawner.hub.pages import configure\nconfigure(c)\nconfigure(c)\n",
        parent=(
            "c.JupyterHub.template_paths = ['/site/templates']\n"
            "c.JupyterHub.template_vars = {'site': 'x'}\n"
        ),
    )
    paths = c.JupyterHub.template_paths
    assert paths == [hubpages.TEMPLATE_PATH, "/site/templates"]
    assert sorted(c.JupyterHub.template_vars) == [
        "gpuspawner_local_time",
        "gpuspawner_notices",
        "site",
    ]


@pytest.mark.parametrize(("name", "value"), PAYLOADS, ids=[n for n, _ in PAYLOADS])
def test_every_hostile_string_of_a_notice_is_text_on_the_page(name, value):
    # server names are the user's; held, kind and detail come from pod annotations
    notice = {"reason": "gpu-check", "at": AT, "held": value, "kind": value, "detail": value}
    node_lost = {"reason": "node-lost", "at": AT, "detail": value}
    warning = stopreasons.CullWarning("gpu-idle", AT, seconds=3600, server=value, held=value)
    user = User(
        {
            value: OrmSpawner(value, {stopreasons.STATE_KEY: notice}),
            "n": OrmSpawner("n", {stopreasons.STATE_KEY: node_lost}),
            "run": OrmSpawner("run", {}),
        },
        {"run": Spawner(True, warning)},
    )
    lines = hubpages.user_notices(user)
    assert len(lines) == 3
    for line in lines:
        assert isinstance(line, Markup)
        assert_escaped(str(line), value[: stopreasons.MAX_TEXT])


class SettingsUser(User):
    def __init__(self, warning, base_url="/jhub/"):
        super().__init__({"run": OrmSpawner("run", {})}, {"run": Spawner(True, warning)})
        self.settings = {"base_url": base_url}


def test_a_warning_offers_the_cullers_keep_choices_as_buttons_to_the_keep_page():
    warning = stopreasons.CullWarning("idle", AT, server="run", keep_choices=(3600.0, 14400.0))
    (line,) = hubpages.user_notices(SettingsUser(warning))
    assert line.count("gpuspawner-keep") == 2
    assert '<a class="btn btn-xs btn-default gpuspawner-keep" ' in line
    assert (
        'href="/jhub/services/gpuspawner/keep?server=run&amp;seconds=3600">Keep for 1 h</a>' in line
    )
    assert 'seconds=14400">Keep for 4 h</a>' in line


def test_a_refused_keep_shows_the_cullers_sentence_and_no_button():
    refused = "Its GPUs are wanted by users waiting for them: it cannot be kept."
    warning = stopreasons.CullWarning(
        "pressure", AT, server="run", keep_choices=(3600.0,), keep_refused=refused
    )
    (line,) = hubpages.user_notices(SettingsUser(warning))
    assert "gpuspawner-keep-refused" in line and refused in line
    assert "Keep for" not in line


def test_a_deadline_warning_has_no_keep_at_all():
    warning = stopreasons.CullWarning("max-age", AT, server="run")
    (line,) = hubpages.user_notices(SettingsUser(warning, base_url="/"))
    assert "gpuspawner-keep" not in line


@pytest.mark.parametrize(("name", "value"), PAYLOADS, ids=[n for n, _ in PAYLOADS])
def test_every_hostile_string_of_a_keep_is_text_or_a_quoted_query(name, value):
    # the server name is the user's; keep_refused comes from a pod annotation
    warning = stopreasons.CullWarning("idle", AT, server=value, keep_choices=(3600.0,))
    (line,) = hubpages.user_notices(SettingsUser(warning))
    assert_escaped(str(line), value[: stopreasons.MAX_TEXT])
    refused = stopreasons.CullWarning("idle", AT, server="run", keep_refused=value)
    (line,) = hubpages.user_notices(SettingsUser(refused))
    assert_escaped(str(line), value[: stopreasons.MAX_TEXT])
