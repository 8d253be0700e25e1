# syntax=docker/dockerfile:1
#
# modelsvc for NVIDIA GPU nodes: ONNX Runtime GPU (CUDA and TensorRT execution providers) on NVIDIA's CUDA
# runtime image with cuDNN, TensorRT and cuda-python from pip (`modelsvc[tensorrt]`: the tensorrt_plan backend,
# `modelsvc build`), nvidia-ml-py for the GPU metrics (nv_gpu_*), and s3:// model repositories.
#
# Build from the repository root (pulls from PyPI and NVIDIA's index, pypi.nvidia.com):
#
#   docker build -f docker/modelsvc-gpu.Dockerfile -t modelsvc-gpu:0.1.0 .
#   docker run --rm --gpus all -p 8000-8002:8000-8002 \
#       -v "$PWD/services/doc_classifier/model_repository:/models:ro" modelsvc-gpu:0.1.0
#
# Versions go together; change them together. One set, CUDA 13: the tensorrt extra of pyproject.toml names its
# ranges (TensorRT 10.16..11.x for CUDA 13, cuda-python 13) and says where the other copies are; the ARGs below
# pin one point of it, and loadtests/gpu/verify.sh installs the same. onnxruntime-gpu 1.27 and later are CUDA 13
# builds, and ONNX Runtime 1.27+ supports TensorRT 11 in its TensorRT provider (TensorRT's 10.x-to-11.x
# migration guide); 1.26 and earlier are CUDA 12 builds for TensorRT 10: not with this base.
# TensorRT 11 builds strongly typed networks only: `modelsvc build --fp16` converts the ONNX model first.
# CUDA and cuDNN come from the base image, where ONNX Runtime's loader finds them; the pip `cuda,cudnn`
# extras of onnxruntime-gpu would add a second copy that nothing loads (see ONNXRUNTIME_EXTRAS).
# The node needs an NVIDIA driver of the R580 branch or newer (CUDA 13.0).

# NVIDIA's CUDA runtime image with cuDNN 9 (Ubuntu 24.04: Python 3.12).
ARG CUDA_IMAGE=nvidia/cuda:13.0.2-cudnn-runtime-ubuntu24.04

FROM ${CUDA_IMAGE} AS build
# onnxruntime-gpu release: a CUDA 13 build (1.27 and later; 1.26 and earlier are CUDA 12 builds).
ARG ONNXRUNTIME_VERSION=1.31.1
# pip extras of onnxruntime-gpu, e.g. "cuda,cudnn" to take CUDA 13 and cuDNN from pip on a base without them.
ARG ONNXRUNTIME_EXTRAS=""
# TensorRT release (its CUDA 13 wheels, tensorrt-cu13) for ONNX Runtime's TensorRT provider and modelsvc's
# tensorrt_plan backend and `modelsvc build`; within the extra's range, 10.16 or later.
ARG TENSORRT_VERSION=11.4.0.106
# cuda-python (the tensorrt extra: cuda.bindings, the CUDA calls of the tensorrt_plan backend, never torch).
# Its major.minor follows the CUDA of the base image: 13.0 here.
ARG CUDA_PYTHON_VERSION=13.0.3
# Optional dependency groups of pyproject.toml besides tensorrt: s3, gcs, azure, comma-separated.
ARG MODELSVC_EXTRAS=s3
# A package index mirror for pip (optional).
ARG PIP_INDEX_URL
# NVIDIA's package index, where the TensorRT wheels' libraries are published.
ARG PIP_EXTRA_INDEX_URL=https://pypi.nvidia.com
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md ./
COPY docker/requirements.py docker/requirements.py
RUN python docker/requirements.py --onnxruntime gpu --onnxruntime-extras "${ONNXRUNTIME_EXTRAS}" \
        --extra tensorrt --extra "${MODELSVC_EXTRAS}" > /tmp/requirements.txt \
    && printf 'onnxruntime-gpu==%s\ntensorrt==%s\ntensorrt-cu13==%s\ncuda-python==%s\n' \
        "${ONNXRUNTIME_VERSION}" "${TENSORRT_VERSION}" "${TENSORRT_VERSION}" "${CUDA_PYTHON_VERSION}" \
        > /tmp/constraints.txt \
    && pip install -r /tmp/requirements.txt -c /tmp/constraints.txt
COPY modelsvc modelsvc
COPY logicd logicd
RUN pip install --no-deps . \
    && python -c "import onnxruntime as ort; p = ort.get_available_providers(); assert 'TensorrtExecutionProvider' in p and 'CUDAExecutionProvider' in p, p" \
    && python -c "import pynvml; from cuda.bindings import driver, runtime" \
    && ln -s "$(python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/tensorrt_libs" /opt/venv/tensorrt_libs \
    && test -e "/opt/venv/tensorrt_libs/libnvinfer.so.${TENSORRT_VERSION%%.*}"

FROM ${CUDA_IMAGE}
LABEL org.opencontainers.image.title="modelsvc-gpu" \
      org.opencontainers.image.description="Triton-compatible model server (KServe v2 over HTTP and gRPC), CUDA 13 and TensorRT build" \
      org.opencontainers.image.licenses="Apache-2.0"
# The numeric user and group the server runs as (not root; numeric, so Kubernetes' runAsNonRoot can check it).
ARG UID=10001
ENV DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid "${UID}" modelsvc \
    && useradd --system --uid "${UID}" --gid modelsvc --home-dir /var/cache/modelsvc --no-create-home \
       --shell /usr/sbin/nologin modelsvc \
    && mkdir -p /models /var/cache/modelsvc \
    && chown "${UID}:${UID}" /var/cache/modelsvc
COPY --from=build /opt/venv /opt/venv
# LD_LIBRARY_PATH: TensorRT's libraries (libnvinfer) from the pip wheel, for ONNX Runtime's TensorRT provider,
# in front of the base image's own entries (/usr/local/nvidia/lib64: where some clusters mount the driver).
# MODELSVC_CACHE_DIR: where remote (s3://) repositories are mirrored; an emptyDir in Kubernetes.
ENV PATH=/opt/venv/bin:$PATH \
    LD_LIBRARY_PATH=/opt/venv/tensorrt_libs:/usr/local/cuda/lib64:${LD_LIBRARY_PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    MODELSVC_CACHE_DIR=/var/cache/modelsvc
WORKDIR /var/cache/modelsvc
USER ${UID}:${UID}
EXPOSE 8000 8001 8002
# ready: every model loaded and the server not draining. A provider that cannot load makes ONNX Runtime fall
# back to CPU silently: modelsvc_model_execution_provider on the metrics port shows the provider really used.
HEALTHCHECK --interval=15s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request as r; sys.exit(r.urlopen('http://127.0.0.1:8000/v2/health/ready', timeout=4).status != 200)"]
STOPSIGNAL SIGTERM
ENTRYPOINT ["modelsvc", "serve"]
CMD ["--model-repository=/models"]
