#!/usr/bin/env python3
"""notebook-healthcheck: the Docker HEALTHCHECK of gpuspawner's notebook images.

Healthy means: a Jupyter server of this container answers `GET <url>api` with 200,
where <url> comes from its runtime file or, when none can be read, from where the
server must listen (the hub's JUPYTERHUB_SERVICE_URL, else JUPYTER_PORT, default 8888). Kubernetes ignores Docker health checks (it
has its own probes); this one is for `docker run` and `gpuspawner-images test`.
Standard library only: it runs inside the images, not from the gpuspawner package.
"""

from __future__ import annotations

import glob
import json
import os
import sys
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

#: start-notebook.sh's port when JUPYTER_PORT is unset (the image's EXPOSE).
DEFAULT_PORT = 8888


def runtime_dirs(env: dict[str, str]) -> list[Path]:
    """Where Jupyter servers write jpserver-<pid>.json, most specific first."""
    dirs = []
    if env.get("JUPYTER_RUNTIME_DIR"):
        dirs.append(Path(env["JUPYTER_RUNTIME_DIR"]))
    if env.get("JUPYTER_DATA_DIR"):
        dirs.append(Path(env["JUPYTER_DATA_DIR"]) / "runtime")
    home = Path(env.get("HOME", "/home/jovyan"))
    dirs.append(home / ".local" / "share" / "jupyter" / "runtime")
    # Started as root with NB_USER, the server runs in that user's home, not in ours.
    user = env.get("NB_USER", "")
    if user and "/" not in user and user not in (".", ".."):
        user_dir = Path("/home") / user / ".local" / "share" / "jupyter" / "runtime"
        if user_dir not in dirs:
            dirs.append(user_dir)
    return dirs


def expected_url(env: dict[str, str]) -> str:
    """Where this container's server must answer when no runtime file tells: under a
    hub, JUPYTERHUB_SERVICE_URL's port and path; else start-notebook.sh's JUPYTER_PORT."""
    service = env.get("JUPYTERHUB_SERVICE_URL", "")
    if service:
        try:
            parts = urlsplit(service)
            port = parts.port
        except ValueError:  # not a URL: the port below is the best guess left
            port = None
        if port:
            path = "/" + parts.path.strip("/") + "/"
            return f"{parts.scheme or 'http'}://127.0.0.1:{port}{path.replace('//', '/')}"
    port_text = env.get("JUPYTER_PORT", "").strip()
    port = int(port_text) if port_text.isdigit() and 0 < int(port_text) < 65536 else DEFAULT_PORT
    return f"http://127.0.0.1:{port}/"


def local_url(info: dict) -> str | None:
    """Where to reach the server a runtime file describes, from inside its container.

    The file's `url` names the host the server advertises (with `--ip=0.0.0.0` that is
    the container's hostname, which need not resolve, e.g. with `--network none`);
    the server is in this container, so loopback with its port and base URL is asked.
    """
    port = info.get("port")
    if not port:
        url = info.get("url")
        return url if not url or url.endswith("/") else url + "/"
    scheme = "https" if info.get("secure") else "http"
    base = "/" + str(info.get("base_url") or "/").strip("/") + "/"
    return f"{scheme}://127.0.0.1:{port}{base.replace('//', '/')}"


def server_urls(dirs: list[Path]) -> list[str]:
    """Where to reach every server whose runtime file is found, newest file first."""
    files: list[Path] = []
    for d in dirs:
        files.extend(Path(p) for p in glob.glob(str(d / "jpserver-*.json")))
    files.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    urls = []
    for f in files:
        try:
            info = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        url = local_url(info) if isinstance(info, dict) else None
        if url:
            urls.append(url)
    return urls


def main() -> int:
    env = dict(os.environ)
    urls = server_urls(runtime_dirs(env))
    fallback = not urls
    if fallback:
        urls = [expected_url(env)]
    for url in urls:
        try:
            # The server is in this container: plain loopback HTTP is expected.
            with urllib.request.urlopen(url + "api", timeout=4) as resp:
                if resp.status == 200:
                    return 0
        except OSError:
            continue
    why = "no Jupyter server runtime file yet, and " if fallback else ""
    print(f"unhealthy: {why}no answer from {', '.join(urls)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
