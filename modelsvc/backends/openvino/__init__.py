"""The OpenVINO backend (``backend: "openvino"``), which also runs the ONNX models whose config asks for the
``openvino`` CPU execution accelerator.

``_openvino`` (the backend, its ``parameters`` documented at the top), ``_openvino_model`` (reading, reshaping and
checking a model), ``_openvino_instance`` (one InferRequest per instance) and ``_openvino_options`` (the
parameters, without OpenVINO). Registered in :data:`modelsvc.backends.BACKENDS`.
"""
