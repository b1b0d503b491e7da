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
from .report import PoolReport, UserRow, format_duration, format_utilisation, type_table

TEMPLATES = Path(__file__).with_name("templates")

#: Columns of the type table shown right-aligned (the figures).
_NUMERIC_TYPE_COLUMNS = frozenset({1, 2, 3, 4})


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
    return {
        "type_head": head,
        "type_rows": [
            [(cell, i in _NUMERIC_TYPE_COLUMNS) for i, cell in enumerate(row)] for row in rows
        ],
        "users": [_user_view(u, report.utilisation_source) for u in report.users],
        "problems": list(report.problems),
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
) -> str:
    """The whole page. ``stop_url`` receives ``user`` and ``server`` by POST."""
    context: Mapping[str, Any] = {
        **page_view(report),
        "admin": admin,
        "stop_url": stop_url,
        "xsrf_token": xsrf_token,
        "refresh_seconds": int(refresh_seconds),
        "notice": notice,
    }
    return template().render(context)
