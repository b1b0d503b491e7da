"""The admin page's HTML, rendered from a :class:`~gpuspawner.admin.report.PoolReport` (pure).

Server-rendered and usable without JavaScript: the tables, one "stop" form
per server (POSTed with the page's XSRF token), and a ``<meta refresh>``.

:func:`page_view` turns the report into the words the page shows;
``templates/page.html`` lays them out. The template environment escapes every
value, so a user name, server name, pod label or error message is text
whatever characters it holds.

Nothing on this page is markup: it shows no catalog description, and the GPU
type names it shows share their column with names taken from nodes and pod
labels (a type the catalog does not know), so they are escaped like them.
Catalog text that is meant as markup must be wrapped in
:class:`markupsafe.Markup` where it is put into the view, with a comment
saying why it is trusted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from jinja2 import Environment, FileSystemLoader, StrictUndefined, Template, select_autoescape

from ..core.limits import format_units
from ..core.usage import DIMENSIONS
from .report import (
    PoolReport,
    UserRow,
    format_duration,
    format_utilisation,
    kueue_table,
    type_table,
)
from .usage import BY_TITLES, HOLDER_HEAD, IdleHolder, UsageQuery, UsageTable, holder_cells

TEMPLATES = Path(__file__).with_name("templates")

#: Columns of the type table shown right-aligned (the figures).
_NUMERIC_TYPE_COLUMNS = frozenset({1, 2, 3, 4})
#: Columns of the ClusterQueue table shown right-aligned: nominal to pending GPUs.
_NUMERIC_KUEUE_COLUMNS = frozenset(range(5, 11))


@dataclass(frozen=True)
class ServerView:
    name: str  # "" for the default server: what the stop form posts
    label: str  # what the page shows
    cells: tuple[tuple[str, bool], ...]  # (text, right-aligned) per column


@dataclass(frozen=True)
class UserView:
    name: str
    admin: bool
    groups: str
    limit: str
    per_type: str
    rule: str
    span: int  # rows the user's own cells cover: one per server, at least one
    servers: tuple[ServerView, ...]


def _user_view(u: UserRow, utilisation_source: str) -> UserView:
    groups = "unknown" if u.groups is None else (", ".join(u.groups) or "none")
    per_type = "; ".join(
        f"{k}: {'unlimited' if v is None else format_units(v)}" for k, v in u.limit_per_type.items()
    )
    servers = []
    for s in u.servers or ():
        util = format_utilisation(s.utilisation, utilisation_source) if s.gpu_type else "-"
        cells = (
            (s.label, False),
            (s.state, False),
            (s.profile or "-", False),
            (s.gpu_type_name, False),
            (str(s.gpus), True),
            (s.node or "-", False),
            (format_duration(s.age), False),
            (format_duration(s.idle), False),
            (util, False),
        )
        servers.append(ServerView(name=s.name, label=s.label, cells=cells))
    return UserView(
        name=u.name,
        admin=u.admin,
        groups=groups,
        limit=f"{format_units(u.gpus_used)} of {format_units(u.limit)}",
        per_type=per_type,
        rule=u.rule,
        span=max(len(servers), 1),
        servers=tuple(servers),
    )


def page_view(report: PoolReport) -> dict[str, Any]:
    """What the template shows of the report, all of it plain text."""
    head, rows = type_table(report)
    # ClusterQueue, cohort and flavor names come from the cluster: text like the rest
    kueue_head, kueue_rows = kueue_table(report)
    return {
        "type_head": head,
        "type_rows": [
            [(cell, i in _NUMERIC_TYPE_COLUMNS) for i, cell in enumerate(row)] for row in rows
        ],
        "kueue_shown": bool(report.kueue_cluster_queues),
        "kueue_head": kueue_head,
        "kueue_rows": [
            [(cell, i in _NUMERIC_KUEUE_COLUMNS) for i, cell in enumerate(row)]
            for row in kueue_rows
        ],
        "users": [_user_view(u, report.utilisation_source) for u in report.users],
        "problems": list(report.problems),
    }


@dataclass(frozen=True)
class UsageSection:
    """What the service read for the usage section and the idle holders board.

    ``form``: the admin's own inputs, shown back in the form as typed.
    ``query`` None: the inputs could not be used (``problem`` says why) or
    there is no usage store. ``table`` None: not read (``problem`` says why).
    ``holders`` None: the board could not be made (``holders_problem``).
    """

    form: Mapping[str, str]
    query: UsageQuery | None = None
    table: UsageTable | None = None
    problem: str = ""
    holders: tuple[IdleHolder, ...] | None = None
    holders_problem: str = ""
    groups: tuple[str, ...] = ()  # the groups the filter suggests
    idle_after: float = 600.0
    note: str = ""  # why there is no usage table, when that is the configuration (no store)


def usage_view(section: UsageSection, page_url: str) -> dict[str, Any]:
    """What the template shows of the usage section: text, and links made of the query."""
    query = section.query
    tabs = []
    csv: dict[str, str] = {}
    if query is not None:
        for by in DIMENSIONS:
            tabs.append(
                (
                    f"by {BY_TITLES[by]}",
                    query.link(page_url, by=by) + "#usage",
                    query.by == (by,),
                )
            )
        csv = {
            "usage": query.link(page_url + "usage.csv"),
            "intervals": query.link(page_url + "intervals.csv"),
        }
    table = section.table
    return {
        "usage_form": {
            "period": section.form.get("period") or (query.period if query else "week"),
            "since": section.form.get("since", ""),
            "until": section.form.get("until", ""),
            "group": section.form.get("group", ""),
            "by": section.form.get("by") or (",".join(query.by) if query else "user"),
        },
        "usage_title": query.describe() if query else "",
        "usage_tabs": tabs,
        "usage_csv": csv,
        "usage_problem": section.problem,
        "usage_note": section.note,
        "usage_head": list(table.head) if table else [],
        "usage_keys": table.keys if table else 0,
        "usage_rows": table.rows if table else (),
        "usage_total": table.total if table and table.rows else (),
        "usage_shown": table is not None,
        "usage_left_out": (
            f"The table shows the {len(table.rows):,} rows with the most GPU-hours of "
            f"{len(table.rows) + table.left_out:,}; the total counts them all, and usage.csv "
            "has every row."
        )
        if table and table.left_out
        else "",
        "usage_groups": list(section.groups),
        "holder_head": list(HOLDER_HEAD),
        "holders": None if section.holders is None else [holder_cells(h) for h in section.holders],
        "holders_problem": section.holders_problem,
        "idle_after": format_duration(section.idle_after),
    }


@cache
def environment() -> Environment:
    """The admin templates' environment: autoescaped whatever a template is called."""
    return Environment(
        loader=FileSystemLoader(TEMPLATES),
        # default=True: a template added under another name is escaped too
        autoescape=select_autoescape(
            enabled_extensions=("html", "j2"), default_for_string=True, default=True
        ),
        undefined=StrictUndefined,
        keep_trailing_newline=True,
    )


def template(name: str = "page.html") -> Template:
    return environment().get_template(name)


def render_page(
    report: PoolReport,
    *,
    admin: str,
    stop_url: str,
    xsrf_token: str,
    refresh_seconds: int = 30,
    notice: str = "",
    usage: UsageSection | None = None,
    page_url: str = "",
) -> str:
    """The whole page. ``stop_url`` receives ``user`` and ``server`` by POST.

    ``usage``: the usage section and idle holders board (None: not shown);
    ``page_url``: the page's own path, which the usage form and links ask again.
    ``refresh_seconds`` 0: no reload (an admin reading usage is not interrupted).
    """
    context: Mapping[str, Any] = {
        **page_view(report),
        **(usage_view(usage, page_url) if usage is not None else {}),
        "usage_section": usage is not None,
        "page_url": page_url,
        "admin": admin,
        "stop_url": stop_url,
        "xsrf_token": xsrf_token,
        "refresh_seconds": int(refresh_seconds),
        "notice": notice,
    }
    return template().render(context)
