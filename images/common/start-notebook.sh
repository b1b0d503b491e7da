#!/bin/bash
# start-notebook.sh: the image's default command, as in docker-stacks.
# With a hub's variables (JUPYTERHUB_API_TOKEN) it is start-singleuser.sh; without,
# `docker run -p 8888:8888 IMAGE` serves JupyterLab alone on port JUPYTER_PORT (8888).
# DOCKER_STACKS_JUPYTER_CMD picks the Jupyter subcommand (default: lab; notebook for
# Notebook 7), NOTEBOOK_ARGS and this script's arguments are appended.
# start.sh is the entry point; calling it again here only matters when the entry
# point was overridden (it then runs the hooks, once).
set -e

if [[ -n "${JUPYTERHUB_API_TOKEN}" ]]; then
    echo "WARNING: a JupyterHub is starting this server: using start-singleuser.sh" >&2
    exec /usr/local/bin/start-singleuser.sh "$@"
fi

port="${JUPYTER_PORT:-8888}"
if [[ ! "${port}" =~ ^[0-9]{1,5}$ ]] || ((10#${port} < 1 || 10#${port} > 65535)); then
    # %q: the value is the user's, shown quoted and escaped.
    printf 'ERROR: JUPYTER_PORT=%q is not a port number: set it to one from 1 to 65535, e.g. 8888.\n' \
        "${JUPYTER_PORT}" >&2
    exit 2
fi

# shellcheck disable=SC2086
exec /usr/local/bin/start.sh jupyter "${DOCKER_STACKS_JUPYTER_CMD:-lab}" \
    --ServerApp.ip=0.0.0.0 --ServerApp.port="$((10#${port}))" --ServerApp.open_browser=False \
    ${NOTEBOOK_ARGS} "$@"
