"""The cluster network on real nodes: what a pod that needs the API server or a Service meets.

The package's stack (tests/e2e/conftest.py) runs the real kube-proxy (from the
control plane's module) over every node's bridge, CoreDNS as every pod's
nameserver, and the API server on the host's pod-range address as the
"kubernetes" Service's endpoint. These are what the in-cluster hub of the
zero-to-jupyterhub chart needs: the API server by its Service, and the chart's
own Services (hub, proxy-api, proxy-public) by name from pods on other nodes.
"""

from __future__ import annotations

import json
import subprocess
import urllib.request

import pytest

from gpuspawner_sandbox import nodeconfig, testing

from .conftest import NODE_IMAGE, wait_for

# Run in a pod (the notebook image's Python): what the pod's network shows, as JSON
# in its termination message.
ASK_THE_API = """
import json, os, socket, ssl, urllib.error, urllib.request
sa = "/var/run/secrets/kubernetes.io/serviceaccount"
seen = {
    "service_host": os.environ.get("KUBERNETES_SERVICE_HOST"),
    "nameservers": [l.split()[1] for l in open("/etc/resolv.conf") if l.startswith("nameserver")],
    "kubernetes": socket.gethostbyname("kubernetes.default.svc.cluster.local"),
}
try:
    socket.getaddrinfo("pypi.org", 443)
    seen["outside"] = "resolved"
except socket.gaierror as e:
    seen["outside"] = "unresolved"
context = ssl.create_default_context(cafile=sa + "/ca.crt")
opener = urllib.request.build_opener(
    urllib.request.ProxyHandler({}), urllib.request.HTTPSHandler(context=context)
)
namespace = open(sa + "/namespace").read()
request = urllib.request.Request(
    # By the Service's short name: the pod's search path completes it.
    f"https://kubernetes.default.svc/api/v1/namespaces/{namespace}/pods",
    headers={"Authorization": "Bearer " + open(sa + "/token").read()},
)
try:
    seen["status"] = opener.open(request, timeout=20).status
except urllib.error.HTTPError as e:
    seen["status"] = e.code
    seen["message"] = json.loads(e.read())["message"]
open("/dev/termination-log", "w").write(json.dumps(seen))
"""

FETCH = """
import json, sys, urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
body = opener.open(sys.argv[1], timeout=20).read().decode()
open("/dev/termination-log", "w").write(json.dumps({"body": body}))
"""

# Serves its own pod name (its hostname) at / on port 8080.
SERVE = """
import http.server, socket
class Name(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = socket.gethostname().encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
http.server.HTTPServer(("", 8080), Name).serve_forever()
"""


@pytest.fixture(scope="module")
def namespace(stack):
    with testing.temporary_namespace(stack.control_plane, "net") as name:
        yield name


def _pod(name: str, node: str, script: str, *args: str, labels: dict | None = None) -> dict:
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {
            # On a chosen node, GPU taints tolerated: the point is which node.
            "nodeName": node,
            "tolerations": [{"operator": "Exists"}],
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "main",
                    "image": NODE_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python3", "-c", script, *args],
                    "resources": {"limits": {"memory": "256Mi"}},
                }
            ],
        },
    }


def _finished(kube, namespace: str, name: str) -> dict:
    """The pod's termination message as JSON, once its container ended."""

    def terminated():
        pod = kube.get(f"/api/v1/namespaces/{namespace}/pods/{name}")
        statuses = pod["status"].get("containerStatuses") or []
        return statuses and statuses[0]["state"].get("terminated")

    state = wait_for(terminated, 120, what=f"pod {name} to finish")
    assert state["exitCode"] == 0, state
    return json.loads(state["message"])


def _nodes(stack) -> tuple[str, str]:
    """A CPU-only node and a GPU node: two nodes, two bridges."""
    cpu = next(n for n in stack.nodes.names if not stack.nodes.gpu_spec(n))
    gpu = next(n for n in stack.nodes.names if stack.nodes.gpu_spec(n))
    return cpu, gpu


def test_a_pod_reaches_the_api_server_by_the_kubernetes_service_and_resolves_nothing_outside(
    stack, kube, namespace
):
    cpu, _ = _nodes(stack)
    kube.post(f"/api/v1/namespaces/{namespace}/pods", _pod("ask-the-api", cpu, ASK_THE_API))
    seen = _finished(kube, namespace, "ask-the-api")
    service_ip = stack.control_plane.service_ip
    assert seen["service_host"] == service_ip
    assert seen["nameservers"] == [nodeconfig.DNS_ADDRESS]
    assert seen["kubernetes"] == service_ip
    # The cluster DNS forwards nothing: a name outside the cluster does not resolve.
    assert seen["outside"] == "unresolved"
    # TLS verified against the cluster's CA for kubernetes.default.svc, and the
    # API server authenticated the pod's token (the default account may not list pods).
    assert seen["status"] == 403, seen
    assert f"system:serviceaccount:{namespace}:default" in seen["message"]
    endpoints = kube.get("/apis/discovery.k8s.io/v1/namespaces/default/endpointslices")["items"]
    addresses = {a for s in endpoints for e in s["endpoints"] for a in e["addresses"]}
    assert addresses == {nodeconfig.API_ADDRESS}


def test_a_service_on_one_node_answers_a_pod_on_another_by_name(stack, kube, namespace):
    cpu, gpu = _nodes(stack)
    base = f"/api/v1/namespaces/{namespace}"
    kube.post(f"{base}/pods", _pod("echo-0", cpu, SERVE, labels={"app": "echo"}))
    kube.post(
        f"{base}/services",
        {
            "metadata": {"name": "echo"},
            "spec": {"selector": {"app": "echo"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )

    def ready_endpoint():
        slices = kube.get(
            "/apis/discovery.k8s.io/v1/namespaces/" + namespace + "/endpointslices",
            query={"labelSelector": "kubernetes.io/service-name=echo"},
        )["items"]
        return any(
            e.get("conditions", {}).get("ready") for s in slices for e in s.get("endpoints") or []
        )

    # The pod has no readiness probe: ready once it runs.
    wait_for(ready_endpoint, 120, what="the echo Service's endpoint")
    url = f"http://echo.{namespace}.svc.cluster.local/"
    kube.post(f"{base}/pods", _pod("fetch", gpu, FETCH, url))
    assert _finished(kube, namespace, "fetch") == {"body": "echo-0"}
    # Our drop rule still comes before kube-proxy's rules in FORWARD.
    forward = subprocess.run(
        ["iptables", "-S", "FORWARD"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    jumps = [rule for rule in forward if rule.startswith("-A FORWARD")]
    assert jumps[0] == f"-A FORWARD -j {nodeconfig.FORWARD_CHAIN}", jumps
    assert stack.nodes.forward_drops() == 0


def test_the_host_reaches_a_service_and_sent_nothing_to_the_pod_range_elsewhere(
    stack, kube, namespace
):
    """The host's own connection to a ClusterIP (kube-proxy rewrites it in OUTPUT), and
    our OUTPUT guard's counter: no packet of the host's to the pod range left by
    another interface during the suite so far."""
    service = kube.get(f"/api/v1/namespaces/{namespace}/services/echo")
    url = f"http://{service['spec']['clusterIP']}/"
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    assert opener.open(url, timeout=20).read().decode() == "echo-0"
    assert stack.nodes.host_drops() == 0
