"""The ONNX Runtime backend (``backend: "onnxruntime"``, platform ``onnxruntime_onnx``).

``_onnxruntime`` (the backend, its ``parameters`` documented at the top), ``_onnxruntime_instance`` (one session
per instance), ``_onnxruntime_options`` (session and run options, execution providers) and ``_onnxruntime_gpu``
(the CUDA and TensorRT execution accelerators). Registered in :data:`modelsvc.backends.BACKENDS`.
"""
