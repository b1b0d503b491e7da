"""``GET /gpuspawner/warning``: this server's cull warning, asked of the culler (the I/O part)."""

from __future__ import annotations

import json

from jupyter_server.base.handlers import APIHandler
from jupyter_server.utils import url_path_join
from tornado import web
from tornado.httpclient import AsyncHTTPClient, HTTPClientError

from .warning import CullWarning, this_servers_warning, warning_url


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
            response = await AsyncHTTPClient().fetch(
                url,
                headers={"Authorization": f"token {config.api_token}"},
                request_timeout=config.timeout,
                follow_redirects=False,
            )
            return this_servers_warning(json.loads(response.body), config.server_name)
        except HTTPClientError as e:
            if e.code == 403 and not self.settings.get("gpuspawner_warned_403"):
                self.settings["gpuspawner_warned_403"] = True
                self.log.warning(
                    "gpuspawner-culler refused this server's token at %s: grant servers "
                    "access:services!service=gpuspawner-culler (c.Spawner.server_token_scopes).",
                    url,
                )
            else:
                self.log.debug("No cull warning from %s: %s", url, e)
        except (OSError, ValueError) as e:
            # no culler (or not yet): nothing to show, nothing worth a warning
            self.log.debug("No cull warning from %s: %s", url, e)
        return None


def setup_handlers(serverapp) -> None:
    config = CullWarning(parent=serverapp)
    web_app = serverapp.web_app
    web_app.settings["gpuspawner_cull_warning"] = config
    route = url_path_join(web_app.settings["base_url"], "gpuspawner", "warning")
    web_app.add_handlers(".*$", [(route, WarningHandler)])
    if not config.culler_url:
        serverapp.log.debug("gpuspawner-jupyterlab: no culler URL, no cull warnings.")
