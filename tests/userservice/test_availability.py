"""The gpuspawner service's figures for one user: the hub's identity in, the form's payload out."""

from __future__ import annotations

import json

import pytest

from gpuspawner.core.catalog import load_catalog_file
from gpuspawner.core.placement import Placement
from gpuspawner.inventory.figures import live_payload
from gpuspawner.inventory.model import inventory_from
from gpuspawner.userservice.availability import NotAUser, user_payload

from ..conftest import FIXTURES

NODES = FIXTURES / "nodes"
NO_PLACEMENT = Placement({}, [])


def items(name):
    return json.loads((NODES / name).read_text())["items"]


class ReadyReflector:
    """The reflector's interface over a real Inventory of the recorded cluster."""

    def __init__(self, ready=True, missing=()):
        self.inventory = inventory_from(items("recorded-nodes.json"), items("recorded-pods.json"))
        self.ready = ready
        self.missing_permissions = list(missing)


@pytest.fixture
def catalog():
    # 'licensed' is only for the group 'licensed'
    return load_catalog_file(FIXTURES / "catalogs" / "e2e.yaml")


def test_a_member_sees_the_restricted_image_and_others_do_not(catalog):
    reflector = ReadyReflector()
    member = user_payload(
        {"kind": "user", "name": "lin", "groups": ["licensed"]}, catalog, reflector, NO_PLACEMENT
    )
    other = user_payload(
        {"kind": "user", "name": "otto", "groups": []}, catalog, reflector, NO_PLACEMENT
    )
    assert sorted(member["images"]) == ["licensed", "pytorch"]
    assert sorted(other["images"]) == ["pytorch"]
    # the same cluster, the same figures for the types both may use
    assert member["types"]["a100"] == other["types"]["a100"]


def test_the_payload_is_the_spawners(catalog):
    """One reader per fact: the service answers what live_payload answers the spawner's form."""
    reflector = ReadyReflector()
    user = {"kind": "user", "name": "otto", "groups": []}
    expected = live_payload(reflector, catalog.visible_to("otto", []), NO_PLACEMENT)
    assert user_payload(user, catalog, reflector, NO_PLACEMENT) == expected
    assert expected["available"] and expected["types"]["a100"]["allocatable"] > 0


def test_placement_changes_the_figures(catalog):
    reflector = ReadyReflector()
    user = {"kind": "user", "name": "otto", "groups": []}
    # a node selector no node matches: no node can take any type
    nowhere = Placement({"example.org/pool": "none"}, [])
    payload = user_payload(user, catalog, reflector, nowhere)
    assert payload["types"]["a100"]["label"] == "no node available"


def test_an_identity_without_groups_sees_only_open_images(catalog):
    payload = user_payload(
        {"kind": "user", "name": "otto"}, catalog, ReadyReflector(), NO_PLACEMENT
    )
    assert list(payload["images"]) == ["pytorch"]


def test_a_service_is_refused(catalog):
    with pytest.raises(NotAUser):
        user_payload({"kind": "service", "name": "tester"}, catalog, ReadyReflector(), NO_PLACEMENT)


def test_no_catalog_or_no_inventory_says_why(catalog):
    user = {"kind": "user", "name": "otto", "groups": []}
    invalid = user_payload(user, None, ReadyReflector(), NO_PLACEMENT)
    assert invalid == {
        "available": False,
        "problem": "the catalog is invalid",
        "pods_namespace": "",
        "types": {},
        "images": {},
    }
    off = user_payload(user, catalog, None, NO_PLACEMENT)
    assert off["available"] is False and off["problem"] == "the GPU inventory is turned off"
    loading = user_payload(user, catalog, ReadyReflector(ready=False), NO_PLACEMENT)
    assert loading["problem"] == "the GPU inventory is still loading"
