"""Bad spawn requests through a real JupyterHub's REST API and its real proxy."""

import pytest

from ..conftest import FIXTURES
from .hubprocess import start_hub


def ensure_user(hub, name):
    r = hub.api("POST", f"/users/{name}")
    assert r.status in (201, 409), r.body


@pytest.mark.hub
@pytest.mark.parametrize(
    "body, message",
    [
        (
            {"profile": "pytorch", "gpu_type": "a100", "gpus": " 1"},
            "' 1' is not a valid number of GPUs: choose one of 0, 1, 2, 4 or 8.",
        ),
        (
            {"profile": "pytorch", "gpus--unlisted-choice": "64"},
            "'gpus--unlisted-choice' is not accepted: Number of GPUs has no unlisted choice, "
            "so send 'gpus' with 0, 1, 2, 4 or 8.",
        ),
        (
            {"profile": "pytorch", "gpu_type": "a100\n\x1b[31m", "gpus": "1"},
            "There is no GPU type 'a100\\n\\x1b[31m': choose 'a100', 'h100' or 'mig'.",
        ),
        (
            {"profile": "pytorch", "gpu_type": "a100", "gpus": "-1"},
            "'-1' is not a valid number of GPUs: choose one of 0, 1, 2, 4 or 8.",
        ),
        (
            {"profile": "pytorch", "gpu_type": "a100", "gpus": "1.5"},
            "'1.5' is not a valid number of GPUs: choose one of 0, 1, 2, 4 or 8.",
        ),
        (
            {"profile": "pytorch", "gpu_type": "a100", "gpus": "2; rm -rf /"},
            "'2; rm -rf /' is not a valid number of GPUs: choose one of 0, 1, 2, 4 or 8.",
        ),
        (
            {"profile": "pytorch", "gpu_type": "a100", "gpus": "1e9"},
            "'1e9' is not a valid number of GPUs: choose one of 0, 1, 2, 4 or 8.",
        ),
        (
            # a "%" must survive the hub's formatting (JupyterHub 5.5 formats the error)
            {"profile": "pytorch", "gpu_type": "a100", "gpus": "10%d"},
            "'10%d' is not a valid number of GPUs: choose one of 0, 1, 2, 4 or 8.",
        ),
        (
            {"profile": "pytorch", "gpu_type": "a100", "gpus": []},
            "[] is not a valid number of GPUs: choose one of 0, 1, 2, 4 or 8.",
        ),
        (
            {"profile": "pytorch", "gpu_type": "v100", "gpus": "1"},
            "There is no GPU type 'v100': choose 'a100', 'h100' or 'mig'.",
        ),
        (
            # JupyterHub 6's documented body; JupyterHub 5.5 passes it whole (gpuspawner.hub.compat)
            {"user_options": {"profile": "pytorch", "gpu_type": "v100", "gpus": "1"}},
            "There is no GPU type 'v100': choose 'a100', 'h100' or 'mig'.",
        ),
        (
            {"profile": "tensorflow", "gpu_type": "h100", "gpus": "1"},
            "TensorFlow cannot run on NVIDIA H100 GPUs: choose NVIDIA A100.",
        ),
        (
            # an image without idle_timeout bounds: nobody lengthens the admin's idle rule
            {"profile": "pytorch", "gpu_type": "a100", "gpus": "1", "idle_timeout": "8h"},
            "PyTorch has no idle timeout to choose: leave it out, and the hub's idle rule applies.",
        ),
    ],
)
def test_invalid_request_is_a_400_with_the_sentence(gpu_hub, body, message):
    ensure_user(gpu_hub, "rita")
    r = gpu_hub.api("POST", "/users/rita/server", body)
    assert r.status == 400, r.body
    assert r.json()["message"] == message
    assert gpu_hub.api("GET", "/users/rita").json()["servers"] == {}


@pytest.mark.hub
def test_an_image_for_other_groups_is_refused_like_one_that_does_not_exist(gpu_hub):
    # 'licensed' exists, for the group 'licensed' and alice only; 'jax' does not exist
    ensure_user(gpu_hub, "rita")
    answers = {}
    for profile in ("licensed", "jax"):
        r = gpu_hub.api("POST", "/users/rita/server", {"profile": profile})
        answers[profile] = (r.status, r.json()["message"].replace(profile, "X"))
    assert answers["licensed"] == answers["jax"]
    assert answers["jax"] == (
        403,
        "There is no profile 'X' you may use: "
        "choose one of 'pytorch' (PyTorch) or 'tensorflow' (TensorFlow).",
    )
    assert gpu_hub.api("GET", "/users/rita").json()["servers"] == {}


@pytest.mark.hub
def test_null_count_is_the_types_smallest_not_an_error(gpu_hub):
    # gpus: null is "not given"; the request then fails only on the limit of 0
    ensure_user(gpu_hub, "bob")
    r = gpu_hub.api(
        "POST", "/users/bob/server", {"profile": "pytorch", "gpu_type": "a100", "gpus": None}
    )
    assert r.status == 403
    assert r.json()["message"].startswith("Your GPU limit is 0 (user rule 'bob')")


@pytest.mark.hub
def test_limit_refusals_are_403(gpu_hub):
    ensure_user(gpu_hub, "carol")
    r = gpu_hub.api(
        "POST", "/users/carol/servers/big", {"profile": "pytorch", "gpu_type": "a100", "gpus": "4"}
    )
    assert r.status == 403
    assert r.json()["message"] == "You asked for 4 GPUs but your limit is 2. Ask for 2 or fewer."
    # groups come from the hub: sam is a student, and students may not use H100s
    ensure_user(gpu_hub, "sam")
    r = gpu_hub.api(
        "POST", "/users/sam/server", {"profile": "pytorch", "gpu_type": "h100", "gpus": "1"}
    )
    assert r.status == 403
    assert (
        r.json()["message"]
        == "You may not use NVIDIA H100 GPUs (group rule 'students'): choose another GPU type."
    )


@pytest.mark.hub
def test_refusals_leave_no_traceback_in_the_hub_log(gpu_hub):
    ensure_user(gpu_hub, "rita")
    gpu_hub.api("POST", "/users/rita/server", {"profile": "pytorch", "gpus": "1e9"})
    log = gpu_hub.log()
    # JupyterHub 6 logs "Not starting rita's server: …", 5.5 "Error starting rita's server: …";
    # both log the refusal as one line naming its reason.
    assert "rita's server" in log
    assert "400 RefusedSpawn(reason=invalid-request): '1e9' is not a valid number of GPUs" in log
    assert "KeyError" not in log and "TraitError" not in log
    assert "Traceback" not in log


@pytest.mark.hub
def test_hub_with_an_invalid_catalog_stops_with_one_line(tmp_path):
    hub = start_hub(
        tmp_path / "hub",
        extra_config=f"""
c.GPUSpawner.catalog_file = {str(FIXTURES / "catalogs" / "bad-count.yaml")!r}
from gpuspawner import check_catalog
check_catalog(c)
""",
        # waits, not a speed check: on a loaded 2-core machine importing JupyterHub,
        # KubeSpawner and gpuspawner alone has taken 40 s before the hub could exit
        timeout=120,
    )
    try:
        assert hub.process.wait(timeout=120) == 1
    finally:
        hub.stop()
    log = hub.log()
    assert "gpuspawner: the GPU catalog is invalid, so the hub will not start: " in log
    assert (
        "bad-count.yaml: gpu_types.a100.counts[1]: expected a whole number >= 1, got 'two'" in log
    )
    assert "Traceback" not in log
