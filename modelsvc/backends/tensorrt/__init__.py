"""The TensorRT backend (``backend: "tensorrt"``, platform ``tensorrt_plan``): plans on GPUs.

``_tensorrt`` (the backend and its instances), ``_tensorrt_engine`` (``PlanEngine``: the only TensorRT and CUDA
code, imported alone by ``modelsvc compare`` and loadtests/gpu/plan_engine_cuda.py), ``_tensorrt_spec`` (what is
decided without TensorRT) and ``_tensorrt_logger`` (the process's one TensorRT logger, shared with
``modelsvc build``). Registered in :data:`modelsvc.backends.BACKENDS`.
"""
