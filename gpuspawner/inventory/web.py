"""The hub's availability endpoint and the spawn form's live figures.

Register the endpoint in the hub's configuration::

    from gpuspawner.inventory.web import availability_handlers
    c.JupyterHub.extra_handlers = availability_handlers()

It answers ``GET /hub/gpuspawner/availability`` to any logged-in user (cookie
or token) with :func:`~gpuspawner.inventory.figures.availability_payload`,
read from the hub's watch cache: no API server request per call. The form
polls it and updates its figures in place; without it the figures are those
of the page load.
"""

from __future__ import annotations

import json
from typing import Any

from ..profiles import MARK_NEVER, MARK_NOT_FREE

#: Where the endpoint is served, under the hub's prefix (``/hub/``).
AVAILABILITY_PATH = "gpuspawner/availability"
#: How often the form asks for new figures, in milliseconds.
POLL_INTERVAL_MS = 10_000


def availability_handlers() -> list[tuple[str, Any]]:
    """The ``c.JupyterHub.extra_handlers`` entries for the availability endpoint."""
    return [(rf"/{AVAILABILITY_PATH}", _handler_class_cached())]


def _handler_class():
    from jupyterhub.handlers.base import BaseHandler
    from tornado import web

    class _AvailabilityHandler(BaseHandler):
        """GPU figures per catalog type, for the spawn form (any logged-in user)."""

        # The form fetches it with the login cookie; scripts may use a user's token.
        _accept_token_auth = True

        @web.authenticated
        async def get(self) -> None:
            spawners = getattr(self.current_user, "spawners", None)
            if spawners is None:
                # A service's token: the figures follow a user's spawner configuration.
                raise web.HTTPError(403, "GPU availability is shown to users only")
            server = self.get_argument("server", "")
            spawner = spawners[server] if server in spawners else spawners[""]
            payload_for = getattr(spawner, "gpu_availability_payload", None)
            if payload_for is None:
                payload = {"available": False, "problem": "GPUSpawner is not the spawner"}
            else:
                payload = payload_for()
            self.set_header("Content-Type", "application/json")
            self.set_header("Cache-Control", "no-store")
            self.write(json.dumps(payload))

    return _AvailabilityHandler


def __getattr__(name: str) -> Any:
    # The handler class is built on first use, so importing this module needs no JupyterHub.
    if name == "AvailabilityHandler":
        return _handler_class_cached()
    raise AttributeError(name)


_cached: Any = None


def _handler_class_cached() -> Any:
    global _cached
    if _cached is None:
        _cached = _handler_class()
    return _cached


def form_script(payload: dict[str, Any], url: str) -> str:
    """HTML appended to KubeSpawner's form: the figures now, refreshed from ``url``.

    JupyterHub inserts the form into its page as it is (no second template
    pass), so the data only has to be kept from closing the ``<script>``.
    """
    data = json.dumps(payload).replace("</", "<\\/")
    return (
        '<p id="gpuspawner-availability" class="help-block"></p>\n'
        f"<script>\n(function () {{\n  var url = {json.dumps(url)};\n"
        f"  var every = {POLL_INTERVAL_MS};\n  var initial = {data};\n"
        f"  var never = {json.dumps(MARK_NEVER)};\n"
        f"  var marks = {json.dumps([MARK_NOT_FREE, MARK_NEVER])};\n"
        + _FORM_JS
        + "})();\n</script>\n"
    )


# Relabels the GPU type choices with "N free of M (at most K on one node)" and
# marks the counts the selected type cannot take now (or ever: disabled), with
# the marks of gpuspawner.profiles.count_mark that the payload carries.
_FORM_JS = r"""
  function typeBase(option) {
    if (!option.dataset.base) option.dataset.base = option.text.split(" \u2014 ")[0];
    return option.dataset.base;
  }
  // A count's label without its mark: "None (CPU only)" keeps its own parentheses.
  function countBase(option) {
    if (!option.dataset.base) {
      var text = option.text;
      marks.forEach(function (mark) {
        var suffix = " (" + mark + ")";
        if (text.slice(-suffix.length) === suffix) text = text.slice(0, -suffix.length);
      });
      option.dataset.base = text;
    }
    return option.dataset.base;
  }
  function apply(data) {
    var note = document.getElementById("gpuspawner-availability");
    if (!data || !data.available) {
      if (note) note.textContent = "";
      return;
    }
    document.querySelectorAll('select[name$="--gpu_type"]').forEach(function (select) {
      Array.prototype.forEach.call(select.options, function (option) {
        var t = data.types[option.value];
        if (t) option.text = typeBase(option) + " \u2014 " + t.label;
      });
      var slug = select.name.slice("profile-option-".length, -"--gpu_type".length);
      var counts = document.querySelector('select[name="profile-option-' + slug + '--gpus"]');
      if (!counts) return;
      var t = data.types[select.value] || {counts: {}};
      Array.prototype.forEach.call(counts.options, function (option) {
        var base = countBase(option);
        var mark = t.counts ? t.counts[option.value] : "";
        option.text = mark ? base + " (" + mark + ")" : base;
        option.disabled = mark === never;
      });
    });
    if (note) note.textContent = "Free GPUs are counted live on the cluster's ready nodes.";
  }
  var current = initial;
  document.addEventListener("change", function (e) {
    if (e.target && e.target.name && /--gpu_type$/.test(e.target.name)) apply(current);
  });
  function poll() {
    fetch(url, {credentials: "same-origin", headers: {Accept: "application/json"}})
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.json(); })
      .then(function (data) { current = data; apply(data); setTimeout(poll, every); })
      .catch(function () { /* no endpoint: keep the page-load figures */ });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { apply(initial); });
  } else {
    apply(initial);
  }
  setTimeout(poll, every);
"""
