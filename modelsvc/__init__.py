"""modelsvc: a Triton-compatible model service (v2 protocol, model repository, dynamic batching)."""

__version__ = "0.1.0"

__all__ = ["__version__"]
