#!/bin/bash
# start-singleuser.sh: JupyterHub's single-user server, through start.sh and its hooks.
# JupyterHub passes the rest (URL, port, token) in JUPYTERHUB_* variables: the hub's
# port applies here, not JUPYTER_PORT. start.sh is the entry point; calling it again
# here only matters when the entry point was overridden (it then runs the hooks, once).
set -e
# shellcheck disable=SC2086
exec /usr/local/bin/start.sh jupyterhub-singleuser ${NOTEBOOK_ARGS} "$@"
