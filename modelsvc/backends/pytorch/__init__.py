"""The PyTorch backend (``backend: "pytorch"``, platform ``pytorch_libtorch``) for TorchScript models.

``_pytorch`` (the backend), ``_pytorch_instance`` (one module on one device per instance) and ``_pytorch_spec``
(what is decided without torch: parameters, tensor naming, datatypes). Registered in
:data:`modelsvc.backends.BACKENDS`.
"""
