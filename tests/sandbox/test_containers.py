"""How the local kubelet builds a container's process: expansion, env, loopback confinement, phases."""

import pytest

from gpuspawner_sandbox import containers as ct

POD = {
    "metadata": {
        "name": "jupyter-alice",
        "namespace": "hub",
        "uid": "1234-abcd",
        "labels": {"app": "jupyterhub", "gpuspawner.io/gpus": "2"},
        "annotations": {"hub.jupyter.org/username": "alice"},
    },
    "spec": {"nodeName": "gpu-a100-0", "serviceAccountName": "default"},
}


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("$(A)", "1"),
        ("x$(A)y$(B)z", "x1y2z"),
        ("$(MISSING)", "$(MISSING)"),
        ("$$(A)", "$(A)"),
        ("$$", "$"),
        ("$A", "$A"),
        ("$(A", "$(A"),
        ("cost: 5$", "cost: 5$"),
        ("", ""),
    ],
)
def test_expand_follows_kubernetes_rules(text, want):
    assert ct.expand(text, {"A": "1", "B": "2"}) == want


def test_env_in_order_with_references_and_downward_api():
    container = {
        "env": [
            {"name": "USER", "value": "alice"},
            {"name": "GREETING", "value": "hi $(USER) from $(POD)"},
            {"name": "POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
            {"name": "LATE", "value": "$(POD)"},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
            {
                "name": "WHO",
                "valueFrom": {
                    "fieldRef": {"fieldPath": "metadata.annotations['hub.jupyter.org/username']"}
                },
            },
            {
                "name": "GPUS",
                "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['gpuspawner.io/gpus']"}},
            },
        ]
    }
    env = ct.build_env(POD, container, "127.0.0.7", "127.0.0.1")
    # POD is defined after GREETING, so it stays unexpanded there, as in Kubernetes.
    assert env["GREETING"] == "hi alice from $(POD)"
    assert env["LATE"] == "jupyter-alice"
    assert (env["IP"], env["NODE"], env["WHO"], env["GPUS"]) == (
        "127.0.0.7",
        "gpu-a100-0",
        "alice",
        "2",
    )


def test_env_from_configmaps_and_secrets():
    container = {
        "envFrom": [{"configMapRef": {"name": "cm"}, "prefix": "CM_"}],
        "env": [
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "token"}}},
            {
                "name": "OPT",
                "valueFrom": {"secretKeyRef": {"name": "nope", "key": "x", "optional": True}},
            },
        ],
    }
    env = ct.build_env(
        POD, container, "127.0.0.7", "127.0.0.1", {"cm": {"a": "1"}}, {"s": {"token": "t0k"}}
    )
    assert env == {"CM_a": "1", "TOKEN": "t0k"}
    assert ct.referenced_objects(container) == ({"cm"}, {"s", "nope"})
    with pytest.raises(ct.ContainerConfigError, match='secret "s" not found'):
        ct.build_env(POD, container, "127.0.0.7", "127.0.0.1", {"cm": {}}, {})


def test_resource_field_ref():
    container = {"resources": {"limits": {"cpu": "1500m", "memory": "2Gi"}}}
    assert ct.resource_field_ref(container, {"resource": "limits.cpu"}) == "2"
    assert (
        ct.resource_field_ref(container, {"resource": "requests.memory", "divisor": "1Mi"})
        == "2048"
    )


def test_argv_uses_args_alone_as_kubespawner_sends_them():
    env = {"PORT": "8888"}
    assert ct.container_argv({"args": ["jupyterhub-singleuser", "--port=$(PORT)"]}, env) == [
        "jupyterhub-singleuser",
        "--port=8888",
    ]
    assert ct.container_argv({"command": ["sh", "-c"], "args": ["echo $(PORT)"]}, env) == [
        "sh",
        "-c",
        "echo 8888",
    ]
    with pytest.raises(ct.ContainerStartError, match="no command specified"):
        ct.container_argv({"image": "x"}, env)


def test_bind_all_is_confined_to_the_pod_ip():
    argv, env = ct.confine_to_pod_ip(
        ["jupyterhub-singleuser", "--ip=0.0.0.0", "--ServerApp.ip", "0.0.0.0", "--port=8888"],
        {"JUPYTERHUB_SERVICE_URL": "http://0.0.0.0:8888/user/alice/", "OTHER": "0.0.0.0"},
        "127.0.0.9",
    )
    assert argv == [
        "jupyterhub-singleuser",
        "--ip=127.0.0.9",
        "--ServerApp.ip",
        "127.0.0.9",
        "--port=8888",
    ]
    assert env["JUPYTERHUB_SERVICE_URL"] == "http://127.0.0.9:8888/user/alice/"
    assert env["OTHER"] == "0.0.0.0"


def test_a_specific_address_is_left_alone():
    argv, env = ct.confine_to_pod_ip(
        ["x", "--ip=127.0.0.1"], {"JUPYTERHUB_SERVICE_URL": "http://127.0.0.1:8888/"}, "127.0.0.9"
    )
    assert argv == ["x", "--ip=127.0.0.1"]
    assert env["JUPYTERHUB_SERVICE_URL"] == "http://127.0.0.1:8888/"


def test_termination_path_is_rewritten_everywhere():
    argv, env = ct.replace_path(
        ["python3", "-c", "open('/dev/termination-log','w')"],
        {"LOG": "/dev/termination-log"},
        "/dev/termination-log",
        "/tmp/pod/termination-log",
    )
    assert argv[2] == "open('/tmp/pod/termination-log','w')"
    assert env == {"LOG": "/tmp/pod/termination-log"}


def test_resolve_executable(tmp_path):
    prog = tmp_path / "tool"
    prog.write_text("#!/bin/sh\n")
    prog.chmod(0o755)
    assert ct.resolve_executable("tool", str(tmp_path)) == str(prog)
    assert ct.resolve_executable(str(prog), "") == str(prog)
    assert ct.resolve_executable("no-such-tool", str(tmp_path)) is None
    assert '"no-such-tool": executable file not found in $PATH' in ct.not_found_message(
        "no-such-tool"
    )


def test_runtime_env_precedence():
    env = ct.merge_runtime_env(
        {"NVIDIA_VISIBLE_DEVICES": "all", "X": "image"},
        {"NVIDIA_VISIBLE_DEVICES": "GPU-1"},
        {"X": "spec"},
    )
    assert env == {"NVIDIA_VISIBLE_DEVICES": "GPU-1", "X": "spec"}
    # A CPU-only pod: the spec's "void" beats the image's "all".
    assert ct.merge_runtime_env(
        {"NVIDIA_VISIBLE_DEVICES": "all"}, {}, {"NVIDIA_VISIBLE_DEVICES": "void"}
    ) == {"NVIDIA_VISIBLE_DEVICES": "void"}


@pytest.mark.parametrize(
    ("policy", "code", "want"),
    [
        ("Always", 0, True),
        ("Always", 1, True),
        ("OnFailure", 0, False),
        ("OnFailure", 2, True),
        ("Never", 1, False),
    ],
)
def test_should_restart(policy, code, want):
    assert ct.should_restart(policy, code) is want


def test_backoff_doubles_to_a_cap():
    assert [ct.backoff_seconds(n) for n in range(7)] == [10, 20, 40, 80, 160, 300, 300]


def running():
    return {"state": {"running": {}}, "restartCount": 0}


def exited(code):
    return {"state": {"terminated": {"exitCode": code}}, "restartCount": 0}


@pytest.mark.parametrize(
    ("policy", "init_done", "init_failed", "statuses", "want"),
    [
        ("Always", False, False, [{"state": {"waiting": {}}}], "Pending"),
        ("Never", True, True, [{"state": {"waiting": {}}}], "Failed"),
        ("Always", True, False, [running()], "Running"),
        ("Always", True, False, [exited(0)], "Running"),
        ("Never", True, False, [exited(0), exited(0)], "Succeeded"),
        ("Never", True, False, [exited(0), exited(1)], "Failed"),
        ("OnFailure", True, False, [exited(1)], "Running"),
        ("OnFailure", True, False, [exited(0)], "Succeeded"),
        ("Never", True, False, [running(), exited(1)], "Running"),
    ],
)
def test_pod_phase(policy, init_done, init_failed, statuses, want):
    assert ct.pod_phase(policy, init_done, init_failed, statuses) == want
