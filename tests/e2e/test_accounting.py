"""GPU usage accounting on real nodes: the hub's recorder, its store in the hub's own database.

Each server's interval must be the pod's own lifetime, read here from what the
API server says about the pod (its watch events, its Kubernetes Events), to
the second; and a pod deleted while the hub is down must be closed at its real
end when the hub is back, its usage counted across the restart.
"""

from __future__ import annotations

import csv
import io
import time
import urllib.request
from datetime import datetime, timezone

import pytest

from gpuspawner.accounting.store import UsageStore
from gpuspawner.core.usage import intervals_csv

from .conftest import ensure_user, pod_of, stop_server, stop_servers, wait_for, wait_ready
from .podwatch import NAMESPACE, PODS, PodWatch


def epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def iso(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@pytest.fixture
def usage(stack):
    """The usage store in the hub's own database (c.GPUSpawner.accounting_db_url unset)."""
    store = UsageStore(f"sqlite:///{stack.state_dir / 'hub' / 'jupyterhub.sqlite'}")
    yield store
    store.close()


def start(hub, user: str, gpu_type: str, gpus: int) -> None:
    ensure_user(hub, user)
    options = {"profile": "pytorch", "gpu_type": gpu_type, "gpus": str(gpus)}
    r = hub.api("POST", f"/users/{user}/server", options)
    assert r.status in (201, 202), r.body


def scheduled_at(pod: dict) -> float:
    (condition,) = [c for c in pod["status"]["conditions"] if c["type"] == "PodScheduled"]
    assert condition["status"] == "True", condition
    return epoch(condition["lastTransitionTime"])


def lifetime(events: list[dict], uid: str) -> tuple[float, float, str]:
    """(start, end, what the end is) of pod ``uid`` from its watch events, as the API server sent them.

    Start: its PodScheduled condition's True transition. End: the latest
    ``finishedAt`` of its containers once they have all terminated; on these
    real nodes the kubelet removes a pod it was asked to delete before it
    reports the notebook's ``finishedAt``, and then its end is when the
    deletion was asked for (``deletionTimestamp`` less the grace period).
    """
    states = [e["object"] for e in events if e["object"]["metadata"]["uid"] == uid]
    assert states and any(e["type"] == "DELETED" for e in events if e["object"] in states)
    last = states[-1]
    finished = []
    running = False
    for key in ("initContainerStatuses", "containerStatuses"):
        for status in last["status"].get(key) or []:
            terminated = status["state"].get("terminated")
            if terminated:
                finished.append(epoch(terminated["finishedAt"]))
            elif key == "containerStatuses":
                running = True
    if not running:
        return scheduled_at(last), max(finished), "finishedAt"
    meta = last["metadata"]
    deleted = epoch(meta["deletionTimestamp"]) - meta["deletionGracePeriodSeconds"]
    return scheduled_at(last), deleted, "deletion"


def csv_rows(store: UsageStore, uids: set[str]) -> dict[str, dict]:
    now = time.time()
    text = intervals_csv(store.intervals(0, now + 1), 0, now + 1, now)
    return {row["uid"]: row for row in csv.DictReader(io.StringIO(text)) if row["uid"] in uids}


def metrics_text(hub) -> str:
    with urllib.request.urlopen(f"{hub.public_url}/hub/metrics", timeout=30) as response:
        return response.read().decode()


def gpu_seconds_metric(text: str, gpu_type: str, group: str = "") -> float:
    line = f'gpuspawner_gpu_seconds_total{{gpu_type="{gpu_type}",group="{group}"}} '
    (value,) = [ln[len(line) :] for ln in text.splitlines() if ln.startswith(line)]
    return float(value)


def test_the_intervals_csv_is_the_pods_real_lifetimes_to_the_second(hub, kube, usage):
    watch = PodWatch(kube)
    watch.start()
    servers = [("acct-ann", "a100", 1), ("acct-bo", "a100", 2), ("acct-cy", "h100", 1)]
    for user, gpu_type, gpus in servers:
        start(hub, user, gpu_type, gpus)
    for user, _, _ in servers:
        wait_ready(hub, user)
    uids = {user: pod_of(kube, user)["metadata"]["uid"] for user, _, _ in servers}
    # One stops on its own, a little later the two others together.
    stop_server(hub, "acct-ann")
    time.sleep(2)
    stop_servers(hub, [("acct-bo", ""), ("acct-cy", "")])
    wait_for(
        lambda: all(
            uid in {e["object"]["metadata"]["uid"] for e in watch.seen() if e["type"] == "DELETED"}
            for uid in uids.values()
        ),
        90,
        what="the pods' last watch events",
    )
    wait_for(
        lambda: all((iv := usage.get(uid)) and iv.end is not None for uid in uids.values()),
        60,
        what="the hub to close the intervals",
    )
    rows = csv_rows(usage, set(uids.values()))
    for user, gpu_type, gpus in servers:
        uid = uids[user]
        begin, end, _ = lifetime(watch.seen(), uid)
        row = rows[uid]
        assert (row["user"], row["gpu_type"], row["gpus"]) == (user, gpu_type, str(gpus))
        assert (row["start"], row["end"]) == (iso(begin), iso(end)), (user, row)
        assert float(row["seconds"]) == end - begin
        assert float(row["gpu_seconds"]) == (end - begin) * gpus
        assert usage.get(uid).end_source == "pod"


def test_a_pod_deleted_while_the_hub_is_down_is_counted_until_its_real_end(stack, hub, kube, usage):
    start(hub, "acct-dee", "a100", 1)
    wait_ready(hub, "acct-dee")
    pod = pod_of(kube, "acct-dee")
    uid = pod["metadata"]["uid"]
    opened = wait_for(lambda: usage.get(uid), 60, what="the hub to open the interval")
    assert (opened.start, opened.end) == (scheduled_at(pod), None)

    stack.stop_hub()
    kube.delete(f"{PODS}/{pod['metadata']['name']}")  # as kubectl delete pod does
    wait_for(
        lambda: (
            not any(
                p["metadata"]["uid"] == uid
                for p in kube.get(
                    PODS, query={"labelSelector": "hub.jupyter.org/username=acct-dee"}
                )["items"]
            )
        ),
        120,
        what="the pod to be gone",
    )
    assert usage.get(uid).end is None  # nobody was there to see it go
    killing = kube.get(
        f"/api/v1/namespaces/{NAMESPACE}/events",
        query={"fieldSelector": f"involvedObject.uid={uid},reason=Killing"},
    )["items"]
    assert killing, "the kubelet's Killing event of the deleted pod"
    ended = max(epoch(e["lastTimestamp"]) for e in killing)

    hub = stack.start_hub()  # it polls acct-dee's server: the recorder starts and reconciles
    closed = wait_for(
        lambda: (iv := usage.get(uid)) and iv.end is not None and iv,
        90,
        what="the restarted hub to close the interval",
    )
    assert (closed.start, closed.end, closed.end_source) == (scheduled_at(pod), ended, "event")
    wait_for(
        lambda: hub.api("GET", "/users/acct-dee").json()["servers"] == {},
        60,
        what="the hub to see the server gone",
    )
    # Counted across the restart: the new hub's counter starts from the store.
    text = metrics_text(hub)
    assert gpu_seconds_metric(text, "a100") >= ended - scheduled_at(pod)
    assert "acct-dee" not in text
    row = csv_rows(usage, {uid})[uid]
    assert (row["start"], row["end"]) == (iso(scheduled_at(pod)), iso(ended))
