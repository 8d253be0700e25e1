"""The python backend (``backend: "python"``): Triton's ``model.py`` models, run in the server's process.

``_python`` (the backend), ``_python_instance`` (one ``TritonPythonModel`` per instance) and ``_python_import``
(importing ``model.py``); the ``_pb_*`` modules implement ``triton_python_backend_utils``, whose one public face
stays :mod:`modelsvc.backends.python_utils` (the module python models import as ``pb_utils``). Registered in
:data:`modelsvc.backends.BACKENDS`.
"""
