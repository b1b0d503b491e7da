"""The hub's pages tell users why a server stopped, and when the culler will stop one.

``configure(c)`` in the hub's config adds GPUSpawner's ``home.html`` (JupyterHub's
own, plus one line per notice) to ``c.JupyterHub.template_paths`` and
:func:`page_notices` to ``c.JupyterHub.template_vars``. The spawn page needs
nothing here: GPUSpawner puts the server's own notice above its options form.

The lines read only what the hub already holds: each server's stop notice from
its saved state (:data:`gpuspawner.core.stopreasons.STATE_KEY`), and the culler's
warning from the running server's pod as the hub's pod watch last saw it. A
warning the user may answer by keeping the server carries the culler's choices
as buttons ("Keep for 1 h"), links to the gpuspawner service's keep page
(:mod:`gpuspawner.userservice.keep`), or the culler's sentence saying why it
cannot be kept.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from markupsafe import Markup

from ..core import stopreasons
from ..core.endpoints import KEEP_PATH, USER_SERVICE_NAME
from ..core.keep import keep_label

#: GPUSpawner's templates (``home.html``), for ``c.JupyterHub.template_paths``.
TEMPLATE_PATH = str(Path(__file__).parent / "templates")

log = logging.getLogger("JupyterHub")


def notice_paragraph(html: Markup | str, kind: str = "stopped") -> Markup:
    """One notice line as the pages show it.

    ``html`` is :class:`~markupsafe.Markup` from :func:`~gpuspawner.core.stopreasons.notice_html`
    (or :func:`~gpuspawner.core.stopreasons.warning_html`); plain text is escaped.
    """
    css = "alert-warning" if kind == "warning" else "alert-info"
    return Markup('<p class="alert {} gpuspawner-{}" role="status">{}</p>').format(css, kind, html)


def keep_url(base_url: str) -> str:
    """The gpuspawner service's keep page under the hub's ``base_url`` (``/``)."""
    return f"{base_url.rstrip('/')}/services/{USER_SERVICE_NAME}/{KEEP_PATH}"


def keep_controls(warning: stopreasons.CullWarning, url: str) -> Markup:
    """The warning's keep buttons (links to ``url`` with the server and seconds), or why not.

    Empty when the culler offers no choice and says nothing (a deadline: nothing can keep it).
    """
    if warning.keep_refused:
        return Markup(' <span class="gpuspawner-keep-refused">{}</span>').format(
            warning.keep_refused
        )
    buttons = [
        Markup('<a class="btn btn-xs btn-default gpuspawner-keep" href="{}?{}">{}</a>').format(
            url, urlencode({"server": warning.server, "seconds": int(seconds)}), keep_label(seconds)
        )
        for seconds in warning.keep_choices
    ]
    return Markup(" ") + Markup(" ").join(buttons) if buttons else Markup("")


def _saved_notice(orm_spawner: Any) -> stopreasons.StopNotice | None:
    state = getattr(orm_spawner, "state", None)
    if not isinstance(state, dict):
        return None
    notice = stopreasons.StopNotice.from_state(state.get(stopreasons.STATE_KEY))
    return notice.for_server(orm_spawner.name or "", "") if notice else None


def user_notices(user: Any) -> list[Markup]:
    """The HTML lines for ``user`` (JupyterHub's User): stop notices, then cull warnings."""
    lines: list[Markup] = []
    warnings: list[Markup] = []
    url = keep_url((getattr(user, "settings", None) or {}).get("base_url", "/"))
    loaded = getattr(user, "spawners", {}) or {}
    for name, orm_spawner in sorted(user.orm_user.orm_spawners.items()):
        # .get: reading must not create a spawner for every stopped server.
        spawner = loaded.get(name)
        if spawner is not None and (spawner.active or spawner.ready):
            warning = getattr(spawner, "cull_warning", lambda: None)()
            if warning is not None:
                html = stopreasons.warning_html(warning) + keep_controls(warning, url)
                warnings.append(notice_paragraph(html, "warning"))
            continue
        notice = _saved_notice(orm_spawner)
        if notice is not None:
            lines.append(notice_paragraph(stopreasons.notice_html(notice)))
    return lines + warnings


def page_notices(user: Any) -> Callable[[], list[Markup]]:
    """The ``template_vars`` entry: called by JupyterHub with the page's user (or None).

    Returns a callable so that only the pages that show the lines (``home.html``)
    compute them. A page never fails because of them: an error is logged and
    no line is shown.
    """

    def lines() -> list[Markup]:
        if user is None:
            return []
        try:
            return user_notices(user)
        except Exception:
            log.exception("Could not read the stop notices of %s", getattr(user, "name", "?"))
            return []

    return lines


def configure(c: Any) -> None:
    """Show the notices on the hub's home page (call in jupyterhub_config.py).

    Lists and dicts are changed in place, never replaced: in a file loaded with
    ``load_subconfig`` an unset setting is a lazy value, and only as such does it
    merge into the parent's.
    """
    paths = c.JupyterHub.template_paths
    if isinstance(paths, list):
        if TEMPLATE_PATH not in paths:
            paths.insert(0, TEMPLATE_PATH)
    elif TEMPLATE_PATH not in [obj for _, obj in paths.to_dict().get("inserts", [])]:
        # JupyterHub's own template path stays behind ours
        paths.insert(0, TEMPLATE_PATH)
    c.JupyterHub.template_vars.update(
        {
            "gpuspawner_notices": page_notices,
            "gpuspawner_local_time": stopreasons.LOCAL_TIME_SCRIPT,
        }
    )
