"""``gpuspawner status``: the GPU page's tables in a terminal.

Two ways to get the figures:

- through the hub (default): the admin service's ``api/status`` with a token
  that has the ``custom:gpuspawner:admin`` scope (``$JUPYTERHUB_API_TOKEN`` or
  ``--token``; the hub's URL from ``--hub-url`` or ``$JUPYTERHUB_URL``);
- directly (``--catalog FILE``): the hub's API for users and servers (a token
  with ``list:users``, ``read:users``, ``read:servers``), the cluster through
  the kubeconfig (``$KUBECONFIG``) for nodes and pods, and the catalog file
  for limits — no admin service needed.

``--json`` prints the report for scripts; ``--user NAME`` explains the limit
in effect for that user and the rule it came from, and which catalog images
they may use (an image may be only for some groups or users).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import urllib.error
import urllib.request
from urllib.parse import urlencode

from ._version import __version__
from .admin.report import PoolReport, format_text, report_from_dict

SERVICE_PATH = "/services/gpuspawner-admin/api/status"


class StatusError(Exception):
    """The figures could not be read; the message is one sentence for the terminal."""


def fetch_from_service(hub_url: str, token: str, user: str | None = None) -> PoolReport:
    query = f"?{urlencode({'user': user})}" if user else ""
    request = urllib.request.Request(
        f"{hub_url.rstrip('/')}{SERVICE_PATH}{query}",
        headers={"Authorization": f"token {token}", "Accept": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60) as response:
            return report_from_dict(json.loads(response.read()))
    except urllib.error.HTTPError as e:
        if e.code == 403:
            raise StatusError(
                "The hub refused the token (HTTP 403): it needs the custom:gpuspawner:admin scope "
                "(an admin's token, see docs/admin.md)."
            ) from None
        if e.code in (404, 503):
            raise StatusError(
                f"The hub at {hub_url} has no gpuspawner-admin service (HTTP {e.code}); "
                "register it (docs/admin.md) or use --catalog to read the cluster directly."
            ) from None
        raise StatusError(f"The hub answered HTTP {e.code} for {SERVICE_PATH}.") from None
    except (urllib.error.URLError, OSError) as e:
        raise StatusError(f"The hub at {hub_url} could not be reached: {e}.") from None
    except ValueError:
        raise StatusError(f"The hub at {hub_url} did not answer with the status JSON.") from None


async def fetch_direct(
    hub_url: str, token: str, catalog: str, namespace: str, user: str | None
) -> PoolReport:
    from .admin.collect import Collector, KubeReader
    from .clients.hubapi import HubClient
    from .clients.kube import KubeClient, kubernetes_available

    hub = HubClient(f"{hub_url.rstrip('/')}/hub/api", token, max_retries=1)
    kube = KubeReader(KubeClient(namespace)) if kubernetes_available() else None
    collector = Collector(hub, kube, catalog, cache_seconds=0)
    try:
        return await collector.report((user,) if user else ())
    finally:
        if kube is not None:
            await kube.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuspawner", description="GPUSpawner's admin commands.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    status = commands.add_parser(
        "status", help="GPUs per type and every server with its GPUs, age, idle time and limit."
    )
    status.add_argument(
        "--hub-url",
        default=os.environ.get("JUPYTERHUB_URL", "http://127.0.0.1:8000"),
        help="the hub's public URL (default $JUPYTERHUB_URL, else http://127.0.0.1:8000)",
    )
    status.add_argument(
        "--token",
        default=os.environ.get("JUPYTERHUB_API_TOKEN", ""),
        help="an API token (default $JUPYTERHUB_API_TOKEN)",
    )
    status.add_argument("--json", action="store_true", help="print the report as JSON")
    status.add_argument(
        "--user",
        help="explain this user's limit, the rule it came from and the images they may use",
    )
    status.add_argument(
        "--catalog",
        default="",
        help="read the cluster directly (kubeconfig) with this catalog file instead of asking "
        "the hub's gpuspawner-admin service",
    )
    status.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE", "jupyterhub"),
        help="the notebook pods' namespace, with --catalog (default jupyterhub)",
    )
    args = parser.parse_args(argv)
    if not args.token:
        print(
            "gpuspawner status needs an API token: set JUPYTERHUB_API_TOKEN or pass --token.",
            file=sys.stderr,
        )
        return 2
    try:
        if args.catalog:
            report = asyncio.run(
                fetch_direct(args.hub_url, args.token, args.catalog, args.namespace, args.user)
            )
        else:
            report = fetch_from_service(args.hub_url, args.token, args.user)
    except StatusError as e:
        print(f"gpuspawner status: {e}", file=sys.stderr)
        return 1
    if args.user and report.user(args.user) is None:
        print(f"gpuspawner status: the hub has no user {args.user!r}.", file=sys.stderr)
        return 1
    if args.json:
        data = report.as_dict()
        if args.user:
            data["users"] = [u for u in data["users"] if u["name"] == args.user]
        print(json.dumps(data, indent=2))
    else:
        sys.stdout.write(format_text(report, args.user))
    return 0


if __name__ == "__main__":
    sys.exit(main())
