# The two commands (see README):
#   make demo   - the local GPU cluster and a hub in front of it (the main job)
#   make test   - the whole test suite, installing what it needs first
# Everything is installed into this checkout (.venv/, node_modules/, .cache/).

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PYTEST_ARGS ?=
# JupyterHub 5.5 + KubeSpawner 7.0, zero-to-jupyterhub 4.4.0's hub (docs/development.md, "Compatibility"):
# `make test` also runs, in this second virtualenv, the unit and hub-level tests whose
# answer can depend on the line (tests/jupyterhub_line.py; the pure core's, for one,
# run once). The e2e, image, sandbox and z2jh tests run once, on the newest line in
# $(VENV): what they test (the cluster, Docker, the images) does not depend on the hub's
# JupyterHub line (the z2jh test's hub runs in the hub image, with z2jh's JupyterHub 5.5).
VENV_JH55 ?= .venv-jh55
# The tests that run real nodes, Docker engines and Helm take turns on the machine,
# one at a time; the unit and hub-level tests (each hub on its own free ports and
# directory) run in $(PYTEST_WORKERS) pytest-xdist workers beside them: both mostly
# wait. The machine tests start with the ones that wait most (sandbox, images, z2jh),
# so that the unit tests' busiest minutes do not fall on the e2e tests' hubs.
MACHINE_TESTS := tests/sandbox tests/images tests/z2jh tests/e2e tests/benchmarks
UNIT_TESTS := tests $(foreach t,$(MACHINE_TESTS),--ignore=$(t))
PYTEST_WORKERS ?= 2
PYTEST_ARGS_JH55 ?= -n $(PYTEST_WORKERS) $(UNIT_TESTS)

.PHONY: setup system-packages test lint docs chart demo bench clean full-images

setup: $(VENV)/.installed node_modules/.installed $(VENV)/.labext-installed

# Debian packages the suite needs that pip and npm cannot give (Prometheus, Chromium,
# runc and iptables for the real nodes, Docker's engine and registry, debootstrap).
system-packages:
	@sh scripts/install-system-packages.sh

$(VENV)/.installed: pyproject.toml sandbox/pyproject.toml .ci/jupyterhub-6.1.txt docs/requirements.txt
	@command -v $(PYTHON) >/dev/null || { echo "Python 3.10 or newer is needed: install python3 (e.g. apt-get install python3 python3-venv)"; exit 1; }
	@command -v npm >/dev/null || { echo "Node.js 18+ with npm is needed for configurable-http-proxy: install nodejs and npm (e.g. apt-get install nodejs npm)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]' -e ./sandbox -r docs/requirements.txt -c .ci/jupyterhub-6.1.txt
	@touch $@

$(VENV_JH55)/.installed: pyproject.toml sandbox/pyproject.toml .ci/jupyterhub-5.5.txt
	$(PYTHON) -m venv $(VENV_JH55)
	$(VENV_JH55)/bin/python -m pip install --quiet --upgrade pip
	$(VENV_JH55)/bin/python -m pip install --quiet -e '.[test]' -e ./sandbox -c .ci/jupyterhub-5.5.txt
	@touch $@

# JupyterLab's cull warning and GPU status item (extensions/gpuspawner-jupyterlab): its wheel, built with npm
# and JupyterLab's builder, goes into the notebook images' build context and this venv.
LABEXT := extensions/gpuspawner-jupyterlab
LABEXT_WHEELS := images/common/wheels
$(LABEXT_WHEELS)/.built: $(VENV)/.installed $(LABEXT)/pyproject.toml $(LABEXT)/hatch_build.py \
		$(LABEXT)/package.json $(wildcard $(LABEXT)/src/*.js) $(wildcard $(LABEXT)/gpuspawner_jupyterlab/*.py)
	rm -rf $(LABEXT_WHEELS)
	$(PY) -m pip wheel --quiet --no-deps -w $(LABEXT_WHEELS) ./$(LABEXT)
	@touch $@

$(VENV)/.labext-installed: $(LABEXT_WHEELS)/.built
	$(PY) -m pip install --quiet --force-reinstall --no-deps $(LABEXT_WHEELS)/gpuspawner_jupyterlab-*.whl
	@touch $@

$(VENV_JH55)/.labext-installed: $(LABEXT_WHEELS)/.built $(VENV_JH55)/.installed
	$(VENV_JH55)/bin/python -m pip install --quiet --force-reinstall --no-deps $(LABEXT_WHEELS)/gpuspawner_jupyterlab-*.whl
	@touch $@

node_modules/.installed: package.json
	npm install --no-audit --no-fund --loglevel=error
	@touch $@

# The docs site (docs/, Sphinx + MyST + autodoc-traits): warnings are errors and every
# reference must resolve (-n), so a broken link or reference fails `make test`.
docs: setup
	$(VENV)/bin/sphinx-build -W --keep-going -n -q -b html docs build/docs

# gpuspawner's Helm chart: its jupyterhub 4.4.0 dependency packaged offline from
# ../shared/third-party into chart/gpuspawner/charts/ (an admin: `helm dependency build`),
# `helm lint --strict`, then `helm package` into build/chart/ (the sandbox's Helm, built once).
chart: setup
	$(PY) -m gpuspawner_sandbox.helm chart --destination build/chart

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports

# The machine tests' temporary folders (the clusters' state among them) live in a
# folder of their own: pytest keeps only the three newest numbered folders under
# /tmp/pytest-of-<user>, so other pytest runs beside them (the unit tests' two
# lines, or anyone else's) could otherwise delete a running cluster's record.
MACHINE_BASETEMP ?= /tmp/gpuspawner-machine-tests-$(shell id -u)

# The whole suite: scripts/run-suite.sh says how its parts share the 2 cores (the Go
# programs and images built from the start, beside lint, the docs and the unit and
# hub-level tests; then the machine tests) and ends with the suite's time table
# (build/test-times.md, the budget in tests/suite-budget.toml). pytest exits 5 when it
# collected no test: that is a failure here, never a pass.
# `make test PYTEST_ARGS="tests/core -x"` runs lint, the docs, the chart and those tests
# alone, on both JupyterHub lines.
test: setup system-packages
	@if [ -n "$(PYTEST_ARGS)" ]; then \
		$(MAKE) --no-print-directory $(VENV_JH55)/.installed $(VENV_JH55)/.labext-installed || exit 1; \
		failed=0; \
		verdict() { rc=$$1; \
			if [ $$rc -eq 5 ]; then echo "pytest collected no tests: failing"; rc=1; fi; \
			[ $$rc -eq 0 ] || failed=1; }; \
		$(MAKE) --no-print-directory lint docs chart || failed=1; \
		echo "== $(PYTEST_ARGS): JupyterHub 6.1 + KubeSpawner 7.1 ($(VENV)) =="; \
		$(VENV)/bin/pytest --durations=30 $(PYTEST_ARGS); verdict $$?; \
		echo "== unit and hub-level tests: JupyterHub 5.5 + KubeSpawner 7.0 ($(VENV_JH55)) =="; \
		$(VENV_JH55)/bin/pytest -rs $(PYTEST_ARGS_JH55); verdict $$?; \
		exit $$failed; \
	else \
		VENV=$(VENV) VENV_JH55=$(VENV_JH55) PYTEST_WORKERS=$(PYTEST_WORKERS) \
		MACHINE_TESTS="$(MACHINE_TESTS)" MACHINE_BASETEMP=$(MACHINE_BASETEMP) \
		bash scripts/run-suite.sh; \
	fi

# The local GPU cluster (real control plane built from Go, real nodes over emulated GPUs; root)
# and JupyterHub with GPUSpawner at http://127.0.0.1:8000/. Ctrl-C stops it all.
demo: setup system-packages
	@command -v go >/dev/null || { echo "Go 1.26 or newer is needed to build the local control plane: install it (e.g. from go.dev/dl or your distribution) and run make demo again"; exit 1; }
	$(VENV)/bin/gpuspawner-sandbox demo

# Both full notebook images (PyTorch and TensorFlow with their CUDA wheels, ~4.5 GB from
# PyPI) built and checked on the tests' private Docker engine; not part of `make test`
# unless GPUSPAWNER_FULL_IMAGE_BUILD=1 is set (docs/images.md).
full-images: setup system-packages
	GPUSPAWNER_FULL_IMAGE_BUILD=1 $(VENV)/bin/pytest tests/images/test_full_build.py $(PYTEST_ARGS)

bench: setup
	$(PY) benchmarks/spawn_overhead.py

clean:
	rm -rf $(VENV) $(VENV_JH55) node_modules .pytest_cache .ruff_cache $(LABEXT_WHEELS) \
		$(LABEXT)/node_modules $(LABEXT)/build $(LABEXT)/gpuspawner_jupyterlab/labextension
