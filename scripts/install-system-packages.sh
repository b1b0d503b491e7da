#!/bin/sh
# System packages the test suite needs that pip and npm cannot provide.
# Idempotent: installs only what is missing. Needs root for apt-get; otherwise
# it prints the exact command and exits non-zero.
#
#   prometheus  - the real Prometheus the culler's tests start on 127.0.0.1
#   chromium    - the headless browser the admin page's tests drive (playwright, no download)
#   runc        - the OCI runtime under the sandbox's real nodes (containerd's runc shim runs it)
#   iptables    - the real nodes' forward-drop chain (and the kubelet's own chains)
#   docker.io, docker-registry, debootstrap - the image tests' private Docker engine, the
#                 local registry `gpuspawner-images push` pushes to, and the tool that
#                 makes the Debian base image from Debian's packages (tests/images)
#   gcc, libc6-dev - cgo, which NVIDIA's container toolkit needs to build (go-nvml; the
#                 real nodes' nvidia-container-runtime, sandbox/gpuspawner_sandbox/nodebuild.py)
#   postgresql  - the real PostgreSQL the usage store's tests start on 127.0.0.1 (tests/postgres.py)
set -eu

missing=""
command -v prometheus >/dev/null 2>&1 || [ -x /usr/bin/prometheus ] || missing="$missing prometheus"
command -v chromium >/dev/null 2>&1 || [ -x /usr/bin/chromium ] || missing="$missing chromium"
command -v runc >/dev/null 2>&1 || [ -x /usr/sbin/runc ] || missing="$missing runc"
[ -x /usr/sbin/iptables ] || missing="$missing iptables"
# dpkg, not PATH: another docker CLI on PATH is not Debian's engine.
[ -x /usr/sbin/dockerd ] || missing="$missing docker.io"
[ -x /usr/bin/docker-registry ] || missing="$missing docker-registry"
[ -x /usr/sbin/debootstrap ] || missing="$missing debootstrap"
command -v gcc >/dev/null 2>&1 || missing="$missing gcc"
[ -f /usr/include/stdlib.h ] || missing="$missing libc6-dev"
# any major version: Debian puts each under /usr/lib/postgresql/<major>/bin
has_postgresql=""
for initdb in /usr/lib/postgresql/*/bin/initdb; do
    if [ -x "$initdb" ]; then has_postgresql=yes; fi
done
[ -n "$has_postgresql" ] || missing="$missing postgresql"

if [ -z "$missing" ]; then
    exit 0
fi

if ! command -v apt-get >/dev/null 2>&1; then
    echo "Missing:$missing. This machine has no apt-get: install them (Prometheus >= 2.42) so that each is on PATH." >&2
    exit 1
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "Missing:$missing. Install with: sudo apt-get update && sudo apt-get install -y$missing" >&2
    exit 1
fi

echo "Installing:$missing"
apt-get update -qq
# word splitting of the package list is wanted here
# shellcheck disable=SC2086
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $missing
