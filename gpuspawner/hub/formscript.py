"""The spawn form's live figures: the script KubeSpawner's form gets.

The figures come with the page and are then refreshed from the gpuspawner
service (``GET /services/gpuspawner/availability``, see
:mod:`gpuspawner.userservice.availability`), which answers the same payload
(:func:`gpuspawner.inventory.figures.live_payload`) for the user who asks. Without the
service, or when it stops answering, the figures stay those last counted and
the form says when that was.
"""

from __future__ import annotations

from typing import Any

from jinja2.utils import htmlsafe_json_dumps

from ..core.profiles import MARK_NEVER, MARK_NOT_FREE

#: How often the form asks for new figures, in milliseconds.
POLL_INTERVAL_MS = 10_000

#: The form's note while the figures refresh.
LIVE_NOTE = "Free GPUs are counted live on the cluster's ready nodes."
#: The form's note when they do not (the browser's time follows).
AS_OF_NOTE = "Free GPUs on the cluster's ready nodes, as counted at"
#: Added to either note when only the hub's own namespace is counted
#: (c.GPUSpawner.gpu_inventory_all_namespaces off, the default).
OWN_NAMESPACE_NOTE = (
    "GPUs used outside this hub are not seen, so fewer may be free than shown; "
    "a server that asks for them waits until they are."
)


def form_script(payload: dict[str, Any], url: str) -> str:
    """HTML appended to KubeSpawner's form: the figures now, refreshed from ``url`` ("" : never).

    JupyterHub inserts the form into its page as it is (no second template
    pass). Every value goes into the ``<script>`` as Jinja's ``tojson`` writes
    it: ``<``, ``>``, ``&`` and ``'`` as ``\\u`` escapes, so no text can close
    the script or open a comment in it, whatever the figures' names hold.
    """
    js = htmlsafe_json_dumps
    return (
        '<p id="gpuspawner-availability" class="help-block"></p>\n'
        f"<script>\n(function () {{\n  var url = {js(url)};\n"
        f"  var every = {POLL_INTERVAL_MS};\n  var initial = {js(payload)};\n"
        f"  var never = {js(MARK_NEVER)};\n"
        f"  var marks = {js([MARK_NOT_FREE, MARK_NEVER])};\n"
        f"  var liveNote = {js(LIVE_NOTE)}, asOfNote = {js(AS_OF_NOTE)};\n"
        f"  var ownNamespaceNote = {js(OWN_NAMESPACE_NOTE)};\n" + _FORM_JS + "})();\n</script>\n"
    )


# Relabels the GPU type choices with "N free of M (at most K on one node)" and
# marks the counts the selected type cannot take now (or ever: disabled), with
# the marks of gpuspawner.core.profiles.count_mark that the payload carries.
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
    if (note) {
      note.textContent = (live ? liveNote : asOfNote + " " + countedAt.toLocaleTimeString() + ".")
        + (data.pods_namespace ? " " + ownNamespaceNote : "");
    }
  }
  var current = initial, countedAt = new Date(), live = !!url;
  document.addEventListener("change", function (e) {
    if (e.target && e.target.name && /--gpu_type$/.test(e.target.name)) apply(current);
  });
  function poll() {
    fetch(url, {credentials: "same-origin", headers: {Accept: "application/json"}})
      .then(function (r) { if (!r.ok) throw new Error(r.status); return r.json(); })
      .then(function (data) {
        current = data; countedAt = new Date(); live = true; apply(data); setTimeout(poll, every);
      })
      .catch(function () {
        // the service does not answer (yet): keep the last figures, say when they were counted
        live = false; apply(current); setTimeout(poll, every * 3);
      });
  }
  if (document.readyState === "loading") {
    document.addEventListener("DOMContentLoaded", function () { apply(initial); });
  } else {
    apply(initial);
  }
  if (url) setTimeout(poll, every);
"""
