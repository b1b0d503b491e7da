#!/usr/bin/env bash
# The whole test suite, as `make test` runs it (the Makefile passes its variables).
#
# The machine has 2 cores and the suite's critical path is the machine tests (real nodes,
# Docker, Helm), which need Go programs and images first. So, from the start and at once:
#   - the Go programs and the images are built in the background (gpuspawner_sandbox.prebuild);
#   - the unit and hub-level tests run in the background, niced: the whole set on the
#     newest JupyterHub line, then on the second line only the tests whose answer can
#     depend on the line (tests/jupyterhub_line.py);
#   - lint and the docs run in the foreground; the chart is packaged once Helm is built;
# then the machine tests run once both builds have ended. Every part runs to its end, so
# one failure does not hide another; the run fails if any part failed (pytest's exit 5,
# no test collected, is a failure). It ends with the suite's time table
# (scripts/test_times.py, build/test-times.md), whose last lines are the budget's verdict
# and the whole suite's count.
set -u

VENV=${VENV:-.venv}
VENV_JH55=${VENV_JH55:-.venv-jh55}
PYTEST_WORKERS=${PYTEST_WORKERS:-2}
MACHINE_TESTS=${MACHINE_TESTS:-tests/sandbox tests/images tests/z2jh tests/e2e tests/benchmarks}
MACHINE_BASETEMP=${MACHINE_BASETEMP:-/tmp/gpuspawner-machine-tests-$(id -u)}
PY=$VENV/bin/python

unit_tests=(tests)
for t in $MACHINE_TESTS; do unit_tests+=("--ignore=$t"); done

failed=0
failed_parts=()
verdict() {  # verdict EXIT-STATUS WHAT
	local rc=$1
	if [ "$rc" -eq 5 ]; then echo "$2: pytest collected no tests: failing"; rc=1; fi
	if [ "$rc" -ne 0 ]; then
		echo "$2: FAILED (exit $rc)"
		failed=1
		failed_parts+=("$2")
	fi
}

started=$(date +%s)
mkdir -p build
rm -rf build/test-times build/test-times.md
mkdir -p build/test-times
# The prebuild's Go and image builds go into the time table too (gpuspawner_sandbox.suitecosts).
prebuild_steps=$PWD/build/test-times/prebuild.main.steps.jsonl
logs=$(mktemp -d)
interrupted=""
trap 'interrupted=1; failed=1' INT TERM
# step WHAT COMMAND...: run it unless the run was interrupted, and take its verdict.
step() {
	local what=$1
	shift
	if [ -n "$interrupted" ]; then
		echo "$what: not run (interrupted)"
		return
	fi
	"$@"
	verdict $? "$what"
}

# 1. Beside everything: the machine tests' Go programs and images.
# Kueue after the rest: few machine tests need it, and they wait on its build's lock.
(
	GPUSPAWNER_SUITE_COSTS=$prebuild_steps "$PY" -m gpuspawner_sandbox.prebuild go \
		>"$logs/prebuild-go" 2>&1
	echo $? >"$logs/prebuild-go.rc"
	GPUSPAWNER_SUITE_COSTS=$prebuild_steps "$PY" -m gpuspawner_sandbox.prebuild kueue \
		>"$logs/prebuild-kueue" 2>&1
) &
prebuild_go_and_kueue=$!
GPUSPAWNER_SUITE_COSTS=$prebuild_steps "$PY" -m gpuspawner_sandbox.prebuild images \
	>"$logs/prebuild-images" 2>&1 &
prebuild_images=$!

# 2. Beside everything, niced: the unit and hub-level tests of both JupyterHub lines.
(
	nice -n 10 "$VENV/bin/pytest" --time-table=unit-6.1 --durations=15 -n "$PYTEST_WORKERS" \
		"${unit_tests[@]}" >"$logs/6.1" 2>&1
	rc=$?
	echo $rc >"$logs/6.1.rc"
	if [ $rc -ne 2 ]; then  # not after an interrupted first line
		# the second line's virtualenv, installed here rather than before the run starts
		make --no-print-directory "$VENV_JH55/.installed" "$VENV_JH55/.labext-installed" \
			>"$logs/5.5" 2>&1 &&
		nice -n 10 "$VENV_JH55/bin/pytest" --time-table=unit-5.5 --jupyterhub-line-only -rs \
			-n "$PYTEST_WORKERS" "${unit_tests[@]}" >>"$logs/5.5" 2>&1
		echo $? >"$logs/5.5.rc"
	fi
) &
unit=$!

# 3. In the foreground meanwhile: lint and the docs site.
# shellcheck disable=SC2329  # called through step
lint() { "$VENV/bin/ruff" check . && "$VENV/bin/ruff" format --check . && "$VENV/bin/lint-imports"; }
echo "== lint: ruff, the layers' import contracts =="
step "lint" lint
echo "== the docs site (Sphinx, warnings are errors) =="
step "docs" "$VENV/bin/sphinx-build" -W --keep-going -n -q -b html docs build/docs

show_prebuild() {  # show_prebuild PID|- NAME (-: the part writes its exit status to NAME.rc)
	local rc
	if [ "$1" = - ]; then
		while [ ! -s "$logs/prebuild-$2.rc" ] && kill -0 $prebuild_go_and_kueue 2>/dev/null; do
			sleep 2
		done
		rc=$(cat "$logs/prebuild-$2.rc" 2>/dev/null || echo 1)
	else
		wait "$1"
		rc=$?
	fi
	tail -n 3 "$logs/prebuild-$2"
	if [ "$rc" -ne 0 ]; then
		echo "prebuild $2 failed (exit $rc); its last lines (the machine tests will say it again):"
		tail -n 40 "$logs/prebuild-$2"
	fi
	cp "$logs/prebuild-$2" "build/prebuild-$2.log"
}
echo "== waiting for the Go programs (control plane, nodes, Helm; Kueue's build goes on) =="
show_prebuild - go
echo "== the chart: its dependency packaged, helm lint --strict, helm package =="
step "chart" "$PY" -m gpuspawner_sandbox.helm chart --destination build/chart
echo "== waiting for the images (notebook, GPU check), then the chart's images =="
show_prebuild $prebuild_images images
GPUSPAWNER_SUITE_COSTS=$prebuild_steps "$PY" -m gpuspawner_sandbox.prebuild chart-images \
	>"$logs/prebuild-chart-images" 2>&1 &
show_prebuild $! chart-images

# 4. The machine tests: real nodes, Docker, Helm; one at a time on the machine.
echo "== JupyterHub 6.1 + KubeSpawner 7.1 ($VENV): real nodes, Docker, Helm (the unit and hub-level tests run beside; their output follows) =="
# shellcheck disable=SC2086  # MACHINE_TESTS is a list of folders
step "machine tests" "$VENV/bin/pytest" --time-table=machine --durations=30 \
	--basetemp="$MACHINE_BASETEMP" $MACHINE_TESTS

while kill -0 $unit 2>/dev/null; do wait $unit; done  # again after a trapped signal
wait $prebuild_go_and_kueue  # long done: the Kueue tests waited for it
cp "$logs/prebuild-kueue" build/prebuild-kueue.log 2>/dev/null
echo "== unit and hub-level tests: JupyterHub 6.1 + KubeSpawner 7.1 ($VENV), run beside =="
cat "$logs/6.1"
verdict "$(cat "$logs/6.1.rc" 2>/dev/null || echo 1)" "unit and hub-level tests, JupyterHub 6.1"
echo "== unit and hub-level tests that depend on the JupyterHub line: 5.5 + KubeSpawner 7.0 ($VENV_JH55), run beside =="
cat "$logs/5.5" 2>/dev/null || echo "not run: the 6.1 line was interrupted"
verdict "$(cat "$logs/5.5.rc" 2>/dev/null || echo 1)" "unit and hub-level tests, JupyterHub 5.5"
rm -rf "$logs"

if [ $failed -ne 0 ]; then
	echo "== FAILED: ${failed_parts[*]:-interrupted} =="
fi
"$PY" scripts/test_times.py --started "$started"
exit $failed
