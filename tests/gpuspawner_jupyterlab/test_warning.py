"""The extension's pure part: where the culler is asked, and which warning is this server's."""

from gpuspawner_jupyterlab.warning import CullWarning, this_servers_warning, warning_url


def test_warning_url_is_under_the_cullers_base_url_with_or_without_slash():
    for base in (
        "http://proxy/services/gpuspawner-culler/",
        "http://proxy/services/gpuspawner-culler",
    ):
        assert warning_url(base) == "http://proxy/services/gpuspawner-culler/api/warning"


def test_only_this_servers_warning_is_taken():
    answer = {
        "warnings": [
            {"server": "", "reason": "idle"},
            {"server": "train", "reason": "gpu-idle"},
        ]
    }
    assert this_servers_warning(answer, "train") == {"server": "train", "reason": "gpu-idle"}
    assert this_servers_warning(answer, "") == {"server": "", "reason": "idle"}
    assert this_servers_warning(answer, "other") is None


def test_no_or_malformed_answer_is_no_warning():
    assert this_servers_warning({}, "") is None
    assert this_servers_warning({"warnings": None}, "") is None
    assert this_servers_warning({"warnings": ["junk", 3]}, "") is None


def test_defaults_come_from_the_hubs_environment(monkeypatch):
    monkeypatch.setenv("GPUSPAWNER_CULLER_URL", "http://hub:10101/")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "secret")
    monkeypatch.setenv("JUPYTERHUB_SERVER_NAME", "train")
    config = CullWarning()
    assert (config.culler_url, config.api_token, config.server_name) == (
        "http://hub:10101/",
        "secret",
        "train",
    )
    monkeypatch.delenv("GPUSPAWNER_CULLER_URL")
    assert CullWarning().culler_url == ""


def test_keep_is_asked_at_the_cullers_api_keep_with_whole_seconds_only():
    from gpuspawner_jupyterlab.warning import keep_seconds, keep_url

    assert keep_url("http://proxy/services/gpuspawner-culler") == (
        "http://proxy/services/gpuspawner-culler/api/keep"
    )
    assert keep_seconds({"seconds": 3600}) == keep_seconds({"seconds": 3600.0}) == 3600
    for body in ({"seconds": True}, {"seconds": "3600"}, {"seconds": 0.5}, {}, None, []):
        assert keep_seconds(body) is None, body
    assert keep_seconds({"seconds": 8 * 86400}) is None  # beyond any culler's max_keep


def test_the_cullers_answer_is_a_keep_its_refusal_or_one_sentence():
    import json

    from gpuspawner_jupyterlab.warning import NO_CULLER, keep_answer

    until = 1_800_003_600.0
    assert keep_answer(200, json.dumps({"keep_until": until})) == (
        200,
        {"until": until, "message": "Kept until 09:00 UTC."},
    )
    assert keep_answer(403, json.dumps({"message": "No."})) == (403, {"message": "No."})
    for status, body in ((200, "{}"), (200, "x"), (500, '{"message": "boom"}'), (200, "[1]")):
        assert keep_answer(status, body) == (502, {"message": NO_CULLER}), body
