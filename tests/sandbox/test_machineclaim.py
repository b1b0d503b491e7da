"""One set of real nodes per machine: the claim (gpuspawner_sandbox.machineclaim)."""

from __future__ import annotations

import json
import os
import subprocess
import threading

import pytest

from gpuspawner_sandbox import machineclaim


@pytest.fixture
def claim_path(tmp_path):
    return tmp_path / "claim.json"


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def never_recorded(_state_dir) -> bool:
    return False


def always_recorded(_state_dir) -> bool:
    return True


def test_a_free_machine_is_claimed_and_given_back(tmp_path, claim_path):
    machineclaim.claim(tmp_path / "a", never_recorded, path=claim_path)
    assert json.loads(claim_path.read_text()) == {
        "state_dir": str(tmp_path / "a"),
        "pid": os.getpid(),
    }
    # Another state dir's release leaves it alone.
    machineclaim.release(tmp_path / "b", path=claim_path)
    assert claim_path.exists()
    machineclaim.release(tmp_path / "a", path=claim_path)
    assert not claim_path.exists()


def test_a_standing_claim_refuses_in_one_sentence_naming_the_way_out(tmp_path, claim_path):
    claim_path.write_text(json.dumps({"state_dir": "/srv/other", "pid": _dead_pid()}))
    with pytest.raises(machineclaim.MachineBusy) as e:
        machineclaim.claim(tmp_path / "mine", always_recorded, path=claim_path)
    assert str(e.value) == (
        "Real nodes of another local cluster run on this machine (state dir /srv/other); stop "
        "them first with `gpuspawner-sandbox --state-dir /srv/other down`, or wait for that "
        "test run or demo to end."
    )
    # The other's claim is untouched.
    assert machineclaim.read_claim(claim_path).state_dir == "/srv/other"


def test_a_claimer_that_lives_holds_the_machine_before_its_nodes_are_recorded(tmp_path, claim_path):
    claim_path.write_text(json.dumps({"state_dir": "/srv/other", "pid": os.getppid()}))
    with pytest.raises(machineclaim.MachineBusy):
        machineclaim.claim(tmp_path / "mine", never_recorded, path=claim_path)


@pytest.mark.parametrize(
    "left",
    [
        json.dumps({"state_dir": "/srv/crashed", "pid": None}),
        "not json",
        "",
    ],
)
def test_an_unreadable_claim_is_taken_over(tmp_path, claim_path, left):
    claim_path.write_text(left)
    machineclaim.claim(tmp_path / "mine", always_recorded, path=claim_path)
    assert machineclaim.read_claim(claim_path).state_dir == str(tmp_path / "mine")


def test_a_claim_left_by_a_crash_is_taken_over(tmp_path, claim_path):
    # Its claimer is dead and its state dir records no nodes.
    claim_path.write_text(json.dumps({"state_dir": "/srv/crashed", "pid": _dead_pid()}))
    machineclaim.claim(tmp_path / "mine", never_recorded, path=claim_path)
    assert machineclaim.read_claim(claim_path) == machineclaim.Claim(
        str(tmp_path / "mine"), os.getpid()
    )


def test_a_start_that_may_wait_gets_the_machine_when_the_other_gives_it_back(
    tmp_path, claim_path, monkeypatch
):
    monkeypatch.setattr(machineclaim, "POLL_SECONDS", 0.05)
    other = tmp_path / "other"
    claim_path.write_text(json.dumps({"state_dir": str(other), "pid": os.getpid()}))
    said = []
    released = threading.Event()

    def emit(line):
        said.append(line)
        # The other run ends while this one waits.
        machineclaim.release(other, path=claim_path)
        released.set()

    machineclaim.claim(
        tmp_path / "mine", lambda d: not released.is_set(), wait=60, emit=emit, path=claim_path
    )
    assert said == [f"Waiting for the real nodes of {other} to stop (at most 60 s)…"]
    assert machineclaim.read_claim(claim_path).state_dir == str(tmp_path / "mine")
