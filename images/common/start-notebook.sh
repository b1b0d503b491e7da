#!/bin/bash
# start-notebook.sh: the image's default command, as in docker-stacks.
# With a hub's variables (JUPYTERHUB_API_TOKEN) it is start-singleuser.sh; without,
# `docker run -p 8888:8888 IMAGE` serves JupyterLab alone on port 8888.
# DOCKER_STACKS_JUPYTER_CMD picks the Jupyter subcommand (default: lab),
# NOTEBOOK_ARGS and this script's arguments are appended.
set -e

if [[ -n "${JUPYTERHUB_API_TOKEN}" ]]; then
    echo "WARNING: a JupyterHub is starting this server: using start-singleuser.sh" >&2
    exec /usr/local/bin/start-singleuser.sh "$@"
fi

# shellcheck disable=SC2086
exec /usr/local/bin/start.sh jupyter "${DOCKER_STACKS_JUPYTER_CMD:-lab}" \
    --ServerApp.ip=0.0.0.0 --ServerApp.port=8888 --ServerApp.open_browser=False \
    ${NOTEBOOK_ARGS} "$@"
