# ocrfleet — see README.md. `make run` and `make test` do all set-up themselves.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
MODELS_STAMP := models/.verified
# (defined before the rules that name them: make expands a rule's prerequisites as it reads it)
LAYOUT_STAMP := models/layout/.verified
PORT ?= 8101
# `make run WORKERS=N`: the fleet size (N worker servers of one process each; a worker's own
# gunicorn process count is OCR_PROCESSES). RUN_ARGS: more flags, e.g. --gateway-port 9080.
WORKERS ?= 2
export PYTHONPATH := $(CURDIR)

.PHONY: install system-deps models run worker test test-fast bench bench-scaling bench-overload \
	bench-fleet bench-route \
	bench-accuracy bench-cache bench-gateway-memory bench-paddlex bench-layout bench-layout-fleet loadtest k8s-validate screenshots lock audit container-deps \
	images image-test image-smoke docs clean fuzz

install: system-deps $(STAMP) $(MODELS_STAMP) $(LAYOUT_STAMP)

system-deps:
	@bash scripts/install_system_deps.sh

$(STAMP): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e ".[worker,openvino,dev]"
	touch $@

models: $(MODELS_STAMP) $(LAYOUT_STAMP)

$(MODELS_STAMP): scripts/fetch_models.py | $(STAMP)
	$(PY) scripts/fetch_models.py --dest models
	touch $@

# the layout and table models of POST /layout-parsing (scripts/fetch_layout_models.py)
$(LAYOUT_STAMP): scripts/fetch_layout_models.py | $(STAMP)
	$(PY) scripts/fetch_layout_models.py --dest models
	touch $@

run: install
	$(PY) -m scripts.run_fleet --workers $(WORKERS) $(if $(filter 1 yes true,$(REDIS)),--redis) $(RUN_ARGS)

worker: install
	PORT=$(PORT) $(VENV)/bin/gunicorn -c services/ocr_worker/gunicorn.conf.py services.ocr_worker.wsgi:app

# Every Debian package the suite needs, or a failure naming the missing ones; skips pass only
# where tests/allowed_skips.txt allows them, and the run lists them (tests/conftest.py). Tests
# marked `alone` run after the rest, one at a time: the default fleet under minutes of
# real-engine load, which keeps both cores busy, and the two-gateway fleet whose fairness
# starved cores would distort (skipped when PYTEST_ARGS picks tests).
test: install
	@bash scripts/install_system_deps.sh --require
	$(PY) -m pytest -q -m "not alone" $(PYTEST_ARGS)
	$(if $(PYTEST_ARGS),,$(PY) -m pytest -q -n 0 -m alone)

# everything but the real engine (4 pytest processes, as every run: pyproject's addopts)
test-fast: install
	@bash scripts/install_system_deps.sh --require
	$(PY) -m pytest -q -m "not engine" $(PYTEST_ARGS)

# Schemathesis against a sim fleet, driven by /openapi.json (docs/openapi.md has its figures);
# tests/test_schemathesis.py is the short run
FUZZ_EXAMPLES ?= 300
FUZZ_SEED ?= 1
fuzz: install
	$(PY) -m scripts.fuzz_api --examples $(FUZZ_EXAMPLES) --seed $(FUZZ_SEED)

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

# 16-128 sim replicas behind nginx, as a list and a DNS name, 1-4 gateways (docs/capacity.md)
bench-fleet: install
	$(PY) -m loadtest.bench_fleet

# what one gateway core routes at 16 and 128 sim replicas, as a list and behind nginx
bench-route: install
	$(PY) -m loadtest.bench_route

# peak gateway RSS: a 300-page PDF in every format, visualize on and off; 20 x 100 MB uploads
bench-gateway-memory: install
	$(PY) -m loadtest.bench_gateway_memory

# the page cache cold and warm: a 40-page PDF of 4 distinct pages, a 200-page re-run, a miss's cost
bench-cache: install
	$(PY) -m loadtest.bench_cache

bench-accuracy: install
	$(PY) -m loadtest.bench_accuracy

bench-paddlex: install
	$(PY) -m loadtest.bench_paddlex

# /layout-parsing on one in-process worker: TEDS on the generated table corpus (ruled, unruled,
# spanning; 150/300 dpi; clean and scanned), region F1 on the accuracy corpus, pages/s vs /ocr
# (docs/benchmarks.md; writes docs/figures/layout.json)
bench-layout: install
	$(PY) -m loadtest.bench_layout

# one 40-page PDF through /layout-parsing and /ocr on 1, 2 and 4 real workers
bench-layout-fleet: install
	$(PY) -m loadtest.bench_layout_fleet

# `make loadtest`: Locust, headless, against a running fleet (loadtest/README.md: the knobs);
# it fails when a request failed (a wrong answer counts) or HOST is not ready (and says which)
comma := ,
HOST ?= http://127.0.0.1:8080
USERS ?= 10
SPAWN_RATE ?= 2
DURATION ?= 60s
RESULTS_DIR ?= bench/results
loadtest: install
	@$(PY) -c 'import sys, urllib.request as u; u.urlopen(sys.argv[1] + "/readyz", timeout=5)' \
	  $(HOST) 2>/dev/null || { echo "$(HOST)/readyz is not ready: start a fleet first" \
	  "(make run) or set HOST to a ready /ocr endpoint" >&2; exit 1; }
	mkdir -p $(RESULTS_DIR)
	PYTHONPATH=. $(VENV)/bin/locust -f loadtest/locustfile.py --headless --host $(HOST) \
	  --users $(USERS) --spawn-rate $(SPAWN_RATE) --run-time $(DURATION) --stop-timeout 30 \
	  --csv $(RESULTS_DIR)/locust --csv-full-history --html $(RESULTS_DIR)/locust.html \
	  --only-summary $(subst $(comma), ,$(LOCUST_CLASSES))

screenshots: install
	$(PY) -m scripts.ui_screenshots

k8s-validate: install
	$(PY) -m deploy.k8s.validate

# the docs as a site (mkdocs.yml, docs/) in build/site/; strict: a broken link, a missing
# anchor or a page left out of the nav fails it (tests/test_docs.py runs the same build)
docs: $(STAMP)
	$(PY) -m mkdocs build --strict --site-dir build/site

# Container images (docs/development.md "Container images"): podman, runc and debootstrap are installed here
# only, so `make test` stays light. IMAGES_ARGS passes options, e.g. --image worker-cpu.
container-deps:
	@bash scripts/install_container_deps.sh

images: install container-deps
	$(PY) -m deploy.docker.images $(IMAGES_ARGS)

# The container tests (marker `containers`): the images run as the manifests run them, then the
# CPU overlay played with `podman kube play`. One pytest process (-n 0): with pyproject's 4, the
# two modules' containers would run at the same time, on the same cores.
CONTAINER_TESTS = OCRFLEET_CONTAINER_TESTS=1 $(PY) -m pytest -q -s -n 0 -m containers \
	tests/test_images.py tests/test_kube_play.py

image-test: images
	$(CONTAINER_TESTS) $(PYTEST_ARGS)

# CI's form: the CPU worker and gateway images built (layer cache kept: a CI machine is thrown
# away), then every container test that runs on them: all but the GPU image's, which skips
# saying so (tests/allowed_skips.txt allows that skip, and no other).
image-smoke: install container-deps
	$(PY) -m deploy.docker.images --image gateway --image worker-cpu --keep-cache $(IMAGES_ARGS)
	$(CONTAINER_TESTS) $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) models bench/results .pytest_cache
	find deploy/docker/wheelhouse -mindepth 2 ! -name .gitkeep -delete
