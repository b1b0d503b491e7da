"""The pure answer of the culler's /api/warning: whose servers a token may hear about."""

import pytest

from gpuspawner.culler.policy import WarningMark
from gpuspawner.culler.warningapi import token_servers, warning_answer

from ..security.payloads import PAYLOADS

WARNED = {
    ("ada", ""): WarningMark(warned_at=1000.0, reason="idle"),
    ("ada", "train"): WarningMark(warned_at=1100.0, reason="gpu-idle"),
    ("bob", ""): WarningMark(warned_at=1000.0, reason="max-age"),
}


def user(name, *scopes):
    return {"kind": "user", "name": name, "scopes": list(scopes)}


def test_a_server_token_speaks_for_its_own_server_only():
    assert token_servers(
        user("ada", "access:servers!server=ada/train", "read:users:name!user=ada")
    ) == (
        "ada",
        frozenset({"train"}),
    )
    # a scope naming another user's server never counts
    assert token_servers(user("ada", "access:servers!server=bob/")) == ("ada", frozenset())


def test_a_user_or_admin_token_speaks_for_all_of_its_users_servers():
    assert token_servers(user("ada", "access:servers!user=ada")) == ("ada", None)
    assert token_servers(user("ada", "access:servers")) == ("ada", None)
    assert token_servers(user("ada", "access:servers!user=bob")) == ("ada", frozenset())


def test_a_service_token_has_no_servers():
    assert token_servers({"kind": "service", "name": "x", "scopes": ["access:servers"]}) == (
        None,
        frozenset(),
    )


def test_answer_holds_only_the_callers_servers_with_time_reason_and_advice():
    answer = warning_answer(user("ada", "access:servers!server=ada/train"), WARNED, 600, 300)
    [w] = answer["warnings"]
    assert (w["user"], w["server"], w["reason"]) == ("ada", "train", "gpu-idle")
    assert w["cull_at"] == 1100 + 600
    assert w["cull_at_iso"] == "1970-01-01T00:28:20+00:00"
    assert "run something on its GPUs" in w["keep"]
    assert w["message"].startswith("Your server 'ada/train' will be stopped at 1970-01-01T00:28:20")


def test_cull_time_is_the_first_pass_after_the_period():
    # warned at 1000, period 600, a pass every 250 s: passes at 1250, 1500, 1750
    [w, _] = warning_answer(user("ada", "access:servers!user=ada"), WARNED, 600, 250)["warnings"]
    assert w["server"] == "" and w["cull_at"] == 1750


def test_max_age_says_it_cannot_be_kept():
    [w] = warning_answer(user("bob", "access:servers!user=bob"), WARNED, 60, 60)["warnings"]
    assert "cannot be kept" in w["keep"] and "maximum age" in w["message"]


def test_nobody_else_hears_of_them():
    assert warning_answer(user("eve", "access:servers!user=eve"), WARNED, 60, 60)["warnings"] == []
    assert warning_answer({"kind": "service", "name": "s", "scopes": []}, WARNED, 60, 60) == {
        "user": None,
        "warnings": [],
    }


@pytest.mark.parametrize(("name", "value"), PAYLOADS, ids=[n for n, _ in PAYLOADS])
def test_the_notification_text_holds_nothing_a_user_chose(name, value):
    # JupyterLab's notification is built from cull_at, why and keep (src/index.js,
    # warningMessage): the culler's own sentences, never the server's name.
    warned = {("ada", value): WarningMark(warned_at=1000.0, reason="gpu-idle")}
    [w] = warning_answer(user("ada", "access:servers!user=ada"), warned, 600, 300)["warnings"]
    assert w["server"] == value  # data, for the extension to match its own server
    for text in (w["why"], w["keep"]):
        assert value not in text
    # the plain-text message quotes it, with every unprintable character escaped
    assert w["message"].isprintable()
