# syntax=docker/dockerfile:1
# Gateway: splits PDFs, fans pages out to the workers, reassembles. Imports no OCR engine, so
# the image holds only the project's base dependencies. Build from the repository root:
#
#   docker build -f deploy/docker/gateway.Dockerfile -t ocrfleet/gateway:0.1.0 .
#   docker run --rm -p 8080:8080 -e GATEWAY_UPSTREAM_URL=http://worker:8101 ocrfleet/gateway:0.1.0

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

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
COPY deploy/docker/wheelhouse/gateway/ /wheels/
RUN if [ -f /wheels/requirements.txt ]; then \
      pip install --no-index --find-links /wheels \
        $(grep -q -- '--hash=' /wheels/requirements.txt && echo --require-hashes) \
        -r /wheels/requirements.txt; \
    else \
      python requirements.py > requirements.txt && pip install -r requirements.txt; \
    fi

FROM ${PYTHON_IMAGE} AS runtime
RUN groupadd --system --gid 10001 ocr \
 && useradd --system --uid 10001 --gid 10001 --home-dir /home/ocr --create-home \
      --shell /usr/sbin/nologin ocr
COPY --from=build /opt/venv /opt/venv
WORKDIR /app
# The shared API module lives under services/ (services/ocr_api); the worker's engine code
# there is never imported by the gateway, and its dependencies are not installed.
COPY services/ services/
COPY gateway/ gateway/
RUN /opt/venv/bin/python -m compileall -q /app/services /app/gateway
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/app \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOST=0.0.0.0 \
    PORT=8080
USER 10001:10001
EXPOSE 8080
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PORT', '8080'), timeout=4)"]
CMD ["gunicorn", "-c", "gateway/gunicorn.conf.py", "gateway.wsgi:app"]
