# syntax=docker/dockerfile:1
#
# The logic server (`logicd serve`) of one service: CPU only, slim. No torch, no CUDA, no onnxruntime:
# the logic server tokenizes, chunks, calls the model service over HTTP or gRPC and aggregates; it runs
# no model itself (embedded mode, `model_service.url: embedded`, needs the modelsvc image instead).
#
# Build from the repository root, after `python -m services.build` wrote the service's tokenizer:
#
#   python -m services.build
#   docker build -f docker/logic.Dockerfile --build-arg SERVICE_DIR=services/doc_classifier \
#       -t doc-classifier-logic:0.1.0 .
#   docker run --rm -p 8080:8080 -e LOGICD_MODEL_SERVICE__URL=http://modelsvc:8000 doc-classifier-logic:0.1.0
#
# The service folder lands in /app/service (service.yaml, the logic module, the tokenizer); its model
# repository and tests stay out. The Helm chart mounts its own service.yaml over /app/service/service.yaml.

# Python of both stages (the project needs 3.11 or newer); a Debian 12 "slim" image.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# The service folder to package, relative to the repository root (holds service.yaml). Required.
ARG SERVICE_DIR
# A package index mirror for pip (optional); pip reads PIP_INDEX_URL / PIP_EXTRA_INDEX_URL from the environment.
ARG PIP_INDEX_URL
# An extra package index for pip (optional).
ARG PIP_EXTRA_INDEX_URL
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN test -n "${SERVICE_DIR}" || { echo "build with --build-arg SERVICE_DIR=services/<name>" >&2; exit 1; } \
    && python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
# Dependencies first (a layer that survives code changes): the project's base requirements without onnxruntime.
COPY pyproject.toml README.md ./
COPY docker/requirements.py docker/requirements.py
RUN python docker/requirements.py --onnxruntime none > /tmp/requirements.txt \
    && pip install -r /tmp/requirements.txt
COPY modelsvc modelsvc
COPY logicd logicd
RUN pip install --no-deps . \
    && python -c "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) for m in ('torch', 'onnxruntime')))"
COPY ${SERVICE_DIR} /app/service
RUN if [ ! -f /app/service/service.yaml ]; then echo "${SERVICE_DIR} has no service.yaml" >&2; exit 1; fi \
    && rm -rf /app/service/model_repository /app/service/tests \
    && find /app/service -name __pycache__ -prune -exec rm -rf {} +

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="logicd" \
      org.opencontainers.image.description="A logicd logic server (CPU): request handling, tokenization, chunking, aggregation" \
      org.opencontainers.image.licenses="Apache-2.0"
# The numeric user and group the server runs as (not root; numeric, so Kubernetes' runAsNonRoot can check it).
ARG UID=10001
RUN groupadd --system --gid "${UID}" logicd \
    && useradd --system --uid "${UID}" --gid logicd --home-dir /app --no-create-home --shell /usr/sbin/nologin logicd
COPY --from=build /opt/venv /opt/venv
COPY --from=build /app/service /app/service
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1
WORKDIR /app/service
USER ${UID}:${UID}
EXPOSE 8080
# /health/ready answers 200 once the model service answers and every model the service uses is ready.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request as r; sys.exit(r.urlopen('http://127.0.0.1:8080/health/ready', timeout=4).status != 200)"]
# SIGTERM drains in-flight requests for up to --exit-timeout-secs (default 30), then exits 0.
STOPSIGNAL SIGTERM
ENTRYPOINT ["logicd", "serve", "/app/service", "--host", "0.0.0.0", "--port", "8080"]
CMD []
