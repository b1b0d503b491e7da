"""Property tests: whatever a user, a pod or an admin's file holds, the parsers either
accept it or refuse it with their documented type (Refusal, CatalogError, None for a
notice), and never crash with anything else.

Option parsing and notice annotations are user- and pod-controlled; the catalog is
the admin's, but a typo there must still be one readable CatalogError.
"""

from __future__ import annotations

import copy
import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuspawner.core import stopreasons
from gpuspawner.core.admission import RefusedDemand, person_demand
from gpuspawner.core.catalog import CatalogError, parse_catalog
from gpuspawner.core.options import Selection, ignored_options, resolve_selection
from gpuspawner.core.refusals import Refusal, shown
from gpuspawner.hub.compat import request_options

from ..conftest import FIXTURES
from .payloads import PAYLOADS

POOLS = FIXTURES / "catalogs" / "pools.yaml"
HOSTILE_TEXT = st.sampled_from([value for _, value in PAYLOADS])
TEXT = st.one_of(st.text(max_size=60), HOSTILE_TEXT, st.sampled_from(["pytorch", "a100", "2"]))
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    TEXT,
)
JSON = st.recursive(
    SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=5)),
    max_leaves=20,
)
OPTION_KEYS = st.sampled_from(
    ["profile", "gpu_type", "gpus", "image", "profile-option-pytorch--gpus", "user_options"]
)
USER_OPTIONS = st.one_of(
    JSON, st.dictionaries(st.one_of(OPTION_KEYS, TEXT), st.one_of(SCALARS, JSON), max_size=6)
)


def pools_raw():
    import yaml

    return yaml.safe_load(POOLS.read_text())


POOLS_CATALOG = parse_catalog(pools_raw(), "pools.yaml")


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(USER_OPTIONS)
def test_any_user_options_select_or_refuse_with_one_sentence(user_options):
    try:
        options = request_options(user_options)
        selection = resolve_selection(options, POOLS_CATALOG)
    except Refusal as refusal:
        message = refusal.jupyterhub_message
        assert isinstance(message, str) and message.strip()
        assert "\n" not in message and "\x00" not in message
        assert "Traceback" not in message and "KeyError" not in message
        assert 400 <= refusal.status < 600
        return
    assert isinstance(selection, Selection)
    assert selection.image.key in POOLS_CATALOG.images
    ignored_options(options)  # names what it ignores, never raises


@settings(max_examples=200)
@given(st.one_of(SCALARS, JSON), st.integers(min_value=1, max_value=500))
def test_shown_is_quoted_printable_and_short(value, limit):
    text = shown(value, limit)
    assert text.isprintable()
    assert len(text) <= 4 * limit + 20  # escapes lengthen; "..." marks a cut


def mutated(raw, path, value):
    """``raw`` with the value at ``path`` (keys into nested dicts) replaced."""
    raw = copy.deepcopy(raw)
    node = raw
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return raw


def paths(node, prefix=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield (*prefix, key)
            yield from paths(value, (*prefix, key))


CATALOG_PATHS = list(paths(pools_raw()))


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CATALOG_PATHS), st.one_of(SCALARS, JSON))
def test_a_catalog_with_any_value_anywhere_parses_or_names_the_problem(path, value):
    try:
        catalog = parse_catalog(mutated(pools_raw(), path, value), "catalog.yaml")
    except CatalogError as e:
        assert str(e).startswith("catalog.yaml")
        assert "Traceback" not in str(e)
        return
    assert catalog.images


@settings(max_examples=100)
@given(st.one_of(SCALARS, JSON))
def test_a_whole_catalog_of_anything_parses_or_names_the_problem(data):
    try:
        parse_catalog(data, "c.GPUSpawner.catalog")
    except CatalogError as e:
        assert str(e).startswith("c.GPUSpawner.catalog")


NUMBERS = st.one_of(
    st.floats(min_value=0, allow_infinity=True),
    st.integers(min_value=0, max_value=2**70),
    SCALARS,
)
NOTICE_FIELDS = st.fixed_dictionaries(
    # the fields a notice needs, so that most examples get past the first check
    {
        "reason": st.one_of(st.sampled_from(stopreasons.REASONS), TEXT),
        "at": NUMBERS,
        "cull_after": NUMBERS,
    },
    optional={
        "seconds": NUMBERS,
        "server": st.one_of(TEXT, JSON),
        "held": st.one_of(TEXT, JSON),
        "kind": st.one_of(TEXT, JSON),
        "detail": st.one_of(TEXT, JSON),
    },
)


def annotation_values():
    """What a pod's annotation may hold: JSON of anything, or any text at all."""
    return st.one_of(
        NOTICE_FIELDS.map(json.dumps),
        NOTICE_FIELDS,
        st.text(max_size=200),
        JSON.map(lambda v: json.dumps(v, allow_nan=True)),
    )


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(annotation_values())
def test_a_stop_reason_annotation_reads_as_a_notice_or_none(value):
    notice = stopreasons.StopNotice.from_state(value)
    if notice is None:
        return
    notice = notice.for_server("<b>srv</b>", "")
    sentence = notice.sentence()
    html = stopreasons.notice_html(notice)
    assert sentence and notice.as_json()["message"] == sentence
    # the only element is the time: everything from the annotation is escaped
    assert html.count("<") == html.count("<time") + html.count("</time>")
    assert stopreasons.StopNotice.from_state(notice.to_state()) == notice


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(annotation_values())
def test_a_cull_warning_annotation_reads_as_a_warning_or_none(value):
    warning = stopreasons.CullWarning.from_state(value)
    if warning is None:
        return
    html = stopreasons.warning_html(warning.for_server("x<svg onload=1>", ""))
    assert "<svg" not in html
    assert warning.sentence()


REFUSALS = st.lists(
    st.builds(
        RefusedDemand,
        user=st.sampled_from(["ann", "ben", "cy"]),
        gpu_type=st.sampled_from(["a100", "h100"]),
        gpus=st.integers(min_value=1, max_value=8),
        until=st.just(0.0),
        allowance=st.one_of(st.none(), st.floats(min_value=0, max_value=16)),
    ),
    max_size=12,
)


@given(REFUSALS)
def test_published_demand_is_one_entry_per_person_and_type_within_their_allowance(refused):
    demand = person_demand(refused, [])
    people = {(r.user, r.gpu_type) for r in refused}
    assert len(demand) <= len(people)
    for gpu_type in ("a100", "h100"):
        published = sum(gpus for _, t, gpus in demand if t == gpu_type)
        bound = 0
        for user in {r.user for r in refused if r.gpu_type == gpu_type}:
            mine = [r for r in refused if r.user == user and r.gpu_type == gpu_type]
            caps = [r.allowance for r in mine if r.allowance is not None]
            total = sum(r.gpus for r in mine)
            bound += min(total, int(min(caps) + 1e-9)) if caps else total
        assert published == bound
