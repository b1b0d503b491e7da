"""The spawn form escapes what users control: their server names reach it through the
"You are using ..." line, read back from their pods' ``hub.jupyter.org/servername``."""

import copy

import pytest
from markupsafe import Markup
from traitlets.config import Config

from .test_spawner import User, make_spawner, pods_fixture


@pytest.fixture(autouse=True)
def _isolated(offline_kubeconfig):
    pass


HOSTILE = "x<svg onload=window.__pwned=1>"


def carol_pods_with_server(name):
    pods = copy.deepcopy(pods_fixture())
    for pod in pods:
        if pod["metadata"]["name"] == "jupyter-carol-exp1":
            pod["metadata"]["annotations"]["hub.jupyter.org/servername"] = name
    return pods


async def test_a_server_name_with_markup_is_escaped_on_the_form():
    spawner = make_spawner(user=User("carol"), pods=carol_pods_with_server(HOSTILE), name="exp2")
    html = await spawner.get_options_form()
    assert "<svg" not in html
    assert "x&lt;svg onload=window.__pwned=1&gt;" in html
    # the line itself is still there, and the catalog's own markup is kept as written
    assert "You are using 2 of your 2 GPUs" in html


async def test_the_catalog_description_is_admin_markup_and_the_summary_is_text():
    spawner = make_spawner(user=User("carol"), pods=carol_pods_with_server(HOSTILE), name="exp2")
    profiles = await spawner.profile_list(spawner)
    pytorch = next(p for p in profiles if p["slug"] == "pytorch")
    assert isinstance(pytorch["description"], Markup)
    assert "&lt;svg" in pytorch["description"]


async def test_an_admin_profile_form_template_is_rendered_with_autoescape():
    c = Config()
    c.GPUSpawner.profile_form_template = (
        "{% for p in profile_list %}<p>{{ p.description }}</p>{% endfor %}"
    )
    spawner = make_spawner(c, user=User("carol"), pods=carol_pods_with_server(HOSTILE), name="exp2")
    html = await spawner.get_options_form()
    assert "<svg" not in html and "&lt;svg" in html


async def test_catalog_descriptions_keep_their_markup():
    c = Config()
    c.GPUSpawner.catalog = {
        "gpu_types": {"a100": {"display_name": "NVIDIA A100", "resource": "nvidia.com/gpu"}},
        "images": {
            "pytorch": {
                "display_name": "PyTorch <&> friends",
                "image": "example.org/pytorch:1",
                "description": "See <a href='https://docs.example.org'>the docs</a>.",
                "gpu_types": ["a100"],
            }
        },
    }
    spawner = make_spawner(c, user=User("carol"))
    html = await spawner.get_options_form()
    assert "See <a href='https://docs.example.org'>the docs</a>." in html
    # display names are text, never markup
    assert "PyTorch &lt;&amp;&gt; friends" in html
