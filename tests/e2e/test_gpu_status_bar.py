"""JupyterLab's GPU item on real nodes: the load gpu-burn-emulated drives, the idle time, no item on CPU.

The session's hub (GPUSpawner), restarted with a culler whose GPU-idle rule is
an hour (nothing is stopped during the test) and which passes every 5 s; the
culler reads the stack's real Prometheus, which scrapes every GPU node's
emulated DCGM exporter every 2 s. The notebook image is the sandbox's Jupyter
stage, which carries gpuspawner-jupyterlab's wheel (images/common/wheels).
Headless Chromium logs in and reads the status bar as the user sees it.
"""

from __future__ import annotations

import re
import time

import pytest

from .conftest import (
    browser,  # noqa: F401 (the fixture)
    browser_log_in,
    ensure_user,
    pod_of,
    stop_servers,
    wait_for,
    wait_ready,
)
from .test_real_nodes import _burn

USER = "gsb"
GPU = {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}
CPU = {"profile": "pytorch", "gpus": "0"}
CULLER_CONFIG_ENV = "GPUSPAWNER_CULLER_CONFIG"
#: The GPU-idle rule the item must show: long enough that nothing is stopped here.
GPU_IDLE_TIMEOUT = 3600
CULLER_CONFIG = f"""
c = get_config()  # noqa
c.GPUCuller.timeouts = [
    {{"min_gpus": 1, "gpu_timeout": {GPU_IDLE_TIMEOUT}}},
    {{"gpu_type": "none", "timeout": 8 * 3600}},
]
c.GPUCuller.timeout = 0
c.GPUCuller.min_running = 0
c.GPUCuller.cull_every = 5
c.GPUCuller.gpu_query_step = 5
c.GPUCuller.gpu_freshness = 60
# the lowest cadence clients may be told: the scrape itself is every 2 s
c.GPUCuller.gpu_status_poll = 5
c.GPUCuller.pressure_timeout = 0
c.GPUCuller.kubernetes = "on"
c.Application.log_level = "INFO"
"""


@pytest.fixture
def status_hub(stack, tmp_path):
    """The session's hub with the culler above; the usual one again afterwards."""
    config = tmp_path / "culler_config.py"
    config.write_text(CULLER_CONFIG)
    before = stack.hub_env.get(CULLER_CONFIG_ENV)
    stack.hub_env[CULLER_CONFIG_ENV] = str(config)
    stack.stop_hub()
    try:
        yield stack.start_hub()
    finally:
        if before is None:
            stack.hub_env.pop(CULLER_CONFIG_ENV, None)
        else:
            stack.hub_env[CULLER_CONFIG_ENV] = before
        stack.stop_hub()
        stack.start_hub()


def item_text(page) -> str:
    """The GPU item's text, or '' while there is none (no waiting: the caller polls)."""
    item = page.locator(".gpuspawner-gpu-item")
    return item.inner_text() if item.count() else ""


def wait_item(page, predicate, timeout: float, what: str):
    """Until ``predicate(item text)`` is true (its value returned); else what the item said."""
    try:
        return wait_for(lambda: predicate(item_text(page)), timeout, 0.5, what=what)
    except AssertionError as e:
        raise AssertionError(f"{e}; the item said {item_text(page)!r}") from None


def test_the_status_bar_shows_gpu_load_idle_time_and_no_item_on_a_cpu_server(
    stack,
    status_hub,
    kube,
    browser,  # noqa: F811
    report,
):
    hub = status_hub
    ensure_user(hub, USER)
    for path, options in ((f"/users/{USER}/server", GPU), (f"/users/{USER}/servers/cpu", CPU)):
        r = hub.api("POST", path, options)
        assert r.status in (201, 202), r.body
    burn = None
    try:
        wait_ready(hub, USER, "", timeout=240)
        wait_ready(hub, USER, "cpu", timeout=240)
        page = browser_log_in(browser, hub, USER, f"/user/{USER}/lab")

        # (3) its GPUs idle since it started: how long, and when the GPU-idle rule stops it
        idle = re.compile(r"GPUs idle (\d+) min · stops (\d\d:\d\d(?: [AP]M)?)")
        shown = wait_item(page, idle.fullmatch, 240, "the idle item")
        title = page.locator(".gpuspawner-gpu-item").get_attribute("title")
        rule = re.search(
            r"at (.+?) \(in (?:(\d+) h )?(\d+) min\) if it stays as it is: (.+?)\. ", title
        )
        assert rule, title
        # the time left counts down from the hour the rule gives, since the server started
        assert rule.group(1) == shown.group(2), (title, shown.group(0))
        left = 60 * int(rule.group(2) or 0) + int(rule.group(3))
        assert 0 < left <= GPU_IDLE_TIMEOUT // 60, title
        assert rule.group(4) == "GPU idle timeout of 60 min", title
        report(f"idle GPU server's item: {shown.group(0)!r}, title: {title!r}")

        # (1) gpu-burn-emulated at 90 %: the item shows it, a scrape and a poll later
        pod = pod_of(kube, USER)
        burn = _burn(pod, 600, 90)
        started = time.monotonic()
        busy = re.compile(r"GPU 1×\S+ (\d+)% · \d+\.\d/\d+(\.\d)? GiB")

        def busy_shown(text):
            match = busy.fullmatch(text)
            return match if match and int(match.group(1)) >= 50 else None

        shown = wait_item(page, busy_shown, 180, "the load gpu-burn-emulated drives")
        report(
            f"busy GPU server's item {shown.group(0)!r} "
            f"{time.monotonic() - started:.1f} s after gpu-burn-emulated started"
        )
        assert burn.poll() is None, burn.stderr.read().decode()

        # the panel: its GPU's figures and the last hour's line
        page.locator(".gpuspawner-gpu-item").click()
        panel = page.locator("#gpuspawner-gpu-panel")
        panel.wait_for(timeout=30_000)
        assert panel.locator(".gpuspawner-gpu-devices tr").count() == 2  # header + one GPU
        assert panel.locator("svg.gpuspawner-gpu-chart").count() == 1

        page.context.close()

        # (2) a CPU server, in a browser context of its own: JupyterLab asks (and is
        # answered) but shows no GPU item
        cpu = browser_log_in(browser, hub, USER, f"/user/{USER}/cpu/lab")
        answers = []
        cpu.on(
            "response",
            lambda r: answers.append(r.status) if "/gpuspawner/gpu-status" in r.url else None,
        )
        cpu.locator("#jp-main-statusbar").wait_for(timeout=120_000)
        # playwright hands events over only while it is called: wait in the page
        deadline = time.monotonic() + 120
        while len(answers) < 2 and time.monotonic() < deadline:
            cpu.wait_for_timeout(500)
        assert len(answers) >= 2, f"JupyterLab at {cpu.url} asked for the GPU status {answers}"
        assert set(answers) == {200}, answers
        assert cpu.locator(".gpuspawner-gpu-item").count() == 0
        cpu.context.close()
    finally:
        if burn is not None:
            burn.terminate()
            burn.wait(timeout=30)
        stop_servers(hub, [(USER, ""), (USER, "cpu")])
