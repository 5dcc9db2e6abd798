# ocrfleet — see README.md. `make run` and `make test` do all set-up themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
MODELS_STAMP := models/.verified
PORT ?= 8101
WORKERS ?= 2
export PYTHONPATH := $(CURDIR)

.PHONY: install system-deps models run worker test bench bench-scaling bench-accuracy bench-paddlex loadtest k8s-validate clean

install: system-deps $(STAMP) $(MODELS_STAMP)

system-deps:
	@bash scripts/install_system_deps.sh

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[worker,openvino,dev]"
	touch $@

models: $(MODELS_STAMP)

$(MODELS_STAMP): scripts/fetch_models.py | $(STAMP)
	$(PY) scripts/fetch_models.py --dest models
	touch $@

run: install
	$(PY) -m scripts.run_fleet --workers $(WORKERS)

worker: install
	PORT=$(PORT) $(VENV)/bin/gunicorn -c services/ocr_worker/gunicorn.conf.py services.ocr_worker.wsgi:app

test: install
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench: install
	$(PY) -m loadtest.bench_all

bench-scaling: install
	$(PY) -m loadtest.bench_scaling

bench-accuracy: install
	$(PY) -m loadtest.bench_accuracy

bench-paddlex: install
	$(PY) -m loadtest.bench_paddlex

loadtest: install
	$(PY) -m loadtest.run_locust

k8s-validate: install
	$(PY) -m deploy.k8s.validate

clean:
	rm -rf $(VENV) models bench/results .pytest_cache
