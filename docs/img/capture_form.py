"""Take the screenshot of the spawn form with live GPU figures (docs/img/spawn-form-capacity.png).

    .venv/bin/python docs/img/capture_form.py

Starts the demo stack (local GPU cluster + hub and its gpuspawner service,
everything on 127.0.0.1), starts three GPU servers so the figures
are not all "free", logs in as a user and photographs /hub/spawn with headless
Chromium (Debian: apt-get install chromium), driven over the DevTools
protocol on loopback.
"""

from __future__ import annotations

import asyncio
import http.cookiejar
import json
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from base64 import b64decode
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from gpuspawner_sandbox.demo import DEMO_PASSWORD, SandboxStack  # noqa: E402
from gpuspawner_sandbox.ports import free_port  # noqa: E402

EXTRA = ""


def login(url: str, name: str) -> http.cookiejar.CookieJar:
    jar = http.cookiejar.CookieJar()
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with opener.open(f"{url}/hub/login", timeout=30) as r:
        xsrf = re.search(r'name="_xsrf" value="([^"]+)"', r.read().decode()).group(1)
    body = urllib.parse.urlencode({"username": name, "password": DEMO_PASSWORD, "_xsrf": xsrf})
    opener.open(f"{url}/hub/login", body.encode(), timeout=30).close()
    return jar


def start(hub, user: str, options: dict) -> None:
    hub.api("POST", f"/users/{user}")
    r = hub.api("POST", f"/users/{user}/server", options)
    assert r.status in (201, 202), r.body
    deadline = time.monotonic() + 300
    while not hub.api("GET", f"/users/{user}").json()["servers"].get("", {}).get("ready"):
        if time.monotonic() > deadline:
            raise SystemExit(f"{user}'s server did not start")
        time.sleep(1)


async def screenshot(url: str, jar: http.cookiejar.CookieJar, out: Path) -> None:
    from tornado.websocket import websocket_connect

    port = free_port()
    profile = tempfile.mkdtemp()
    browser = subprocess.Popen(
        [
            shutil.which("chromium") or "chromium",
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            f"--remote-debugging-port={port}",
            "--remote-debugging-address=127.0.0.1",
            f"--user-data-dir={profile}",
            "--window-size=1200,900",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        for _ in range(100):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json", timeout=2) as r:
                    pages = [t for t in json.loads(r.read()) if t["type"] == "page"]
                if pages:
                    break
            except OSError:
                pass
            time.sleep(0.2)
        ws = await websocket_connect(pages[0]["webSocketDebuggerUrl"])
        ids = iter(range(1, 10**6))

        async def call(method: str, **params):
            i = next(ids)
            await ws.write_message(json.dumps({"id": i, "method": method, "params": params}))
            while True:
                message = json.loads(await ws.read_message())
                if message.get("id") == i:
                    return message.get("result", {})

        for cookie in jar:
            await call(
                "Network.setCookie",
                name=cookie.name,
                value=cookie.value,
                url=url,
                path=cookie.path or "/",
            )
        await call(
            "Emulation.setDeviceMetricsOverride",
            width=1200,
            height=900,
            deviceScaleFactor=1,
            mobile=False,
        )
        await call("Page.navigate", url=f"{url}/hub/spawn")
        await asyncio.sleep(4)
        # Show the A100 choice of PyTorch selected, its counts marked for A100.
        await call(
            "Runtime.evaluate",
            expression=(
                "document.querySelector('#profile-item-pytorch').checked = true;"
                "var s = document.querySelector('select[name=\"profile-option-pytorch--gpu_type\"]');"
                "s.value = 'a100'; s.dispatchEvent(new Event('change', {bubbles: true}));"
                "var n = document.querySelector('select[name=\"profile-option-pytorch--gpus\"]');"
                "n.size = n.options.length; s.size = s.options.length;"
                "document.querySelector('.container, #spawn_form, body').style.maxWidth = 'none';"
                "document.querySelectorAll('select').forEach(function (e) { e.style.minWidth = '660px'; });"
            ),
        )
        await asyncio.sleep(1)
        shot = await call("Page.captureScreenshot", format="png")
        out.write_bytes(b64decode(shot["data"]))
    finally:
        browser.terminate()
        browser.wait(10)
        shutil.rmtree(profile, ignore_errors=True)


def main() -> None:
    out = HERE / "spawn-form-capacity.png"
    with (
        tempfile.TemporaryDirectory() as tmp,
        SandboxStack(Path(tmp), extra_hub_config=EXTRA) as stack,
    ):
        hub = stack.hub
        start(hub, "admin", {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"})
        # The scheduler spreads: 2 on one A100 node, 1 on the other.
        start(hub, "bea", {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"})
        start(hub, "cai", {"profile": "pytorch", "gpu_type": "h100", "gpus": "1"})
        hub.api("POST", "/users/alice")
        asyncio.run(screenshot(hub.public_url, login(hub.public_url, "alice"), out))
        for user in ("admin", "bea", "cai"):
            hub.api("DELETE", f"/users/{user}/server")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
