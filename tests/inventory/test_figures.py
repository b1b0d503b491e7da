"""The availability payload the spawn form polls, from plain data."""

from dataclasses import replace

from gpuspawner.core.catalog import parse_catalog
from gpuspawner.core.profiles import MARK_NEVER, MARK_NOT_FREE
from gpuspawner.inventory.figures import alternatives, availability_payload
from gpuspawner.inventory.model import Availability, NodeFigures

CATALOG = {
    "images": {
        "pytorch": {"image": "p", "display_name": "PyTorch", "gpu_types": ["a100", "h100"]},
        "licensed": {
            "image": "m",
            "display_name": "MATLAB",
            "gpu_types": ["a100", "b200"],
            "groups": ["licensed"],
        },
    },
    "gpu_types": {
        "a100": {"display_name": "NVIDIA A100"},
        "h100": {"display_name": "NVIDIA H100", "counts": [1, 8]},
        "b200": {"display_name": "NVIDIA B200"},
    },
    "gpu_counts": [0, 1, 2, 4],
}


def figures(key, *nodes):
    return Availability(
        key=key,
        resource="nvidia.com/gpu",
        display_name=key,
        nodes=tuple(NodeFigures(f"{key}-{i}", a, r) for i, (a, r) in enumerate(nodes)),
    )


FIGURES = {
    "a100": figures("a100", (4, 3), (4, 4)),
    "h100": figures("h100", (8, 0)),
    "b200": figures("b200", (8, 8)),
}


def test_payload_has_labels_figures_and_the_form_marks_per_type():
    payload = availability_payload(parse_catalog(CATALOG), FIGURES)
    assert payload["available"] is True
    a100 = payload["types"]["a100"]
    assert (a100["free"], a100["allocatable"], a100["largest_node"]) == (1, 8, 4)
    assert a100["label"] == "1 free of 8 (at most 1 on one node)"
    assert a100["counts"] == {"1": "", "2": MARK_NOT_FREE, "4": MARK_NOT_FREE}
    assert payload["types"]["h100"]["counts"] == {"1": "", "8": ""}
    assert payload["types"]["b200"]["counts"]["1"] == MARK_NOT_FREE
    assert payload["images"] == {"pytorch": ["a100", "h100"], "licensed": ["a100", "b200"]}


def test_a_user_outside_the_group_gets_no_trace_of_the_restricted_image():
    catalog = parse_catalog(CATALOG).visible_to("carol", ["students"])
    payload = availability_payload(catalog, FIGURES)
    assert payload["images"] == {"pytorch": ["a100", "h100"]}
    # the B200 serves only the restricted image, so its figures are left out too
    assert set(payload["types"]) == {"a100", "h100"}
    assert "MATLAB" not in repr(payload) and "licensed" not in repr(payload)


def test_a_count_no_node_could_hold_is_marked_never():
    payload = availability_payload(parse_catalog(CATALOG), {"a100": figures("a100", (2, 0))})
    assert payload["types"]["a100"]["counts"]["4"] == MARK_NEVER
    assert set(payload["types"]) == {"a100"}  # types without figures are left out


def test_without_figures_the_payload_says_why_and_shows_nothing():
    payload = availability_payload(None, None, "the GPU inventory is still loading")
    assert payload == {
        "available": False,
        "problem": "the GPU inventory is still loading",
        "pods_namespace": "",
        "types": {},
        "images": {},
    }


def test_figures_of_one_namespaces_pods_say_which():
    """The form tells users when GPUs held outside the hub's namespace were not counted."""
    catalog = parse_catalog(CATALOG)
    assert availability_payload(catalog, FIGURES)["pods_namespace"] == ""
    own = {key: replace(a, pods_namespace="jupyterhub") for key, a in FIGURES.items()}
    assert availability_payload(catalog, own)["pods_namespace"] == "jupyterhub"


def test_alternatives_are_the_images_other_types_that_offer_the_same_count():
    catalog = parse_catalog(CATALOG)
    pytorch = catalog.images["pytorch"]
    # h100 offers 1 and 8: a way out for 1 GPU, not for 2 (even if its node could hold 2)
    assert list(alternatives(catalog, pytorch, "a100", 1, FIGURES)) == ["NVIDIA H100"]
    assert alternatives(catalog, pytorch, "a100", 2, FIGURES) == {}
    assert list(alternatives(catalog, pytorch, "h100", 2, FIGURES)) == ["NVIDIA A100"]
    # b200 is not the image's
    assert "NVIDIA B200" not in alternatives(catalog, pytorch, "a100", 4, FIGURES)
