"""This server's cull warning and GPU load, asked of the culler, and its keep (the I/O part).

``GET /gpuspawner/warning`` and ``GET /gpuspawner/gpu-status``: each asks the
culler with the server's own hub token and answers JupyterLab.
``POST /gpuspawner/keep`` (``{"seconds": 3600}``, JupyterLab's XSRF header):
"Keep for 1 h" on the warning, forwarded to the culler's ``/api/keep`` for this
server, with its token; the culler decides whether it may be kept.
"""

from __future__ import annotations

import json

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from .gpustatus import GpuStatus, gpu_status_url, status_answer
from .warning import (
    BAD_SECONDS,
    NO_CULLER,
    NOT_CONFIGURED,
    CullWarning,
    keep_answer,
    keep_seconds,
    keep_url,
    this_servers_warning,
    warning_url,
)


async def ask(where: CullWarning, url: str):
    """The culler's JSON answer at ``url``, asked with this server's own hub token.

    Raises HTTPClientError for an HTTP error, OSError or ValueError when the
    culler cannot be reached or answers something that is not JSON.
    """
    response = await AsyncHTTPClient().fetch(
        url,
        headers={"Authorization": f"token {where.api_token}"},
        request_timeout=where.timeout,
        follow_redirects=False,
    )
    return json.loads(response.body)


def _warn_refused_once(handler: APIHandler, url: str) -> None:
    if not handler.settings.get("gpuspawner_warned_403"):
        handler.settings["gpuspawner_warned_403"] = True
        handler.log.warning(
            "gpuspawner-culler refused this server's token at %s: grant servers "
            "access:services!service=gpuspawner-culler (c.Spawner.server_token_scopes).",
            url,
        )


class WarningHandler(APIHandler):
    # polling from an open tab is not use: it must not keep an idle server alive
    _track_activity = False

    @property
    def cull_warning(self) -> CullWarning:
        return self.settings["gpuspawner_cull_warning"]

    @web.authenticated
    async def get(self):
        config = self.cull_warning
        answer = {"warning": None, "poll_seconds": config.poll_seconds}
        if config.culler_url and config.api_token:
            answer["warning"] = await self.ask_culler(config)
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(answer))

    async def ask_culler(self, config: CullWarning) -> dict | None:
        url = warning_url(config.culler_url)
        try:
            return this_servers_warning(await ask(config, url), config.server_name)
        except HTTPClientError as e:
            if e.code == 403:
                _warn_refused_once(self, url)
            else:
                self.log.debug("No cull warning from %s: %s", url, e)
        except (OSError, ValueError) as e:
            # no culler (or not yet): nothing to show, nothing worth a warning
            self.log.debug("No cull warning from %s: %s", url, e)
        return None


class GpuStatusHandler(APIHandler):
    """This server's GPU load for JupyterLab's status bar, asked of the culler.

    ``{"status": null}`` when there is nothing to show: no culler configured,
    a CPU server (the culler does not list it), a culler without the API, or
    one that refuses the token. A culler that cannot be reached now answers
    502, so that JupyterLab keeps its last figures and asks again.
    """

    # polling from an open tab is not use: it must not keep an idle server alive
    _track_activity = False

    @web.authenticated
    async def get(self):
        where: CullWarning = self.settings["gpuspawner_cull_warning"]
        fallback = self.settings["gpuspawner_gpu_status"].poll_seconds
        culler_answer, failed = None, False
        if where.culler_url and where.api_token:
            culler_answer, failed = await self.ask_culler(where)
        answer = status_answer(culler_answer, where.server_name, fallback)
        self.set_header("Cache-Control", "no-store")
        if failed:
            self.set_status(502)
        self.finish(json.dumps(answer))

    async def ask_culler(self, where: CullWarning) -> tuple[dict | None, bool]:
        """The culler's answer (None: nothing to show), and whether asking failed for now."""
        url = gpu_status_url(where.culler_url)
        try:
            answer = await ask(where, url)
            return (answer if isinstance(answer, dict) else None), False
        except HTTPClientError as e:
            if e.code == 403:
                _warn_refused_once(self, url)
                return None, False
            if e.code == 404:
                # a culler from before /api/gpu-status, or none under this URL
                self.log.debug("No GPU status at %s: %s", url, e)
                return None, False
            self.log.debug("No GPU status from %s for now: %s", url, e)
        except (OSError, ValueError) as e:
            # the culler is restarting or unreachable: JupyterLab keeps its figures
            self.log.debug("No GPU status from %s for now: %s", url, e)
        return None, True


class KeepHandler(APIHandler):
    """``POST {"seconds": 3600}``: keep this server that long, if the culler agrees.

    Answers ``{"until": epoch, "message": "Kept until 15:02 UTC."}``, or the
    culler's refusal (its status and sentence), or 502 when it cannot be asked.
    A click is the user's doing: it counts as activity, as any request does.
    """

    @web.authenticated
    async def post(self):
        where: CullWarning = self.settings["gpuspawner_cull_warning"]
        try:
            body = json.loads(self.request.body or b"{}")
        except ValueError:
            body = None
        seconds = keep_seconds(body)
        if seconds is None:
            return self._answer(400, {"message": BAD_SECONDS})
        if not (where.culler_url and where.api_token):
            return self._answer(503, {"message": NOT_CONFIGURED})
        url = keep_url(where.culler_url)
        try:
            response = await AsyncHTTPClient().fetch(
                url,
                method="POST",
                body=json.dumps({"server": where.server_name, "seconds": seconds}),
                headers={
                    "Authorization": f"token {where.api_token}",
                    "Content-Type": "application/json",
                },
                request_timeout=where.timeout,
                follow_redirects=False,
                raise_error=False,
            )
        except (HTTPClientError, OSError) as e:
            self.log.warning(
                "gpuspawner-jupyterlab: could not ask %s to keep this server: %s", url, e
            )
            return self._answer(502, {"message": NO_CULLER})
        status, answer = keep_answer(response.code, response.body)
        self.log.info(
            "gpuspawner-jupyterlab: keep for %d s: %d %r", seconds, status, answer["message"]
        )
        self._answer(status, answer)

    def _answer(self, status: int, answer: dict) -> None:
        self.set_status(status)
        self.set_header("Cache-Control", "no-store")
        self.finish(json.dumps(answer))


def setup_handlers(serverapp) -> None:
    config = CullWarning(parent=serverapp)
    web_app = serverapp.web_app
    web_app.settings["gpuspawner_cull_warning"] = config
    web_app.settings["gpuspawner_gpu_status"] = GpuStatus(parent=serverapp)
    base = web_app.settings["base_url"]
    web_app.add_handlers(
        ".*$",
        [
            (url_path_join(base, "gpuspawner", "warning"), WarningHandler),
            (url_path_join(base, "gpuspawner", "gpu-status"), GpuStatusHandler),
            (url_path_join(base, "gpuspawner", "keep"), KeepHandler),
        ],
    )
    if not config.culler_url:
        serverapp.log.debug("gpuspawner-jupyterlab: no culler URL, no cull warnings.")
