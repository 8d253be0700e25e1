"""Each request of a sequence sends N responses, OUT counting on across the requests of its sequence (START: from 1)."""

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.total = {}

    def execute(self, requests):
        for request in requests:
            sender = request.get_response_sender()
            n = int(pb_utils.get_input_tensor_by_name(request, "N").as_numpy().reshape(-1)[0])
            start = int(pb_utils.get_input_tensor_by_name(request, "START").as_numpy().reshape(-1)[0])
            cid = request.correlation_id()
            if start:
                self.total[cid] = 0
            for i in range(n):
                self.total[cid] = self.total.get(cid, 0) + 1
                out = pb_utils.Tensor("OUT", np.array([[self.total[cid]]], np.int32))
                sender.send(
                    pb_utils.InferenceResponse([out]),
                    flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if i == n - 1 else 0,
                )
        return None
