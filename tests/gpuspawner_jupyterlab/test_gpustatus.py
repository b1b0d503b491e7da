"""The GPU status's pure part: where the culler is asked, which entry is this server's, how often."""

import math

from gpuspawner_jupyterlab.gpustatus import (
    MAX_POLL_SECONDS,
    MIN_POLL_SECONDS,
    GpuStatus,
    gpu_status_url,
    poll_seconds,
    status_answer,
    this_servers_status,
)

ANSWER = {
    "user": "alice",
    "poll_seconds": 15,
    "servers": [
        {"user": "alice", "server": "", "gpus": 2, "gpu_type": "A100", "utilization": 0.87},
        {"user": "alice", "server": "train", "gpus": 1, "gpu_type": "H100", "utilization": 0.0},
    ],
}


def test_gpu_status_url_is_under_the_cullers_base_url_with_or_without_slash():
    for base in (
        "http://proxy/services/gpuspawner-culler/",
        "http://proxy/services/gpuspawner-culler",
    ):
        assert gpu_status_url(base) == "http://proxy/services/gpuspawner-culler/api/gpu-status"


def test_only_this_servers_entry_is_taken():
    assert this_servers_status(ANSWER, "")["gpu_type"] == "A100"
    assert this_servers_status(ANSWER, "train")["gpu_type"] == "H100"
    # a CPU server is not listed by the culler: no status, no item
    assert this_servers_status(ANSWER, "cpu") is None


def test_no_or_malformed_answer_is_no_status():
    assert this_servers_status({}, "") is None
    assert this_servers_status({"servers": None}, "") is None
    assert this_servers_status({"servers": {"": {}}}, "") is None
    assert this_servers_status({"servers": ["junk", 3, None]}, "") is None
    assert this_servers_status(["not", "a", "mapping"], "") is None


def test_poll_seconds_is_the_cullers_cadence_bounded():
    assert poll_seconds({"poll_seconds": 15}, 30) == 15
    assert poll_seconds({"poll_seconds": 0}, 30) == MIN_POLL_SECONDS
    assert poll_seconds({"poll_seconds": -3}, 30) == MIN_POLL_SECONDS
    assert poll_seconds({"poll_seconds": 86400}, 30) == MAX_POLL_SECONDS
    assert poll_seconds({"poll_seconds": 7.9}, 30) == 7


def test_poll_seconds_falls_back_when_the_culler_does_not_say():
    for answer in (
        None,
        {},
        {"poll_seconds": "15"},
        {"poll_seconds": True},
        {"poll_seconds": math.nan},
    ):
        assert poll_seconds(answer, 30) == 30, answer
    # the fallback is bounded too: a misconfigured 1 s must not hammer the culler
    assert poll_seconds(None, 1) == MIN_POLL_SECONDS


def test_status_answer_for_jupyterlab():
    assert status_answer(ANSWER, "train", 30) == {
        "status": ANSWER["servers"][1],
        "poll_seconds": 15,
    }
    assert status_answer(None, "", 30) == {"status": None, "poll_seconds": 30}
    assert status_answer(ANSWER, "cpu", 30) == {"status": None, "poll_seconds": 15}


def test_the_fallback_cadence_is_configurable():
    assert GpuStatus().poll_seconds == 30
    assert GpuStatus(poll_seconds=10).poll_seconds == 10
