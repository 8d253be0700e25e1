# syntax=docker/dockerfile:1
#
# A model repository shipped as an image: the Helm chart's `modelRepository.source: image` copies
# /models out of it (an init container runs `cp`) into the model pod, for modelsvc or Triton alike.
# Versioned and pulled like code; no bucket, no volume to provision.
#
# Build from the repository root, after `python -m services.build` wrote the ONNX files:
#
#   python -m services.build
#   docker build -f docker/model-repository.Dockerfile \
#       --build-arg MODEL_REPOSITORY=services/doc_classifier/model_repository -t doc-classifier-models:0.1.0 .

# A small image with a shell and cp for the chart's init container.
ARG BASE_IMAGE=busybox:1.36.1

FROM ${BASE_IMAGE}
LABEL org.opencontainers.image.title="model-repository" \
      org.opencontainers.image.description="A Triton model repository in /models, for modelsvc or Triton"
# The model repository folder to ship, relative to the repository root (config.pbtxt and version folders).
ARG MODEL_REPOSITORY=services/doc_classifier/model_repository
# The numeric user that reads the files (the chart's init container runs as a non-root user too).
ARG UID=10001
COPY ${MODEL_REPOSITORY} /models
USER ${UID}:${UID}
# Nothing to serve: the image is data. Its only process is the chart's copy, which ends on its own.
HEALTHCHECK NONE
CMD ["ls", "-lR", "/models"]
