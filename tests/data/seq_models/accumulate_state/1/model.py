"""Running sum of INPUT per sequence in the implicit state SUM_IN -> SUM_OUT (the sum starts at the initial
state, 100, read from initial_state/hundred.bin)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "INPUT").as_numpy()
            state = pb_utils.get_input_tensor_by_name(request, "SUM_IN").as_numpy()
            corrid = pb_utils.get_input_tensor_by_name(request, "CORRID").as_numpy()
            total = (state + value).astype(np.int32)
            responses.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUTPUT", total),
                        pb_utils.Tensor("SUM_OUT", total),
                        pb_utils.Tensor("CORRID_OUT", corrid.astype(np.uint64)),
                    ]
                )
            )
        return responses
