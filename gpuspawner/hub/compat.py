"""What differs between the JupyterHub and KubeSpawner lines gpuspawner supports.

gpuspawner runs on JupyterHub 5.5 + KubeSpawner 7.0 (zero-to-jupyterhub 4.4.0's
hub image) and on JupyterHub 6.x + KubeSpawner 7.1. Code that depends on the
line asks here, so the difference lives in one place.

GPUSpawner extends KubeSpawner through its public hooks (``start``,
``load_user_options``, ``options_form``, ``modify_pod_hook``, traits). The one
KubeSpawner private name it still needs is called only here, each beside why;
``tests/hub/test_compat.py`` fails, naming the KubeSpawner release, when one of
them changes.
"""

from __future__ import annotations

from typing import Any

from jupyterhub import version_info
from tornado import web

from ..core.refusals import REASON_INVALID, refuse

#: JupyterHub 6 reads a server request's body as ``{"user_options": {…},
#: "display_name": …}``, and a body without those keys as the options; 5.5 takes
#: the whole body as the options.
HUB_READS_USER_OPTIONS_KEY = version_info >= (6,)


class HTTPSpawnException(web.HTTPError):
    """JupyterHub 6's ``SpawnException``, as far as JupyterHub 5.5 can honour it.

    JupyterHub 5.5 logs an ``HTTPError`` raised by a spawn as one line, without a
    traceback, answers with its status code, and shows an exception's
    ``jupyterhub_message`` (and ``jupyterhub_html_message``) on its pages and in
    the progress stream. Its REST API answers with ``log_message % args``
    instead: ``"%s"`` with the sentence as the only argument makes that the
    sentence too, even when it holds a ``%``.
    """

    def __init__(
        self,
        message: str,
        *,
        reason: str,
        log_message: str = "",
        message_html: str = "",
        status_code: int = 400,
    ):
        super().__init__(status_code, "%s", message, reason=reason)
        self.message = message
        self.message_html = message_html
        self.jupyterhub_message = message
        if message_html:
            self.jupyterhub_html_message = message_html
        # JupyterHub 6 keeps the admin's detail in log_message; here tornado
        # owns that name (and 5.5's REST API shows it), so it is kept apart.
        self.detail = log_message or message

    def __str__(self) -> str:
        return f"{self.status_code} {type(self).__name__}(reason={self.reason}): {self.detail}"


try:
    from jupyterhub.spawner import SpawnException
except ImportError:  # JupyterHub < 6.0
    SpawnException = HTTPSpawnException  # type: ignore[misc, assignment]


def request_options(user_options: Any, hub_reads_key: bool = HUB_READS_USER_OPTIONS_KEY) -> Any:
    """The spawn options of a request, read as JupyterHub 6 reads a REST body.

    On JupyterHub 5.5, ``{"user_options": {…}}`` (the body docs/users.md and
    JupyterHub 6 document) arrives whole as the options; without this, its
    options would be ignored and the defaults started.
    """
    if hub_reads_key or not isinstance(user_options, dict):
        return user_options
    if "user_options" not in user_options and "display_name" not in user_options:
        return user_options
    inner = user_options.get("user_options")
    if inner is None:
        return {}
    if not isinstance(inner, dict):
        raise refuse(REASON_INVALID, "user-options-not-object")
    return inner


def initialized_profile_list(spawner: Any, profile_list: list[dict]) -> list[dict]:
    """A copy of ``profile_list`` as KubeSpawner reads it: KubeSpawner's private
    ``_get_initialized_profile_list``.

    KubeSpawner fills in a profile list before it uses one: a slug made from a
    profile's display name, a default profile, a default choice per option, and
    the defaults of ``unlisted_choice``. Its form template and its
    ``load_user_options`` expect those. GPUSpawner needs the list exactly as
    KubeSpawner will read it, to refuse an unknown profile or choice with a
    sentence before KubeSpawner sees it, to await async overrides of the chosen
    profile, and to render the catalog's profiles in KubeSpawner's template.
    KubeSpawner has no public way to do this, and copying its rules (its slugs
    included) would drift from the release installed.
    """
    return spawner._get_initialized_profile_list(profile_list)


def initialized_profiles(profile_list: list[dict]) -> list[dict]:
    """:func:`initialized_profile_list` without a spawner, while the hub reads its config.

    KubeSpawner's ``_get_initialized_profile_list`` reads nothing of the
    spawner (7.0 and 7.1), so the hub's start check can learn the slugs of a
    ``profile_list`` exactly as KubeSpawner will make them, before any spawner
    exists.
    """
    from kubespawner import KubeSpawner

    return KubeSpawner._get_initialized_profile_list(None, profile_list)  # type: ignore[arg-type]


def user_label(spawner: Any) -> str:
    """The value of KubeSpawner's username label on the pods of ``spawner``'s user.

    Used to list a user's pods by label. KubeSpawner builds the label with its
    public slug functions (:mod:`kubespawner.slugs`), and ``common_labels`` can
    replace it, as in its private ``_build_common_labels``; a test checks the
    value against the label of a pod KubeSpawner builds.
    """
    from kubespawner.slugs import is_valid_label, safe_slug

    from ..core.labels import KUBESPAWNER_LABEL_USER

    common = spawner.common_labels or {}
    if KUBESPAWNER_LABEL_USER in common:
        return common[KUBESPAWNER_LABEL_USER]
    return safe_slug(spawner.user.name, is_valid=is_valid_label)


__all__ = [
    "HUB_READS_USER_OPTIONS_KEY",
    "HTTPSpawnException",
    "SpawnException",
    "initialized_profile_list",
    "initialized_profiles",
    "request_options",
    "user_label",
]


def hub_checks_at_start(spawner: Any) -> bool:
    """Whether the hub is checking this spawner's server as it starts (``init_spawners``).

    JupyterHub (5.5 and 6.x) sets the spawner's ``_check_pending`` while it polls
    the servers it found in its database at start-up; it is the only sign a
    spawner gets that this poll decides whether its server is kept or stopped.
    """
    return bool(getattr(spawner, "_check_pending", False))
