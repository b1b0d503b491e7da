#!/bin/bash
# start.sh: the docker-stacks start script, for gpuspawner's notebook images.
#
#   start.sh COMMAND [ARGS...]
#
# It is the image's entry point (tini -g -- start.sh), as in docker-stacks, so any
# command goes through it: the default start-notebook.sh, `docker run IMAGE bash`, and
# z2jh's `singleuser.cmd: jupyterhub-singleuser` (KubeSpawner passes it as args).
# 1. runs the hooks in /usr/local/bin/start-notebook.d (as whoever started the container);
# 2. as root: applies NB_USER/NB_UID/NB_GID, CHOWN_HOME, CHOWN_EXTRA, GRANT_SUDO as
#    docker-stacks documents them; as any other uid: gives that uid a passwd entry;
# 3. runs the hooks in /usr/local/bin/before-notebook.d;
# 4. runs COMMAND, as NB_USER when started as root.
# A hook is sourced when it is a *.sh file and executed when it is executable.
#
# It does all this once per container. start-notebook.sh and start-singleuser.sh call
# start.sh too, so that the hooks also run when the entry point is overridden (a pod's
# `command`, `docker run --entrypoint`); with start.sh in the entry point that second
# call, like an old-style `docker run IMAGE start.sh bash`, only runs its command.
set -e

_log() {
    # Warnings and errors are always shown, as in docker-stacks.
    if [[ "${JUPYTER_DOCKER_STACKS_QUIET}" == "" || "$*" == "WARNING:"* || "$*" == "ERROR:"* ]]; then
        echo "$@" >&2
    fi
}

run-hooks() {
    local dir="$1"
    if [[ ! -d "${dir}" ]]; then
        return 0
    fi
    _log "Running hooks in: ${dir} as uid: $(id -u) gid: $(id -g)"
    local f
    for f in "${dir}/"*; do
        # A directory without hooks leaves the glob unexpanded.
        [[ -e "${f}" ]] || continue
        case "${f}" in
            *.sh)
                _log "Sourcing shell script: ${f}"
                # shellcheck disable=SC1090
                source "${f}"
                ;;
            *)
                if [[ -x "${f}" ]]; then
                    _log "Running executable: ${f}"
                    "${f}"
                else
                    _log "Ignoring non-executable: ${f}"
                fi
                ;;
        esac
    done
    _log "Done running hooks in: ${dir}"
}

if [[ $# -eq 0 ]]; then
    set -- start-notebook.sh
fi

# Exported, so that it reaches the command (through sudo's --preserve-env as well) and
# any start.sh it calls; kernels and terminals inherit it, where the hooks ran already.
if [[ "${GPUSPAWNER_START_SH_RAN}" == "1" ]]; then
    _log "Running: $*"
    exec "$@"
fi
export GPUSPAWNER_START_SH_RAN=1

run-hooks /usr/local/bin/start-notebook.d

if [[ "$(id -u)" == 0 ]]; then
    # Rename jovyan to NB_USER, move NB_USER to NB_UID/NB_GID, fix ownership: root only.
    if [[ "${NB_USER}" != "jovyan" ]] && ! id "${NB_USER}" >/dev/null 2>&1; then
        _log "Renaming user jovyan to ${NB_USER}"
        usermod --login "${NB_USER}" --home "/home/${NB_USER}" --move-home jovyan
        export HOME="/home/${NB_USER}"
    fi
    if [[ "${NB_GID}" != "$(id -g "${NB_USER}")" ]]; then
        _log "Giving ${NB_USER} the primary group ${NB_GID} (${NB_GROUP:-${NB_USER}})"
        groupadd --force --gid "${NB_GID}" --non-unique "${NB_GROUP:-${NB_USER}}"
        usermod --gid "${NB_GID}" --append --groups 100 "${NB_USER}"
    fi
    if [[ "${NB_UID}" != "$(id -u "${NB_USER}")" ]]; then
        _log "Giving ${NB_USER} the uid ${NB_UID}"
        usermod --non-unique --uid "${NB_UID}" "${NB_USER}"
    fi
    if [[ "${CHOWN_HOME}" == "1" || "${CHOWN_HOME}" == "yes" ]]; then
        _log "Changing ownership of /home/${NB_USER} to ${NB_UID}:${NB_GID} with options '${CHOWN_HOME_OPTS}'"
        # shellcheck disable=SC2086
        chown ${CHOWN_HOME_OPTS} "${NB_UID}:${NB_GID}" "/home/${NB_USER}"
    fi
    if [[ -n "${CHOWN_EXTRA}" ]]; then
        for extra_dir in $(echo "${CHOWN_EXTRA}" | tr ',' ' '); do
            _log "Changing ownership of ${extra_dir} to ${NB_UID}:${NB_GID} with options '${CHOWN_EXTRA_OPTS}'"
            # shellcheck disable=SC2086
            chown ${CHOWN_EXTRA_OPTS} "${NB_UID}:${NB_GID}" "${extra_dir}"
        done
    fi
    if [[ "${GRANT_SUDO}" == "1" || "${GRANT_SUDO}" == "yes" ]]; then
        _log "Granting ${NB_USER} passwordless sudo"
        echo "${NB_USER} ALL=(ALL) NOPASSWD:ALL" >/etc/sudoers.d/added-by-start-script
    fi
    run-hooks /usr/local/bin/before-notebook.d
    _log "Running as ${NB_USER}: $*"
    # sudo looks commands up in its secure_path, which lacks /opt/venv/bin
    # (jupyter, jupyterhub-singleuser): name the command by the path ours finds.
    resolved="$(command -v "$1" || true)"
    if [[ "${resolved}" == /* ]]; then
        set -- "${resolved}" "${@:2}"
    fi
    # --preserve-env keeps the hub's variables; PATH and LD_LIBRARY_PATH are
    # passed explicitly because sudo resets them.
    exec sudo --preserve-env --set-home --user "${NB_USER}" \
        PATH="${PATH}" LD_LIBRARY_PATH="${LD_LIBRARY_PATH}" PYTHONPATH="${PYTHONPATH:-}" \
        "$@"
fi

# Not root: these can only be warned about, as docker-stacks does.
if ! whoami >/dev/null 2>&1; then
    # An arbitrary uid (OpenShift, runAsUser): give it a passwd entry named NB_USER
    # so that tools asking for a user name work; /etc/passwd is group-writable for this.
    if [[ -w /etc/passwd ]]; then
        _log "Adding a passwd entry for uid $(id -u) as ${NB_USER}"
        sed --expression="s/^${NB_USER}:/builder:/" /etc/passwd >/tmp/passwd
        echo "${NB_USER}:x:$(id -u):$(id -g):,,,:/home/${NB_USER}:/bin/bash" >>/tmp/passwd
        cat /tmp/passwd >/etc/passwd
        rm /tmp/passwd
    else
        _log "WARNING: uid $(id -u) has no passwd entry and /etc/passwd is not writable"
    fi
fi
if [[ "${NB_UID}" != "$(id -u)" || "${NB_GID}" != "$(id -g)" ]]; then
    _log "WARNING: NB_UID/NB_GID (${NB_UID}:${NB_GID}) only take effect when the container starts as root (--user root); running as $(id -u):$(id -g)"
fi
if [[ "${GRANT_SUDO}" == "1" || "${GRANT_SUDO}" == "yes" ]]; then
    _log "WARNING: GRANT_SUDO only takes effect when the container starts as root (--user root)"
fi
if [[ "${CHOWN_HOME}" == "1" || "${CHOWN_HOME}" == "yes" ]]; then
    _log "WARNING: CHOWN_HOME only takes effect when the container starts as root (--user root)"
fi
run-hooks /usr/local/bin/before-notebook.d
_log "Running: $*"
exec "$@"
