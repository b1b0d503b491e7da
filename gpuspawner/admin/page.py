"""The admin page's HTML, rendered from a :class:`~gpuspawner.admin.report.PoolReport` (pure).

Server-rendered and usable without JavaScript: the tables, one "stop" form
per server (POSTed with the page's XSRF token), and a ``<meta refresh>``.
"""

from __future__ import annotations

from html import escape

from ..limits import format_units
from .report import PoolReport, format_duration, format_utilisation, type_table

_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.5em; }
table { border-collapse: collapse; margin-top: .5em; }
th, td { border: 1px solid #ccc; padding: .3em .6em; text-align: left; }
th { background: #f3f3f3; } td.num { text-align: right; }
.muted { color: #777; } .notice { background: #eef6ee; padding: .5em; border: 1px solid #9c9; }
.problem { background: #fff4e5; padding: .5em; border: 1px solid #e0b070; }
button { cursor: pointer; }
"""


def _cell(value: str, numeric: bool = False) -> str:
    cls = ' class="num"' if numeric else ""
    return f"<td{cls}>{escape(value)}</td>"


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
    head, rows = type_table(report)
    type_html = "".join(
        "<tr>" + "".join(_cell(c, i in (1, 2, 3, 4)) for i, c in enumerate(r)) + "</tr>"
        for r in rows
    )
    if not rows:
        type_html = f'<tr><td colspan="{len(head)}" class="muted">No GPU types known.</td></tr>'

    user_rows = []
    for u in report.users:
        groups = "unknown" if u.groups is None else (", ".join(u.groups) or "none")
        limit = f"{format_units(u.gpus_used)} of {format_units(u.limit)}"
        per_type = "; ".join(
            f"{k}: {'unlimited' if v is None else format_units(v)}"
            for k, v in u.limit_per_type.items()
        )
        servers = u.servers or ()
        span = max(len(servers), 1)
        user_cells = (
            f'<td rowspan="{span}"><b>{escape(u.name)}</b>'
            + (' <span class="muted">(admin)</span>' if u.admin else "")
            + f'<br><span class="muted">groups: {escape(groups)}</span></td>'
        )
        limit_cells = (
            f'<td rowspan="{span}">{escape(limit)}'
            + (f'<br><span class="muted">{escape(per_type)}</span>' if per_type else "")
            + f'</td><td rowspan="{span}">{escape(u.rule)}</td>'
        )
        if not servers:
            user_rows.append(
                f'<tr>{user_cells}<td colspan="10" class="muted">no server</td>{limit_cells}</tr>'
            )
            continue
        for i, s in enumerate(servers):
            util = (
                format_utilisation(s.utilisation, report.utilisation_source) if s.gpu_type else "-"
            )
            stop = (
                f'<form method="post" action="{escape(stop_url)}">'
                f'<input type="hidden" name="_xsrf" value="{escape(xsrf_token)}">'
                f'<input type="hidden" name="user" value="{escape(u.name)}">'
                f'<input type="hidden" name="server" value="{escape(s.name)}">'
                f'<button type="submit" aria-label="stop {escape(u.name)}/{escape(s.label)}">'
                "stop</button></form>"
            )
            cells = [
                _cell(s.label),
                _cell(s.state),
                _cell(s.profile or "-"),
                _cell(s.gpu_type_name),
                _cell(str(s.gpus), True),
                _cell(s.node or "-"),
                _cell(format_duration(s.age)),
                _cell(format_duration(s.idle)),
                _cell(util),
                f"<td>{stop}</td>",
            ]
            first = (user_cells if i == 0 else "") + "".join(cells)
            user_rows.append(
                f'<tr data-server="{escape(u.name)}/{escape(s.name)}">{first}'
                + (limit_cells if i == 0 else "")
                + "</tr>"
            )
    if not user_rows:
        user_rows.append('<tr><td colspan="13" class="muted">No servers.</td></tr>')

    notices = f'<p class="notice" role="status">{escape(notice)}</p>' if notice else ""
    problems = "".join(f'<p class="problem">{escape(p)}</p>' for p in report.problems)
    th = "".join(f"<th>{escape(h)}</th>" for h in head)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta http-equiv="refresh" content="{int(refresh_seconds)}">
<title>GPU pool</title><style>{_STYLE}</style></head>
<body>
<h1>GPU pool</h1>
<p class="muted">Signed in as {escape(admin)}. This page refreshes every {int(refresh_seconds)} s.</p>
{notices}{problems}
<h2>GPUs by type</h2>
<table id="gpu-types"><thead><tr>{th}</tr></thead><tbody>{type_html}</tbody></table>
<h2>Users and servers</h2>
<table id="servers"><thead><tr><th>user</th><th>server</th><th>state</th><th>profile</th>
<th>GPU type</th><th>GPUs</th><th>node</th><th>age</th><th>idle</th><th>GPU util</th><th></th>
<th>GPUs held / limit</th><th>limit from</th></tr></thead>
<tbody>{"".join(user_rows)}</tbody></table>
<p class="muted">"waiting": GPUs requested by this hub's pods that no node has taken yet.
GPU utilisation: the busiest of the server's GPUs, averaged over the last 5 minutes (DCGM exporter, via Prometheus).
Stopping a server goes through the hub's API and is logged by the hub and this service.</p>
</body></html>
"""
