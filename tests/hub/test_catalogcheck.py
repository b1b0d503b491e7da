"""The hub's start check of the catalog: kubespawner_override names, and a profile_list beside it."""

import pytest
from traitlets.config import Config

from gpuspawner.hub.catalogcheck import check_catalog, main, override_trait_names

from ..conftest import FIXTURES

POOLS = str(FIXTURES / "catalogs" / "pools.yaml")


def configured(profile_list=None, section="KubeSpawner", catalog_file=POOLS):
    c = Config()
    c.GPUSpawner.catalog_file = catalog_file
    if profile_list is not None:
        c[section].profile_list = profile_list
    return c


def test_the_hub_says_how_many_listed_profiles_it_offers(capsys):
    listed = [{"display_name": "Small CPU"}, {"display_name": "GPU", "slug": "gpu"}]
    assert check_catalog(configured(listed)) is not None
    assert capsys.readouterr().err == (
        "gpuspawner: 2 profiles from profile_list are offered after the catalog's.\n"
    )
    check_catalog(configured({"b": {"display_name": "B"}}, section="GPUSpawner"))
    assert capsys.readouterr().err == (
        "gpuspawner: 1 profile from profile_list is offered after the catalog's.\n"
    )

    async def profiles(spawner):
        return listed

    check_catalog(configured(profiles))
    assert "the profiles of the callable profile_list are offered after the catalog's" in (
        capsys.readouterr().err
    )
    # nothing to say without one, or without a catalog
    check_catalog(configured())
    c = Config()
    c.KubeSpawner.profile_list = listed
    assert check_catalog(c) is None
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "profile",
    [
        {"display_name": "Torch", "slug": "pytorch"},
        # a slug KubeSpawner makes from the display name collides too
        {"display_name": "PyTorch"},
    ],
)
def test_a_profile_named_like_a_catalog_image_stops_the_hub(capsys, profile):
    with pytest.raises(SystemExit) as e:
        check_catalog(configured([{"display_name": "Small"}, profile]))
    assert e.value.code == 1
    assert capsys.readouterr().err == (
        "gpuspawner: the GPU catalog is invalid, so the hub will not start: "
        f"{POOLS}: images.pytorch: the profile_list profile with slug 'pytorch' has the same "
        "name as the catalog image 'pytorch': rename one of them\n"
    )


def test_override_names_are_kubespawners_configurable_traits(tmp_path, capsys):
    names = override_trait_names()
    assert {"cpu_limit", "extra_labels", "node_selector", "environment", "image"} <= names
    # not GPUSpawner's own: an image cannot switch its GPU check off
    assert "validation_enabled" not in names and "catalog_file" not in names
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(
        "images:\n  lab:\n    image: x\n    kubespawner_override: {extra_lables: {a: b}}\n"
    )
    with pytest.raises(SystemExit):
        check_catalog(configured(catalog_file=str(catalog)))
    assert capsys.readouterr().err.endswith(
        "images.lab.kubespawner_override.extra_lables: KubeSpawner has no trait "
        "'extra_lables': did you mean 'extra_labels'?\n"
    )
    # the command-line check reads them the same way
    assert main([str(catalog)]) == 1
    assert "did you mean 'extra_labels'?" in capsys.readouterr().err


def test_budgets_without_accounting_stop_the_hub(capsys):
    catalog = {
        "images": {"pytorch": {"display_name": "PyTorch", "image": "example/torch:1"}},
        "gpu_types": {"a100": {"display_name": "A100"}},
        "limits": {"gpu_hours": {"default": 40}},
    }
    c = Config()
    c.GPUSpawner.catalog = catalog
    assert check_catalog(c) is not None  # accounting is on by default
    c.GPUSpawner.accounting_enabled = False
    with pytest.raises(SystemExit) as e:
        check_catalog(c)
    assert e.value.code == 1
    assert capsys.readouterr().err == (
        "gpuspawner: the GPU catalog is invalid, so the hub will not start: "
        "c.GPUSpawner.catalog: limits.gpu_hours: GPU-hours budgets need GPU-hours accounting, "
        "which is off (c.GPUSpawner.accounting_enabled = False): turn it on, or remove the "
        "budgets\n"
    )
    # without budgets, accounting may be off
    del catalog["limits"]
    c.GPUSpawner.catalog = catalog
    assert check_catalog(c) is not None
