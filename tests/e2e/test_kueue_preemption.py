"""Kueue's preemption on real nodes: a notebook on borrowed GPUs is preempted when the
queue that lent them wants them back, and its user reads why (issue 31; docs/kueue.md).

Kueue runs with preemption on (``kueue_preemption``: ``withinClusterQueue:
LowerPriority``, ``reclaimWithinCohort: Any``) for this module only: the Kueue that
test_kueue.py used, its ClusterQueues' preemption switched on (conftest.SharedKueue). As in
test_kueue.py the A100 flavor has 8 GPUs on two nodes of 4, ClusterQueue
``notebooks`` 4 of them and ``batch`` the other 4, in one cohort.
"""

from __future__ import annotations

import re

import pytest

from .conftest import pod_of, server_state, stop_servers, wait_for, wait_ready
from .test_capacity import browser
from .test_culler_deadlines import page_text, rest_notices
from .test_kueue import job_running, spawn, submit

#: users whose limit allows 4 GPUs (tests/fixtures/catalogs/e2e.yaml)
NOTEBOOK_USERS = ("quinn", "sven")


@pytest.fixture(scope="module")
def preempting_hub(shared_kueue, kueue_preemption):
    return shared_kueue.hub()


@pytest.fixture
def clean(preempting_hub, kueue_preemption):
    yield
    kueue = kueue_preemption
    running = [(u, "") for u in NOTEBOOK_USERS if server_state(preempting_hub, u) is not None]
    stop_servers(preempting_hub, running)
    for job in kueue.api.get(f"/apis/batch/v1/namespaces/{kueue.batch_namespace}/jobs")["items"]:
        kueue.api.delete(
            f"/apis/batch/v1/namespaces/{kueue.batch_namespace}/jobs/{job['metadata']['name']}",
            query={"propagationPolicy": "Background", "gracePeriodSeconds": "0"},
        )
    wait_for(
        lambda: not kueue.api.get(f"/api/v1/namespaces/{kueue.batch_namespace}/pods")["items"],
        120,
        what="the batch Jobs' pods to go",
    )


def test_a_batch_job_takes_back_its_lent_gpus_and_the_notebook_says_why(
    stack, preempting_hub, kueue_preemption, clean
):
    hub, kueue = preempting_hub, kueue_preemption
    # two notebooks of 4 A100: the first on notebooks' own quota, the second on the 4
    # that batch lends while it has no work
    for user in NOTEBOOK_USERS:
        assert spawn(hub, user, 4).status in (201, 202)
        wait_ready(hub, user, timeout=240)
    pods = {user: pod_of(kueue.api, user)["metadata"]["uid"] for user in NOTEBOOK_USERS}

    # batch's own Job comes: Kueue reclaims batch's quota from the borrowing queue,
    # though the notebooks' priority (interactive, 1000) is above the Job's (none, 0)
    submit(kueue, "train", 4)
    wait_for(lambda: job_running(kueue, "train"), 180, what="the Job to take its GPUs back")

    # exactly one notebook was preempted; the other keeps its pod
    wait_for(
        lambda: sum(server_state(hub, u) is None for u in NOTEBOOK_USERS) == 1,
        120,
        what="the hub to see the preempted notebook stopped",
    )
    (preempted,) = [u for u in NOTEBOOK_USERS if server_state(hub, u) is None]
    (kept,) = set(NOTEBOOK_USERS) - {preempted}
    assert server_state(hub, kept)["ready"]
    assert pod_of(kueue.api, kept)["metadata"]["uid"] == pods[kept]
    assert pod_of(kueue.api, preempted) is None

    # its user reads why: on the home page and through the REST endpoint
    opener = browser(hub, preempted)
    why = (
        r"Your server \(4 × NVIDIA A100\) was stopped at \d\d:\d\d UTC because it was "
        r"preempted for queued work \(its GPUs were borrowed from another queue, which took "
        r"them back\)\."
    )
    home = page_text(opener, f"{hub.public_url}/hub/home")
    assert re.search(why, home), home
    served = wait_for(lambda: rest_notices(opener, hub), 60, what="the gpuspawner service")
    assert served[""]["reason"] == "preempted"
    assert re.fullmatch(why, served[""]["message"]), served
    # the user who kept theirs is told nothing
    assert "was stopped" not in page_text(browser(hub, kept), f"{hub.public_url}/hub/home")
