"""Running sum of INPUT per sequence; the sums live in the model, keyed by the CORRID control (an integer or a
string); CORRID_OUT echoes the id as text and BATCH says how many requests the batch held."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.sums = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            value = int(pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy().reshape(-1)[0])
            start = int(pb_utils.get_input_tensor_by_name(request, "START").as_numpy().reshape(-1)[0])
            end = float(pb_utils.get_input_tensor_by_name(request, "END").as_numpy().reshape(-1)[0])
            ready = bool(pb_utils.get_input_tensor_by_name(request, "READY").as_numpy().reshape(-1)[0])
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy().reshape(-1)[0]
            corrid = corrid if isinstance(corrid, bytes) else str(int(corrid)).encode()
            if not ready:  # an empty slot of a direct batch: its answer goes nowhere
                total = 0
            else:
                total = (0 if start else self.sums.get(corrid, 0)) + value
                if end:
                    self.sums.pop(corrid, None)
                else:
                    self.sums[corrid] = total
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUTPUT", np.array([[total]], dtype=np.int32)),
                        pb_utils.Tensor("CORRID_OUT", np.array([[corrid]], dtype=np.object_)),
                        pb_utils.Tensor("BATCH", np.array([[len(requests)]], dtype=np.int32)),
                    ]
                )
            )
        return responses
