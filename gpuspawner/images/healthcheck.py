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


def server_urls(dirs: list[Path]) -> list[str]:
    """The `url` of every server runtime file found, newest file first."""
    files: list[Path] = []
    for d in dirs:
        files.extend(Path(p) for p in glob.glob(str(d / "jpserver-*.json")))
    files.sort(key=lambda p: p.stat().st_mtime, reverse=True)
    urls = []
    for f in files:
        try:
            url = json.loads(f.read_text()).get("url")
        except (OSError, ValueError):
            continue
        if url:
            urls.append(url if url.endswith("/") else url + "/")
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
