"""Echo IN, and report the request's correlation id (type:value), its sequence flags and the answering process."""

import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            cid = request.correlation_id()
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()),
                        pb_utils.Tensor("CORRID", np.array([f"{type(cid).__name__}:{cid}".encode()], dtype=object)),
                        pb_utils.Tensor("FLAGS", np.array([request.flags()], dtype=np.uint32)),
                        pb_utils.Tensor("PID", np.array([os.getpid()], dtype=np.int64)),
                    ]
                )
            )
        return responses
