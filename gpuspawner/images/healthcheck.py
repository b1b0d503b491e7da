#!/usr/bin/env python3
"""notebook-healthcheck: the Docker HEALTHCHECK of gpuspawner's notebook images.

Healthy means: a Jupyter server of this container has written its runtime file
and answers `GET <url>api` with 200. Kubernetes ignores Docker health checks (it
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


def runtime_dirs(env: dict[str, str]) -> list[Path]:
    """Where Jupyter servers write jpserver-<pid>.json, most specific first."""
    dirs = []
    if env.get("JUPYTER_RUNTIME_DIR"):
        dirs.append(Path(env["JUPYTER_RUNTIME_DIR"]))
    if env.get("JUPYTER_DATA_DIR"):
        dirs.append(Path(env["JUPYTER_DATA_DIR"]) / "runtime")
    home = Path(env.get("HOME", "/home/jovyan"))
    dirs.append(home / ".local" / "share" / "jupyter" / "runtime")
    return dirs


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
    urls = server_urls(runtime_dirs(dict(os.environ)))
    if not urls:
        print("unhealthy: no Jupyter server runtime file yet", file=sys.stderr)
        return 1
    for url in urls:
        try:
            # The server is in this container: plain loopback HTTP is expected.
            with urllib.request.urlopen(url + "api", timeout=4) as resp:
                if resp.status == 200:
                    return 0
        except OSError:
            continue
    print(f"unhealthy: no answer from {', '.join(urls)}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
