"""Take the screenshot of the admin GPU page (docs/img/admin-page.png).

    .venv/bin/python docs/img/capture_admin.py

Starts the demo stack (local GPU cluster + hub, everything on 127.0.0.1, the
sandbox catalog and hub config with the gpuspawner-admin service), starts a
few servers so the tables have something to show, logs in as 'admin' in
headless Chromium (Debian's chromium, driven by playwright) and photographs
/services/gpuspawner-admin/.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from gpuspawner_sandbox.demo import DEMO_PASSWORD, SandboxStack  # noqa: E402

SERVERS = [
    ("admin", "", {"profile": "pytorch", "gpu_type": "a100", "gpus": "2"}),
    ("student", "", {"profile": "pytorch", "gpu_type": "a100", "gpus": "1"}),
    ("cai", "", {"profile": "tensorflow", "gpu_type": "a100", "gpus": "1"}),
    ("cai", "train", {"profile": "pytorch", "gpu_type": "h100", "gpus": "2"}),
    ("dee", "", {"profile": "pytorch", "gpus": "0"}),
]


def start_all(hub) -> None:
    for user, name, options in SERVERS:
        hub.api("POST", f"/users/{user}")
        path = f"/users/{user}/servers/{name}" if name else f"/users/{user}/server"
        r = hub.api("POST", path, options)
        assert r.status in (201, 202), r.body
    deadline = time.monotonic() + 300
    while True:
        users = hub.api("GET", "/users?state=active").json()
        if sum(s["ready"] for u in users for s in u["servers"].values()) == len(SERVERS):
            return
        if time.monotonic() > deadline:
            raise SystemExit("the servers did not start")
        time.sleep(1)


def screenshot(url: str, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    chromium = shutil.which("chromium") or "/usr/bin/chromium"
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1500, "height": 700})
        page.goto(f"{url}/services/gpuspawner-admin/")
        page.fill("#username_input", "admin")
        page.fill("#password_input", DEMO_PASSWORD)
        page.click("#login_submit")
        page.wait_for_selector("#servers")
        page.screenshot(path=str(out), full_page=True)
        browser.close()


def main() -> None:
    out = HERE / "admin-page.png"
    with tempfile.TemporaryDirectory() as tmp, SandboxStack(Path(tmp)) as stack:
        start_all(stack.hub)
        screenshot(stack.hub.public_url, out)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
