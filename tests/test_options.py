import pytest

from gpuspawner.options import Refusal, ignored_options, parse_count, resolve_selection


@pytest.mark.parametrize(
    "value, expected",
    [("2", 2), (" 4 ", 4), (0, 0), (8, 8), ("0", 0)],
)
def test_parse_count_accepts_whole_numbers(value, expected):
    assert parse_count(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        "-1",
        "1.5",
        "2; rm -rf /",
        "1e9",
        [],
        None,
        True,
        2.0,
        "0x2",
        "",
        "²",
        -1,
        {"n": 1},
        "9999999",
    ],
)
def test_parse_count_refuses_everything_else(value):
    assert parse_count(value) is None


def test_full_rest_request(pools_catalog):
    s = resolve_selection({"profile": "pytorch", "gpu_type": "a100", "gpus": "2"}, pools_catalog)
    assert (s.image.key, s.gpu_type.key, s.gpus) == ("pytorch", "a100", 2)
    assert s.describe() == "PyTorch with 2 × NVIDIA A100"


def test_json_number_count_is_accepted(pools_catalog):
    s = resolve_selection({"profile": "pytorch", "gpu_type": "h100", "gpus": 8}, pools_catalog)
    assert (s.gpu_type.key, s.gpus) == ("h100", 8)


@pytest.mark.parametrize("request_", [{}, None, {"colour": "blue", "gpus--unlisted-choice": "8"}])
def test_empty_or_unknown_only_request_gets_the_catalog_default(pools_catalog, request_):
    s = resolve_selection(request_, pools_catalog)
    d = pools_catalog.defaults
    assert (s.image.key, s.gpus) == (d.image, d.gpus)
    assert s.gpu_type is None and not s.is_gpu


def test_unknown_keys_never_change_what_is_spawned(pools_catalog):
    plain = resolve_selection(
        {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}, pools_catalog
    )
    noisy = resolve_selection(
        {
            "profile": "pytorch",
            "gpu_type": "a100",
            "gpus": "1",
            "image": "evil/image",
            "extra_resource_limits": {"nvidia.com/gpu": 8},
        },
        pools_catalog,
    )
    assert plain == noisy
    assert ignored_options({"profile": "x", "image": "y", "gpus": 1}) == ["image"]


def test_zero_gpus_is_cpu_only_even_with_a_type(pools_catalog):
    s = resolve_selection({"profile": "pytorch", "gpu_type": "a100", "gpus": "0"}, pools_catalog)
    assert s.gpus == 0 and s.gpu_type is None
    assert s.describe() == "PyTorch without GPUs"


def test_type_without_count_takes_the_smallest_count_of_that_type(pools_catalog):
    s = resolve_selection({"profile": "pytorch", "gpu_type": "mig"}, pools_catalog)
    assert (s.gpu_type.key, s.gpus) == ("mig", 1)


def test_image_that_needs_gpus_gets_one_by_default(pools_catalog):
    s = resolve_selection({"profile": "tensorflow"}, pools_catalog)
    assert (s.gpu_type.key, s.gpus) == ("a100", 1)


@pytest.mark.parametrize(
    "request_, message",
    [
        (
            {"profile": "jax"},
            "There is no profile 'jax': choose one of 'pytorch' (PyTorch) or 'tensorflow' (TensorFlow).",
        ),
        ({"profile": ["pytorch"]}, "There is no profile ['pytorch']"),
        (
            {"profile": "pytorch", "gpu_type": "v100", "gpus": "1"},
            "There is no GPU type 'v100': choose 'a100', 'h100' or 'mig'.",
        ),
        (
            {"profile": "pytorch", "gpu_type": "a100", "gpus": "-1"},
            "'-1' is not a valid number of GPUs: choose one of 0, 1, 2, 4 or 8.",
        ),
        (
            {"profile": "pytorch", "gpu_type": "a100", "gpus": "1.5"},
            "'1.5' is not a valid number of GPUs",
        ),
        (
            {"profile": "pytorch", "gpu_type": "a100", "gpus": "2; rm -rf /"},
            "'2; rm -rf /' is not a valid number of GPUs",
        ),
        (
            {"profile": "pytorch", "gpu_type": "a100", "gpus": "1e9"},
            "'1e9' is not a valid number of GPUs",
        ),
        (
            {"profile": "pytorch", "gpu_type": "a100", "gpus": []},
            "[] is not a valid number of GPUs",
        ),
        (
            {"profile": "pytorch", "gpu_type": "a100", "gpus": True},
            "True is not a valid number of GPUs",
        ),
        (
            {"profile": "pytorch", "gpu_type": "a100", "gpus": "3"},
            "3 is not an allowed number of GPUs: choose one of 0, 1, 2, 4 or 8.",
        ),
        (
            {"profile": "pytorch", "gpu_type": "a100", "gpus": "8"},
            "8 is not an allowed number of NVIDIA A100 GPUs: choose 1, 2 or 4.",
        ),
        (
            {"profile": "pytorch", "gpu_type": "mig", "gpus": "4"},
            "4 is not an allowed number of A100 MIG 1g.10gb GPUs: choose 1 or 2.",
        ),
        (
            {"profile": "tensorflow", "gpu_type": "h100", "gpus": "1"},
            "TensorFlow cannot run on NVIDIA H100 GPUs: choose NVIDIA A100.",
        ),
        (
            {"profile": "tensorflow", "gpus": "0"},
            "TensorFlow cannot run without GPUs: choose a number of GPUs (1, 2 or 4).",
        ),
        ({"profile": "pytorch", "gpu_type": "nope", "gpus": "0"}, "There is no GPU type 'nope'"),
        ("pytorch", "The server options must be a JSON object"),
        (["profile", "pytorch"], "The server options must be a JSON object"),
    ],
)
def test_bad_requests_are_refused_with_a_sentence(pools_catalog, request_, message):
    with pytest.raises(Refusal) as info:
        resolve_selection(request_, pools_catalog)
    refusal = info.value
    assert refusal.status == 400
    assert refusal.message.startswith(message)
    assert refusal.message.endswith(".")
    assert "KeyError" not in refusal.message and "Traceback" not in refusal.message
