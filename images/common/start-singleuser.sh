#!/bin/bash
# start-singleuser.sh: JupyterHub's single-user server, through start.sh and its hooks.
# JupyterHub passes the rest (URL, port, token) in JUPYTERHUB_* variables.
set -e
# shellcheck disable=SC2086
exec /usr/local/bin/start.sh jupyterhub-singleuser ${NOTEBOOK_ARGS} "$@"
