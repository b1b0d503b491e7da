#!/bin/sh
# `make test`'s pytest runs (README, "Development"), called by the Makefile with
# VENV, VENV_JH55 and PYTEST_ARGS / PYTEST_ARGS_JH55 set.
#
# The whole suite runs as two halves at once. The half on real things that mostly
# waits for them (tests/e2e, images, sandbox, z2jh: real nodes, Docker builds, Helm)
# runs in the foreground; the unit and hub-level tests, on JupyterHub 6.1 and then
# on JupyterHub 5.5, run beside it with their output kept in $LOGS and printed
# when the first half ends. The halves share nothing but the machine: the
# background half starts no node, engine or cluster, and every server either
# starts listens on a free loopback port of its own.
#
# With PYTEST_ARGS set (a chosen subset), that subset runs alone, in the foreground,
# followed by PYTEST_ARGS_JH55 on JupyterHub 5.5 as before.
#
# pytest exits 5 when it collected nothing: that is a failure here, never a pass.
# Each JupyterHub 6.1 half ends with its 30 slowest steps (fixtures included).
set -u

: "${VENV:=.venv}" "${VENV_JH55:=.venv-jh55}" "${PYTEST_ARGS:=}"
: "${PYTEST_ARGS_JH55:=tests --ignore=tests/e2e --ignore=tests/images --ignore=tests/sandbox --ignore=tests/z2jh}"
LOGS=${LOGS:-.cache/test-logs}
REAL_PARTS="tests/e2e tests/images tests/sandbox tests/z2jh"

# run NAME PYTEST [ARGS...]: one pytest run; prints a line and returns non-zero on failure.
run() {
	name=$1
	shift
	"$@"
	rc=$?
	if [ "$rc" -eq 5 ]; then
		echo "pytest collected no tests ($name): failing"
		rc=1
	fi
	[ "$rc" -eq 0 ] || echo "== FAILED: $name (pytest exit $rc) =="
	return "$rc"
}

failed=0
if [ -n "$PYTEST_ARGS" ]; then
	echo "== the chosen tests: JupyterHub 6.1 + KubeSpawner 7.1 ($VENV) =="
	# shellcheck disable=SC2086 # the arguments are words on purpose
	run "JupyterHub 6.1" "$VENV/bin/pytest" --durations=30 $PYTEST_ARGS || failed=1
	echo "== unit and hub-level tests: JupyterHub 5.5 + KubeSpawner 7.0 ($VENV_JH55) =="
	# shellcheck disable=SC2086
	run "JupyterHub 5.5" "$VENV_JH55/bin/pytest" -rs $PYTEST_ARGS_JH55 || failed=1
	exit "$failed"
fi

mkdir -p "$LOGS"
ignores=""
for part in $REAL_PARTS; do ignores="$ignores --ignore=$part"; done
(
	bg_failed=0
	# shellcheck disable=SC2086
	run "unit and hub-level, JupyterHub 6.1" "$VENV/bin/pytest" --durations=30 -p no:cacheprovider \
		tests $ignores >"$LOGS/unit-jh61.log" 2>&1 || bg_failed=1
	# shellcheck disable=SC2086
	run "unit and hub-level, JupyterHub 5.5" "$VENV_JH55/bin/pytest" -rs -p no:cacheprovider \
		$PYTEST_ARGS_JH55 >"$LOGS/unit-jh55.log" 2>&1 || bg_failed=1
	exit "$bg_failed"
) &
background=$!
# A Ctrl-C or a CI timeout stops the background half too.
trap 'kill "$background" 2>/dev/null; exit 130' INT TERM

echo "== real nodes, Docker, Helm: JupyterHub 6.1 + KubeSpawner 7.1 ($VENV) =="
echo "   (the unit and hub-level tests run beside it on JupyterHub 6.1 then 5.5; their output follows)"
# shellcheck disable=SC2086
run "real nodes, Docker, Helm" "$VENV/bin/pytest" --durations=30 $REAL_PARTS || failed=1

wait "$background" || failed=1
echo "== unit and hub-level tests: JupyterHub 6.1 + KubeSpawner 7.1 ($VENV) =="
cat "$LOGS/unit-jh61.log"
echo "== unit and hub-level tests: JupyterHub 5.5 + KubeSpawner 7.0 ($VENV_JH55) =="
cat "$LOGS/unit-jh55.log" 2>/dev/null || echo "(did not run)"
[ "$failed" -eq 0 ] && echo "== all passed ==" || echo "== some tests FAILED (above) =="
exit "$failed"
