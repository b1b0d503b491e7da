"""The pure answer of the culler's /api/warning: whose servers a token may hear about."""

import pytest

from gpuspawner.culler import policy as P
from gpuspawner.culler.policy import WarningMark
from gpuspawner.culler.warningapi import KEEP_BODY, keep_request, token_servers, warning_answer

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


# --- /api/keep --------------------------------------------------------------------------

NOW = 1_800_000_000.0
SERVERS = {
    ("ada", ""): P.Server("ada", "", max_keep=14400),
    ("ada", "train"): P.Server("ada", "train", max_keep=3600),
    ("ada", "fixed"): P.Server("ada", "fixed", max_keep=0),
    ("bob", ""): P.Server("bob", "", max_keep=14400),
}
POLICY = P.Policy(keep_choices=(3600.0, 14400.0))


def keep(model, body, warned=None, policy=POLICY, freed=()):
    return keep_request(model, body, SERVERS, warned or {}, policy, ["gpuspawner"], NOW, freed)


def test_a_keep_is_granted_for_one_of_the_offered_choices():
    answer = keep(user("ada", "access:servers!user=ada"), {"server": "", "seconds": 14400})
    assert (answer.status, answer.until, answer.seconds) == (200, NOW + 14400, 14400)
    assert answer.server == SERVERS[("ada", "")]
    assert answer.message.startswith("Kept until ") and answer.message.count(".") == 1
    # the image's max_keep leaves 1 h only
    train = keep(user("ada", "access:servers!user=ada"), {"server": "train", "seconds": 14400})
    assert (train.status, train.message) == (400, "Choose a keep of 60 minutes.")
    fixed = keep(user("ada", "access:servers!user=ada"), {"server": "fixed", "seconds": 3600})
    assert fixed.status == 409 and "allows no keep" in fixed.message


@pytest.mark.parametrize(
    "body",
    [None, [], "x", {"server": 1, "seconds": 3600}, {"seconds": "3600"}, {"seconds": True}, {}],
)
def test_a_malformed_request_is_told_what_to_send(body):
    answer = keep(user("ada", "access:servers!user=ada"), body)
    assert (answer.status, answer.message) == (400, KEEP_BODY)
    assert answer.until is None


def test_who_may_keep_what():
    body = {"server": "", "seconds": 3600}
    # a server's token: its own server only
    own = user("ada", "access:servers!server=ada/train")
    assert keep(own, {"server": "train", "seconds": 3600}).status == 200
    assert keep(own, body).status == 403
    # a user's token: never another user's, even when it names one
    assert keep(user("ada", "access:servers!user=ada"), {**body, "user": "bob"}).status == 403
    assert keep(user("bob", "access:servers!user=bob"), {**body, "user": "bob"}).status == 200
    # a keep service asks for the user it names; other services may not
    service = {"kind": "service", "name": "gpuspawner", "scopes": []}
    assert keep(service, {**body, "user": "bob"}).server == SERVERS[("bob", "")]
    assert keep(service, body).status == 400  # names no user
    other = {"kind": "service", "name": "tester", "scopes": ["admin:users"]}
    answer = keep(other, {**body, "user": "bob"})
    assert answer.status == 403 and "keep_services" in answer.message
    # a server the culler does not know
    assert keep(service, {**body, "user": "carl"}).status == 404


def test_no_keep_against_a_deadline_or_while_pressure_wants_its_gpus():
    mine = user("ada", "access:servers!user=ada")
    body = {"server": "", "seconds": 3600}
    for reason in (P.REASON_MAX_AGE, P.REASON_MAX_RUNTIME, P.REASON_BUDGET):
        answer = keep(mine, body, warned={("ada", ""): WarningMark(NOW, reason)})
        assert answer.status == 409 and "save your work" in answer.message, reason
    pressed = {("ada", ""): WarningMark(NOW, P.REASON_PRESSURE)}
    answer = keep(mine, body, warned=pressed)
    assert answer.status == 409 and "Other users are waiting" in answer.message
    assert keep(mine, body, freed={("ada", "")}).status == 409  # chosen for a waiting request
    allowed = P.Policy(keep_choices=(3600.0,), keep_overrides_pressure=True)
    assert keep(mine, body, warned=pressed, policy=allowed).status == 200
    # an idle warning is what a keep is for
    assert keep(mine, body, warned={("ada", ""): WarningMark(NOW, "idle")}).status == 200


def test_the_warning_answer_carries_the_keep_offer():
    keeps = {("ada", ""): ((3600.0, 14400.0), ""), ("ada", "train"): ((), "No.")}
    answer = warning_answer(user("ada", "access:servers!user=ada"), WARNED, 600, 300, keeps)
    by_name = {w["server"]: w for w in answer["warnings"]}
    assert by_name[""]["keep_choices"] == [3600.0, 14400.0] and by_name[""]["keep_refused"] == ""
    assert (by_name["train"]["keep_choices"], by_name["train"]["keep_refused"]) == ([], "No.")
