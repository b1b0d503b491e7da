import pytest

from gpuspawner.core.options import (
    ignored_options,
    minutes_text,
    parse_count,
    parse_idle_timeout,
    resolve_idle_timeout,
    resolve_profile,
    resolve_selection,
)
from gpuspawner.core.refusals import Refusal, shown

from ..conftest import FIXTURES


@pytest.mark.parametrize(
    "value, expected",
    [("2", 2), ("4", 4), (0, 0), (8, 8), ("0", 0), ("08", 8), (999_999, 999_999)],
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
        10**7,
        # plain ASCII digits only, as documented: nothing is trimmed or normalised
        " 1",
        "1 ",
        " 4 ",
        "1\n",
        "\t2",
        "+1",
        "1.0",
        "\uff11",  # FULLWIDTH DIGIT ONE
        "\u0663",  # ARABIC-INDIC DIGIT THREE
        "1_0",
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


@pytest.mark.parametrize("request_", [{}, None, {"colour": "blue"}, {"gpus--unlisted-choice": ""}])
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
            {"profile": "pytorch", "gpu_type": "a100", "gpus": " 1"},
            "' 1' is not a valid number of GPUs: choose one of 0, 1, 2, 4 or 8.",
        ),
        (
            {"profile": "pytorch", "gpu_type": "a100", "gpus": "\uff11"},
            "'\uff11' is not a valid number of GPUs",
        ),
        (
            {"profile": "pytorch", "gpu_type": "a100", "gpus": "+1"},
            "'+1' is not a valid number of GPUs",
        ),
        (
            {"profile": "pytorch", "gpu_type": "a100", "gpus": "1.0"},
            "'1.0' is not a valid number of GPUs",
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


# ---------------------------------------------------------------------------
# profiles that do not exist, or that the user may not use
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "profile, shown_as",
    [("jax", "'jax'"), (["pytorch"], "['pytorch']"), ("licensed", "'licensed'")],
)
def test_unknown_and_restricted_profiles_get_the_same_403(pools_catalog, profile, shown_as):
    # carol is in no group and not named by the licensed image: for her it does not exist
    catalog = pools_catalog.visible_to("carol", [])
    with pytest.raises(Refusal) as info:
        resolve_selection({"profile": profile}, catalog)
    assert info.value.status == 403
    assert info.value.reason == "no-such-profile"
    assert info.value.message == (
        f"There is no profile {shown_as} you may use: "
        "choose one of 'pytorch' (PyTorch) or 'tensorflow' (TensorFlow)."
    )


def test_a_member_of_the_group_may_use_the_restricted_image(pools_catalog):
    catalog = pools_catalog.visible_to("carol", ["licensed"])
    s = resolve_selection({"profile": "licensed", "gpu_type": "a100", "gpus": "1"}, catalog)
    assert (s.image.key, s.gpu_type.key, s.gpus) == ("licensed", "a100", 1)
    with pytest.raises(Refusal) as info:
        resolve_selection({"profile": "jax"}, catalog)
    assert "'licensed' (MATLAB)" in info.value.message


# ---------------------------------------------------------------------------
# unlisted choices: the catalog's options have none
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "request_, message",
    [
        (
            {"profile": "pytorch", "gpus--unlisted-choice": "64"},
            "'gpus--unlisted-choice' is not accepted: Number of GPUs has no unlisted choice, "
            "so send 'gpus' with 0, 1, 2, 4 or 8.",
        ),
        (
            # the listed count is valid: the unlisted one must not be ignored either
            {"profile": "pytorch", "gpu_type": "a100", "gpus": "1", "gpus--unlisted-choice": "64"},
            "'gpus--unlisted-choice' is not accepted",
        ),
        (
            {"profile": "tensorflow", "gpus--unlisted-choice": "8"},
            "'gpus--unlisted-choice' is not accepted: Number of GPUs has no unlisted choice, "
            "so send 'gpus' with 1, 2 or 4.",
        ),
        (
            {"gpu_type--unlisted-choice": "b200"},
            "'gpu_type--unlisted-choice' is not accepted: GPU type has no unlisted choice, "
            "so send 'gpu_type' with 'a100', 'h100' or 'mig'.",
        ),
        (
            {"profile": "pytorch", "image--unlisted-choice": "evil/image:latest"},
            "'image--unlisted-choice' is not accepted: there is no option 'image' "
            "with an unlisted choice.",
        ),
    ],
)
def test_unlisted_choices_are_refused_with_a_sentence(pools_catalog, request_, message):
    with pytest.raises(Refusal) as info:
        resolve_selection(request_, pools_catalog)
    assert info.value.status == 400
    assert info.value.reason == "unlisted-choice"
    assert info.value.message.startswith(message)


# ---------------------------------------------------------------------------
# user input in messages
# ---------------------------------------------------------------------------

CONTROL = ["\x00", "\n", "\r", "\x1b[31m", "\u202e", "\x7f", "\u2028"]


@pytest.mark.parametrize("control", CONTROL)
def test_shown_escapes_every_control_character(control):
    text = shown(f"a{control}b")
    assert text.isprintable(), text
    assert text.startswith("'a\\") and text.endswith("b'")


def test_shown_quotes_and_shortens():
    assert shown("jax") == "'jax'"
    assert shown(["pytorch"]) == "['pytorch']"
    assert shown(3) == "3"
    assert shown("x" * 100) == "'" + "x" * 40 + "'..."
    assert shown({"k": "\x00" * 100}).endswith("...")
    assert shown({"k": "\x00" * 100}).isprintable()


@pytest.mark.parametrize(
    "request_",
    [
        {"profile": "py\ntorch"},
        {"profile": "pytorch", "gpu_type": "a100\x00", "gpus": "1"},
        {"profile": "pytorch", "gpu_type": "a100", "gpus": "1\n"},
        {"profile": "pytorch", "gpu_type": "a100", "gpus": ["\x1b[2J"]},
        {"profile": "pytorch", "gpus\n--unlisted-choice": "1"},
    ],
)
def test_refusals_carry_no_control_characters(pools_catalog, request_):
    with pytest.raises(Refusal) as info:
        resolve_selection(request_, pools_catalog)
    assert info.value.message.isprintable(), info.value.message


def test_a_refusal_is_a_value_error_with_its_status_and_message():
    refusal = Refusal("No.", status=403, reason="limit")
    assert isinstance(refusal, ValueError)
    assert (refusal.status, refusal.reason, refusal.jupyterhub_message) == (403, "limit", "No.")
    assert str(refusal) == "No."


# ---------------------------------------------------------------------------
# a plain KubeSpawner profile_list (no catalog)
# ---------------------------------------------------------------------------

PROFILES = [
    {
        "display_name": "Small",
        "slug": "small",
        "default": True,
        "profile_options": {
            "image": {
                "display_name": "Image",
                "choices": {"a": {"display_name": "A"}, "b": {"display_name": "B"}},
                "unlisted_choice": {"enabled": False},
            },
        },
    },
    {
        "display_name": "Custom",
        "slug": "custom",
        "profile_options": {
            "image": {
                "display_name": "Image",
                "choices": {"a": {"display_name": "A"}},
                "unlisted_choice": {
                    "enabled": True,
                    "validation_regex": "^jupyter/.+:.+$",
                    "validation_message": "Must be an image matching ^jupyter/<name>:<tag>$",
                },
            },
        },
    },
]


@pytest.mark.parametrize(
    "request_, slug",
    [
        ({}, "small"),
        ({"profile": "small", "image": "b"}, "small"),
        ({"profile": "custom", "image--unlisted-choice": "jupyter/scipy-notebook:2025"}, "custom"),
        ({"profile": "custom", "image--unlisted-choice": ""}, "custom"),
    ],
)
def test_plain_profiles_accept_what_kubespawner_accepts(request_, slug):
    assert resolve_profile(request_, PROFILES)["slug"] == slug


@pytest.mark.parametrize(
    "request_, message",
    [
        (
            {"profile": "nope\n"},
            "There is no profile 'nope\\n' you may use: choose one of 'small' or 'custom'.",
        ),
        (
            {"profile": "small", "image": "zzz"},
            "'zzz' is not a choice for Image: choose one of 'a', 'b'.",
        ),
        (
            {"profile": "small", "image--unlisted-choice": "evil/image"},
            "'image--unlisted-choice' is not accepted: Image has no unlisted choice, "
            "so send 'image' with 'a' or 'b'.",
        ),
        (
            # no profile: the default one, whose option has no unlisted choice
            {"image--unlisted-choice": "evil/image"},
            "'image--unlisted-choice' is not accepted: Image has no unlisted choice",
        ),
        (
            {"profile": "small", "cpu--unlisted-choice": "64"},
            "'cpu--unlisted-choice' is not accepted: there is no option 'cpu' "
            "with an unlisted choice.",
        ),
        (
            {"profile": "custom", "image--unlisted-choice": "evil/image\x1b[0m"},
            "'evil/image\\x1b[0m' is not accepted as the other choice for Image: "
            "Must be an image matching ^jupyter/<name>:<tag>$.",
        ),
        (
            {"profile": "custom", "image--unlisted-choice": ["jupyter/x:1"]},
            "['jupyter/x:1'] is not accepted as the other choice for Image",
        ),
    ],
)
def test_plain_profiles_refuse_with_a_sentence(request_, message):
    with pytest.raises(Refusal) as info:
        resolve_profile(request_, PROFILES)
    assert info.value.status == 400
    assert info.value.message.startswith(message)
    assert info.value.message.isprintable()


# ---------------------------------------------------------------------------
# the user's idle timeout (issue 32)
# ---------------------------------------------------------------------------


def _idle_catalog():
    import yaml

    from gpuspawner.core.catalog import parse_catalog

    raw = yaml.safe_load((FIXTURES / "catalogs" / "pools.yaml").read_text())
    raw["images"]["pytorch"]["idle_timeout"] = {"min": "30m", "max": "8h", "default": "1h"}
    return parse_catalog(raw)


@pytest.mark.parametrize(
    "value, seconds",
    [
        (90, 5400.0),
        ("90", 5400.0),
        (1.5, 90.0),
        ("1.5", 90.0),
        ("1h30m", 5400.0),
        ("45m", 2700.0),
        ("2h", 7200.0),
        ("3600s", 3600.0),
    ],
)
def test_an_idle_timeout_is_minutes_or_a_duration(value, seconds):
    assert parse_idle_timeout(value) == seconds


@pytest.mark.parametrize(
    "value",
    [
        True,
        0,
        "0",
        -5,
        "-5",
        float("nan"),
        float("inf"),
        "1e9",
        "ninety",
        "1h 30m",
        "90 ",
        [],
        {"m": 1},
        "",
        "9" * 40,
        "\uff19\uff10",
    ],
)
def test_an_idle_timeout_that_is_not_one_is_not_read(value):
    assert parse_idle_timeout(value) is None


def test_an_image_with_bounds_takes_the_users_idle_timeout_or_its_default():
    catalog = _idle_catalog()
    chosen = resolve_selection({"profile": "pytorch", "idle_timeout": 90}, catalog)
    assert chosen.idle_timeout == 5400.0
    assert (
        resolve_selection({"profile": "pytorch", "idle_timeout": "2h"}, catalog).idle_timeout
        == 7200
    )
    # not sent, or the form's empty field: the image's default
    assert resolve_selection({"profile": "pytorch"}, catalog).idle_timeout == 3600
    assert (
        resolve_selection({"profile": "pytorch", "idle_timeout": ""}, catalog).idle_timeout == 3600
    )
    # the bounds themselves are allowed, as the form shows them (minutes)
    assert (
        resolve_selection({"profile": "pytorch", "idle_timeout": "30"}, catalog).idle_timeout
        == 1800
    )
    assert (
        resolve_selection({"profile": "pytorch", "idle_timeout": "480"}, catalog).idle_timeout
        == 28800
    )
    # an image without bounds has none
    assert resolve_selection({"profile": "tensorflow"}, catalog).idle_timeout is None
    assert "idle_timeout" not in ignored_options({"idle_timeout": 90})


@pytest.mark.parametrize("value", [29, "8h1m", 481, "1d"])
def test_an_idle_timeout_outside_the_bounds_is_refused_with_them(value):
    with pytest.raises(Refusal) as info:
        resolve_selection({"profile": "pytorch", "idle_timeout": value}, _idle_catalog())
    assert info.value.status == 400
    assert "30" in info.value.message and "480" in info.value.message
    assert "PyTorch" in info.value.message


def test_an_unreadable_idle_timeout_is_refused_quoted():
    with pytest.raises(Refusal) as info:
        resolve_selection({"profile": "pytorch", "idle_timeout": "soon\n<b>"}, _idle_catalog())
    assert info.value.status == 400
    assert "\n" not in info.value.message and "<b>" in info.value.message  # quoted, not HTML
    assert shown("soon\n<b>") in info.value.message


def test_an_image_without_bounds_refuses_an_idle_timeout():
    with pytest.raises(Refusal) as info:
        resolve_selection({"profile": "tensorflow", "idle_timeout": 90}, _idle_catalog())
    assert info.value.status == 400
    assert "TensorFlow" in info.value.message


def test_idle_bounds_are_shown_as_the_forms_minutes():
    assert minutes_text(5400) == "90"
    assert minutes_text(90) == "1.5"
    assert minutes_text(100) == "1.667"
    # a bound the form shows rounded is accepted back, and clamped into the bounds
    import dataclasses

    from gpuspawner.core.catalog import IdleTimeoutBounds

    # 110 s shows as "1.833" (109.98 s), 130 s as "2.167" (130.02 s)
    image = dataclasses.replace(
        _idle_catalog().images["pytorch"], idle_timeout=IdleTimeoutBounds(110, 130, 120)
    )
    assert resolve_idle_timeout(minutes_text(110), image) == 110
    assert resolve_idle_timeout(minutes_text(130), image) == 130
