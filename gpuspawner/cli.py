"""``gpuspawner status``: the GPU page's tables in a terminal.

Two ways to get the figures:

- through the hub (default): the admin service's ``api/status`` with a token
  that has the ``custom:gpuspawner:admin`` scope (``$JUPYTERHUB_API_TOKEN`` or
  ``--token``; the hub's URL from ``--hub-url`` or ``$JUPYTERHUB_URL``);
- directly (``--catalog FILE``): the hub's API for users and servers (a token
  with ``list:users``, ``read:users``, ``read:servers``), the cluster through
  the kubeconfig (``$KUBECONFIG``) for nodes and pods, and the catalog file
  for limits — no admin service needed; ``--kueue-cluster-queue NAME`` (again
  for each) adds those Kueue ClusterQueues, as ``GPUAdmin.kueue_cluster_queues``
  does for the service.

``--json`` prints the report for scripts; ``--user NAME`` explains the limit
in effect for that user and the rule it came from, and which catalog images
they may use (an image may be only for some groups or users).

``gpuspawner usage``: GPU-hours per user, group, GPU type or image over a
period, read from the usage database the hub records them in (``--db`` or
``$GPUSPAWNER_ACCOUNTING_DB_URL``): a table, the same rows as CSV (``--csv``),
or every server's interval (``--intervals``) — the GPU page's usage section
and its downloads (docs/admin.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import urllib.error
import urllib.request
from urllib.parse import urlencode

from ._version import __version__
from .admin.report import PoolReport, format_text, printable, report_from_dict, text_table
from .admin.usage import (
    QueryError,
    database_problem,
    missing_sqlite_file,
    parse_query,
    usage_table,
)

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
    hub_url: str,
    token: str,
    catalog: str,
    namespace: str,
    user: str | None,
    cluster_queues: tuple[str, ...] = (),
) -> PoolReport:
    from .admin.collect import Collector, KubeReader, KueueReader
    from .clients.hubapi import HubClient
    from .clients.kube import KubeClient, kubernetes_available

    hub = HubClient(f"{hub_url.rstrip('/')}/hub/api", token, max_retries=1)
    kube = KubeReader(KubeClient(namespace)) if kubernetes_available() else None
    queues = None
    if cluster_queues:
        queues = KueueReader(cluster_queues, kube=kube.client if kube else None)
    collector = Collector(hub, kube, catalog, cache_seconds=0, kueue=queues)
    try:
        return await collector.report((user,) if user else ())
    finally:
        if kube is not None:
            await kube.close()


USAGE_EPILOG = """\
Dates are UTC: YYYY-MM-DD (a start at its midnight, an end through the end of that
day) or YYYY-MM-DDTHH:MM. Examples:
  gpuspawner usage --since 2026-11-01 --until 2026-11-30 --by group
  gpuspawner usage --since 2026-11-01 --group ml-team --csv > ml-team.csv
  gpuspawner usage --since 2026-11-01 --intervals > intervals.csv
"""


def add_usage_parser(commands) -> None:
    usage = commands.add_parser(
        "usage",
        help="GPU-hours per user, group, GPU type or image over a period, from the usage database.",
        description="GPU-hours per user, group, GPU type or image over a period, read from the "
        "usage database the hub records them in. Exit status 2 with one sentence when a date, "
        "grouping or the database cannot be used.",
        epilog=USAGE_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    usage.add_argument("--since", required=True, help="the period's first day or time (UTC)")
    usage.add_argument(
        "--until", default="", help="the period's last day (included) or end time (default: now)"
    )
    usage.add_argument("--group", default="", help="only servers charged to this group")
    usage.add_argument(
        "--by",
        default="user",
        help="add up by user, group, gpu_type or image, or several comma-separated (default user)",
    )
    usage.add_argument(
        "--csv", action="store_true", help="print the rows as CSV (the page's usage.csv)"
    )
    usage.add_argument(
        "--intervals",
        action="store_true",
        help="print every server's interval in the period as CSV (the page's intervals.csv)",
    )
    usage.add_argument(
        "--db",
        default=os.environ.get("GPUSPAWNER_ACCOUNTING_DB_URL", ""),
        help="the usage database's SQLAlchemy URL: the hub's db_url or GPUSpawner."
        "accounting_db_url (default $GPUSPAWNER_ACCOUNTING_DB_URL)",
    )


def run_usage(args: argparse.Namespace, now: float) -> int:
    """``gpuspawner usage``: the table, its CSV or the intervals' CSV on stdout."""
    from .accounting.store import UsageStore
    from .core.usage import intervals_csv, rows_csv

    if not args.db:
        print(
            "gpuspawner usage needs the usage database: pass --db URL (the hub's db_url or "
            "GPUSpawner.accounting_db_url) or set GPUSPAWNER_ACCOUNTING_DB_URL.",
            file=sys.stderr,
        )
        return 2
    try:
        query = parse_query(
            {"since": args.since, "until": args.until, "by": args.by, "group": args.group}, now
        )
    except QueryError as e:
        print(f"gpuspawner usage: {e}", file=sys.stderr)
        return 2
    missing = missing_sqlite_file(args.db)
    if missing:
        print(f"gpuspawner usage: {missing}", file=sys.stderr)
        return 2
    store = None
    try:
        store = UsageStore(args.db)
        if args.intervals:
            intervals = store.intervals(query.since, query.until, group=query.group)
            sys.stdout.write(intervals_csv(intervals, query.since, query.until, now))
            return 0
        rows = store.summary(query.since, query.until, now, query.by, group=query.group)
    except Exception as e:  # a bad URL, a missing driver, no tables, a refused connection
        print(f"gpuspawner usage: {database_problem(args.db, e)}", file=sys.stderr)
        return 2
    finally:
        if store is not None:
            store.close()
    if args.csv:
        sys.stdout.write(rows_csv(rows, query.by))
        return 0
    table = usage_table(rows, query.by)
    lines = [printable(f"GPU usage {query.describe()}, by {', '.join(query.by)}")]
    lines.append(text_table(list(table.head), [list(r) for r in table.rows] + [list(table.total)]))
    if not table.rows:
        lines.append("No GPU usage in this period.")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


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
        "--kueue-cluster-queue",
        action="append",
        default=[],
        metavar="NAME",
        help="with --catalog: also show this Kueue ClusterQueue's GPU quota, usage and pending "
        "work per flavor (again for each; the service shows GPUAdmin.kueue_cluster_queues)",
    )
    status.add_argument(
        "--namespace",
        default=os.environ.get("POD_NAMESPACE", "jupyterhub"),
        help="the notebook pods' namespace, with --catalog (default jupyterhub)",
    )
    add_usage_parser(commands)
    args = parser.parse_args(argv)
    if args.command == "usage":
        return run_usage(args, time.time())
    if not args.token:
        print(
            "gpuspawner status needs an API token: set JUPYTERHUB_API_TOKEN or pass --token.",
            file=sys.stderr,
        )
        return 2
    try:
        if args.catalog:
            report = asyncio.run(
                fetch_direct(
                    args.hub_url,
                    args.token,
                    args.catalog,
                    args.namespace,
                    args.user,
                    tuple(args.kueue_cluster_queue),
                )
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
