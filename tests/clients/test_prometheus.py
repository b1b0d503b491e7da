"""GPU activity queries: names checked, answers read by the configured label names, and
every answer that is not a vector of finite samples refused with PrometheusError."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuspawner.clients.prometheus import (
    GPUQueries,
    PrometheusClient,
    PrometheusError,
    parse_vector,
)

from ..scriptedhttp import scripted_server


def test_names_are_checked_so_nothing_is_injected_into_promql():
    with pytest.raises(ValueError):
        GPUQueries(pod_label='pod"} or vector(1) #')
    with pytest.raises(ValueError):
        GPUQueries(util_metric="1abc")
    q = GPUQueries(pod_label="exported_pod", namespace_label="exported_namespace")
    assert 'exported_pod!=""' in q.fresh_query()
    assert "by (exported_namespace, exported_pod)" in q.last_busy_query()


def test_error_answers_raise():
    with pytest.raises(PrometheusError):
        parse_vector({"status": "error", "errorType": "bad_data", "error": "parse error"})
    with pytest.raises(PrometheusError):
        parse_vector({"status": "success", "data": {"resultType": "matrix", "result": []}})


def test_answers_are_read_by_the_configured_label_names():
    body = {
        "status": "success",
        "data": {
            "resultType": "vector",
            "result": [
                {
                    "metric": {
                        "exported_namespace": "jupyterhub",
                        "exported_pod": "jupyter-ann",
                        "namespace": "gpu-operator",
                        "pod": "dcgm-exporter-x7k2p",
                    },
                    "value": [1764547200, "0.6"],
                }
            ],
        },
    }
    exported = GPUQueries(pod_label="exported_pod", namespace_label="exported_namespace")
    assert parse_vector(body, exported) == {("jupyterhub", "jupyter-ann"): 0.6}
    assert parse_vector(body) == {("gpu-operator", "dcgm-exporter-x7k2p"): 0.6}
    assert "exported_pod" in body["data"]["result"][0]["metric"]  # the answer is not rewritten


# --- wrong-shaped answers ---------------------------------------------------------

GOOD_ITEM = {"metric": {"namespace": "jupyterhub", "pod": "jupyter-ann"}, "value": [1.5, "0.6"]}


def vector(*items) -> dict:
    return {"status": "success", "data": {"resultType": "vector", "result": list(items)}}


WRONG_SHAPES = {
    "a list body": [GOOD_ITEM],
    "a string body": "success",
    "null body": None,
    "no status": {"data": vector()["data"]},
    "data a list": {"status": "success", "data": [GOOD_ITEM]},
    "data null": {"status": "success", "data": None},
    "result an object": {"status": "success", "data": {"resultType": "vector", "result": {}}},
    "result null": {"status": "success", "data": {"resultType": "vector", "result": None}},
    "item a list": vector([GOOD_ITEM["metric"], GOOD_ITEM["value"]]),
    "item without metric": vector({"value": [1.5, "0.6"]}),
    "item without value": vector({"metric": GOOD_ITEM["metric"]}),
    "metric a list": vector({"metric": ["jupyter-ann"], "value": [1.5, "0.6"]}),
    "value a string": vector({"metric": GOOD_ITEM["metric"], "value": "0.6"}),
    "value of one": vector({"metric": GOOD_ITEM["metric"], "value": ["0.6"]}),
    "value of three": vector({"metric": GOOD_ITEM["metric"], "value": [1.5, "0.6", "1"]}),
    "value not a number": vector({"metric": GOOD_ITEM["metric"], "value": [1.5, "busy"]}),
    "value NaN": vector({"metric": GOOD_ITEM["metric"], "value": [1.5, "NaN"]}),
    "value +Inf": vector({"metric": GOOD_ITEM["metric"], "value": [1.5, "+Inf"]}),
    "value a JSON NaN": vector({"metric": GOOD_ITEM["metric"], "value": [1.5, float("nan")]}),
    "value a boolean": vector({"metric": GOOD_ITEM["metric"], "value": [1.5, True]}),
    "value null": vector({"metric": GOOD_ITEM["metric"], "value": [1.5, None]}),
    "value an object": vector({"metric": GOOD_ITEM["metric"], "value": [1.5, {"v": 1}]}),
    "value past float range": vector({"metric": GOOD_ITEM["metric"], "value": [1.5, 10**400]}),
    "value huge": vector({"metric": GOOD_ITEM["metric"], "value": [1.5, "1" * 100_000]}),
    "time not a number": vector({"metric": GOOD_ITEM["metric"], "value": ["now", "0.6"]}),
    "pod label a number": vector(
        {"metric": {"namespace": "jupyterhub", "pod": 7}, "value": [1, "1"]}
    ),
    "pod label huge": vector(
        {"metric": {"namespace": "n", "pod": "p" * 100_000}, "value": [1, "1"]}
    ),
    "namespace label null": vector({"metric": {"namespace": None, "pod": "p"}, "value": [1, "1"]}),
}


@pytest.mark.parametrize("body", WRONG_SHAPES.values(), ids=WRONG_SHAPES.keys())
def test_every_wrong_shape_raises_prometheus_error(body):
    """The admin page and the culler catch PrometheusError only: anything else ended the pass."""
    with pytest.raises(PrometheusError) as e:
        parse_vector(body)
    message = str(e.value)
    assert message.startswith("Prometheus answered") and "\n" not in message
    assert len(message) < 300  # a huge label or value is not copied into the log


def test_well_formed_answers_still_parse():
    body = vector(
        GOOD_ITEM,
        {"metric": {"namespace": "jupyterhub", "pod": "jupyter-bob"}, "value": [2, "1.7e9"]},
        {"metric": {"namespace": "jupyterhub", "pod": "jupyter-bob"}, "value": [2, "5"]},
        {"metric": {}, "value": [2, "-0.5"]},
    )
    assert parse_vector(body) == {
        ("jupyterhub", "jupyter-ann"): 0.6,
        ("jupyterhub", "jupyter-bob"): 1.7e9,  # the later of two last-busy times
        ("", ""): -0.5,
    }
    assert parse_vector(vector()) == {}


# --- property: whatever the answer, PrometheusError or floats ---------------------------

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=30)
    | st.sampled_from(["NaN", "+Inf", "-Inf", "1e999", "0x10", "1_0", " 1", "0.5", "1764547200"])
)
json_values = st.recursive(
    json_scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)
label_texts = st.text(max_size=20)
valid_items = st.fixed_dictionaries(
    {
        "metric": st.dictionaries(st.sampled_from(["pod", "namespace", "gpu"]), label_texts),
        "value": st.tuples(
            st.floats(0, 2e9),
            st.floats(allow_nan=False, allow_infinity=False).map(repr)
            | st.integers(-9, 9).map(str),
        ).map(list),
    }
)
valid_vectors = st.lists(valid_items, max_size=5).map(lambda items: vector(*items))


@st.composite
def corrupted_vectors(draw):
    """A well-formed answer with one place (the body, a field, an item, a label, a number)
    replaced by any JSON value: so every check is reached, not only the first."""
    body = draw(valid_vectors)
    garbage = draw(json_values)
    places = "body status data resultType result item metric value time number label"
    where = draw(st.sampled_from(places.split()))
    if where == "body":
        return garbage
    if where in ("status", "data"):
        body[where] = garbage
        return body
    if where in ("resultType", "result"):
        body["data"][where] = garbage
        return body
    items = body["data"]["result"]
    if not items:
        items.append(draw(valid_items))
    item = draw(st.sampled_from(items))
    if where == "item":
        items[items.index(item)] = garbage
    elif where in ("metric", "value"):
        item[where] = garbage
    elif where in ("time", "number"):
        item["value"][0 if where == "time" else 1] = garbage
    else:
        item["metric"][draw(st.sampled_from(["pod", "namespace"]))] = garbage
    return body


def assert_floats_or_prometheus_error(body) -> None:
    try:
        result = parse_vector(body)
    except PrometheusError:
        return
    assert isinstance(result, dict)
    for key, value in result.items():
        assert isinstance(key, tuple) and len(key) == 2
        assert all(isinstance(part, str) for part in key)
        assert type(value) is float and math.isfinite(value)


@settings(max_examples=400, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_any_json_value_gives_floats_or_prometheus_error(body):
    assert_floats_or_prometheus_error(body)


@settings(max_examples=600, suppress_health_check=[HealthCheck.too_slow])
@given(corrupted_vectors())
def test_any_answer_wrong_in_one_place_gives_floats_or_prometheus_error(body):
    assert_floats_or_prometheus_error(body)


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(valid_vectors)
def test_well_formed_answers_give_every_pods_value(body):
    expected: dict = {}
    for item in body["data"]["result"]:
        key = (item["metric"].get("namespace", ""), item["metric"].get("pod", ""))
        expected[key] = max(float(item["value"][1]), expected.get(key, -math.inf))
    assert parse_vector(body) == expected


# --- the client over HTTP -------------------------------------------------------------


@pytest.fixture
async def fake_prometheus():
    """A "Prometheus" on 127.0.0.1 whose /api/v1/query answers (status, body) as the test sets."""
    with scripted_server(r"/api/v1/query") as answer:
        yield answer


async def test_answers_that_are_not_json_or_not_a_vector_raise_prometheus_error(fake_prometheus):
    client = PrometheusClient(fake_prometheus["url"], GPUQueries(), timeout=5)
    cases = [
        (200, b"<html>proxy login</html>", "not JSON"),
        (200, b"[" * 100_000 + b"]" * 100_000, "not JSON"),  # deeper than the parser goes
        (200, json.dumps([GOOD_ITEM]).encode(), "malformed"),
        (200, json.dumps(vector({"metric": {}, "value": [1, "NaN"]})).encode(), "malformed"),
        (400, json.dumps(["bad_data"]).encode(), "answered 400"),  # an error body of a list
        (503, b"\xff\xfe not text", "answered 503"),
    ]
    for status, body, expected in cases:
        fake_prometheus.update(status=status, body=body)
        with pytest.raises(PrometheusError) as e:
            await client.per_pod("up", 1.0)
        assert expected in str(e.value), (status, body[:40], str(e.value))
        assert len(str(e.value)) < 300


# --- /api/gpu-status's queries: pods named in PromQL ------------------------------------

HOSTILE_NAMES = [
    'pod"} or vector(1) #',
    "back\\slash",
    "dot.star.*",
    "a|b",
    "new\nline",
    "(group)[class]{3}^$",
    "ünïcødé-名前",
]


@pytest.mark.parametrize("name", HOSTILE_NAMES)
def test_a_pod_name_in_promql_is_a_string_and_a_regex_of_itself_only(name):
    import ast
    import re

    from gpuspawner.clients.prometheus import one_of, promql_string

    # PromQL's double-quoted strings take Go's escapes, which Python's read alike
    assert ast.literal_eval(promql_string(name)) == name
    literal = one_of([name, "jupyter-ann"])
    assert literal.startswith('"') and literal.endswith('"')
    assert '"' not in literal[1:-1].replace('\\"', "")
    pattern = ast.literal_eval(literal)
    assert re.fullmatch(pattern, name) and re.fullmatch(pattern, "jupyter-ann")
    for other in ("", "x", name + "x", "jupyter-ann|x", "pod"):
        assert not re.fullmatch(pattern, other), other


def test_the_status_queries_name_only_the_pods_asked_for():
    q = GPUQueries(pod_label="exported_pod", namespace_label="exported_namespace")
    pods = [("jupyterhub", "jupyter-ann"), ("jupyterhub", 'x"} or vector(1) #')]
    devices = q.devices_query(pods)
    assert devices.startswith(
        '{__name__=~"DCGM_FI_DEV_GPU_UTIL|DCGM_FI_PROF_GR_ENGINE_ACTIVE|'
        'DCGM_FI_DEV_FB_USED|DCGM_FI_DEV_FB_FREE", exported_namespace=~"jupyterhub", '
    )
    assert 'exported_pod=~"jupyter\\\\-ann|x\\\\\\"\\\\}\\\\ or\\\\ vector' in devices
    assert q.last_busy_query(pods).count('exported_pod=~"jupyter') == 2
    history = q.history_query("jupyterhub", "jupyter-ann")
    assert history.startswith("avg(") and "by (gpu, UUID, GPU_I_ID)" in history
    with pytest.raises(ValueError):
        GPUQueries(memory_used_metric="FB USED")


def test_series_and_matrix_answers_are_checked():
    from gpuspawner.clients.prometheus import parse_matrix, parse_series

    body = vector(
        {"metric": {"__name__": "DCGM_FI_DEV_FB_USED", "pod": "p", "gpu": "0"}, "value": [1, "7"]}
    )
    assert parse_series(body, ("__name__", "pod", "UUID")) == [
        ({"__name__": "DCGM_FI_DEV_FB_USED", "pod": "p", "UUID": ""}, 7.0)
    ]
    for wrong in WRONG_SHAPES.values():
        with pytest.raises(PrometheusError):
            parse_series(wrong, ("namespace", "pod"))

    def matrix(*series):
        return {"status": "success", "data": {"resultType": "matrix", "result": list(series)}}

    points = {"metric": {}, "values": [[120, "0.5"], [60, "1"]]}
    assert parse_matrix(matrix(points)) == [(60.0, 1.0), (120.0, 0.5)]
    assert parse_matrix(matrix()) == []
    for wrong in (
        vector(GOOD_ITEM),  # a vector where a matrix was asked for
        matrix(points, points),  # two series where avg() gives one
        matrix({"metric": {}, "values": [[60, "NaN"]]}),
        matrix({"metric": {}, "values": "1"}),
        matrix({"values": [[60, "1"]]}),
    ):
        with pytest.raises(PrometheusError) as e:
            parse_matrix(wrong)
        assert str(e.value).startswith("Prometheus answered")


@pytest.fixture
async def fake_range():
    with scripted_server(r"/api/v1/query_range") as answer:
        yield answer


async def test_query_range_posts_to_the_range_api(fake_range):
    client = PrometheusClient(fake_range["url"], GPUQueries(), timeout=5)
    body = {"status": "success", "data": {"resultType": "matrix", "result": []}}
    fake_range.update(status=200, body=json.dumps(body).encode())
    assert await client.query_range("up", 0, 3600, 60) == body
    fake_range.update(status=400, body=json.dumps({"error": "bad step"}).encode())
    with pytest.raises(PrometheusError, match="answered 400: 'bad step'"):
        await client.query_range("up", 0, 3600, 60)
    assert client.requests == 2
