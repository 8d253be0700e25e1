# syntax=docker/dockerfile:1
#
# modelsvc, the Triton-compatible model server, for CPU nodes: ONNX Runtime (CPU build), OpenVINO (the openvino
# backend, and ONNX models' cpu_execution_accelerator "openvino"), the python backend, and s3:// model repositories. No model inside: mount a repository at /models, or pass an s3:// URL.
#
# Build from the repository root:
#
#   docker build -f docker/modelsvc.Dockerfile -t modelsvc:0.1.0 .
#   docker run --rm -p 8000-8002:8000-8002 -v "$PWD/services/doc_classifier/model_repository:/models:ro" modelsvc:0.1.0
#
# Ports: 8000 HTTP, 8001 gRPC, 8002 metrics. SIGTERM drains in-flight requests for --exit-timeout-secs (30).

# Python of both stages (the project needs 3.11 or newer); a Debian 12 "slim" image.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# Optional dependency groups of pyproject.toml to install, comma-separated: openvino, s3 (s3fs), gcs (gcsfs),
# azure (adlfs), pytorch (torch: pass a CPU build's index in PIP_EXTRA_INDEX_URL, or pip picks a CUDA build of GBs).
ARG MODELSVC_EXTRAS=openvino,s3
# A package index mirror for pip (optional); pip reads PIP_INDEX_URL / PIP_EXTRA_INDEX_URL from the environment.
ARG PIP_INDEX_URL
# An extra package index for pip (optional).
ARG PIP_EXTRA_INDEX_URL
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependencies first: the base requirements with the CPU build of onnxruntime (not onnxruntime-gpu), and the extras.
COPY pyproject.toml README.md ./
COPY docker/requirements.py docker/requirements.py
RUN python docker/requirements.py --onnxruntime cpu --extra "${MODELSVC_EXTRAS}" > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt
COPY modelsvc modelsvc
COPY logicd logicd
RUN pip install --no-deps . \
    && python -c "import onnxruntime as ort; assert ort.get_available_providers()[-1] == 'CPUExecutionProvider'"

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="modelsvc" \
      org.opencontainers.image.description="Triton-compatible model server (KServe v2 over HTTP and gRPC), CPU build" \
      org.opencontainers.image.licenses="Apache-2.0"
# The numeric user and group the server runs as (not root; numeric, so Kubernetes' runAsNonRoot can check it).
ARG UID=10001
RUN groupadd --system --gid "${UID}" modelsvc \
    && useradd --system --uid "${UID}" --gid modelsvc --home-dir /var/cache/modelsvc --no-create-home \
       --shell /usr/sbin/nologin modelsvc \
    && mkdir -p /models /var/cache/modelsvc \
    && chown "${UID}:${UID}" /var/cache/modelsvc
COPY --from=build /opt/venv /opt/venv
# MODELSVC_CACHE_DIR: where remote (s3://) repositories are mirrored; an emptyDir in Kubernetes.
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MODELSVC_CACHE_DIR=/var/cache/modelsvc
WORKDIR /var/cache/modelsvc
USER ${UID}:${UID}
EXPOSE 8000 8001 8002
# ready: every model loaded and the server not draining (a draining server answers 503).
HEALTHCHECK --interval=15s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request as r; sys.exit(r.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=4).status != 200)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["modelsvc", "serve"]
CMD ["--model-repository=/models"]
