# ocrfleet — see README.md. `make run` and `make test` do all set-up themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
MODELS_STAMP := models/.verified
PORT ?= 8101
# `make run WORKERS=N`: the fleet size (N worker servers of one process each; a worker's own
# gunicorn process count is OCR_PROCESSES). RUN_ARGS: more flags, e.g. --gateway-port 9080.
WORKERS ?= 2
export PYTHONPATH := $(CURDIR)

.PHONY: install system-deps models run worker test test-fast bench bench-scaling bench-overload \
	loadtest k8s-validate screenshots lock audit clean

install: system-deps $(STAMP) $(MODELS_STAMP)

system-deps:
	@bash scripts/install_system_deps.sh

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[worker,dev]"
	touch $@

models: $(MODELS_STAMP)

$(MODELS_STAMP): scripts/fetch_models.py | $(STAMP)
	$(PY) scripts/fetch_models.py --dest models
	touch $@

run: install
	$(PY) -m scripts.run_fleet --workers $(WORKERS) $(if $(filter 1 yes true,$(REDIS)),--redis) $(RUN_ARGS)

worker: install
	PORT=$(PORT) $(VENV)/bin/gunicorn -c services/ocr_worker/gunicorn.conf.py services.ocr_worker.wsgi:app

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

# everything but the real engine, 4 pytest processes (most of these tests wait on servers)
test-fast: install
	$(PY) -m pytest -q -m "not engine" -n 4 --dist loadfile $(PYTEST_ARGS)

# requirements/{gateway,worker}.lock from pyproject.toml, pinned with hashes
lock: $(STAMP)
	$(PY) -m scripts.deps lock

# pip-audit on the lock files; skipped with a note where no vulnerability service answers
audit: $(STAMP)
	$(PY) -m scripts.deps audit

bench: install
	$(PY) -m loadtest.bench_all

bench-scaling: install
	$(PY) -m loadtest.bench_scaling

bench-overload: install
	$(PY) -m loadtest.bench_overload

loadtest: install
	$(PY) -m loadtest.run_locust

screenshots: install
	$(PY) -m scripts.ui_screenshots

k8s-validate: install
	$(PY) -m deploy.k8s.validate

clean:
	rm -rf $(VENV) models bench/results .pytest_cache
