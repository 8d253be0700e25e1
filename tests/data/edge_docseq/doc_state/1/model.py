"""Per sequence: windows seen, tokens seen (attention mask), sum of token ids; reset at START, dropped at END."""

import numpy as np
import triton_python_backend_utils as pb_utils


def _first(request, name):
    return pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0]


class TritonPythonModel:
    def initialize(self, args):
        self.totals = {}

    def execute(self, requests):
        responses = []
        for request in requests:
            ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
            mask = pb_utils.get_input_tensor_by_name(request, "attention_mask").as_numpy()
            corrid = int(_first(request, "CORRID"))
            windows, tokens, id_sum = (0, 0, 0) if _first(request, "START") else self.totals.get(corrid, (0, 0, 0))
            total = (windows + 1, tokens + int(mask.sum()), id_sum + int(ids.sum()))
            if _first(request, "END"):
                self.totals.pop(corrid, None)
            else:
                self.totals[corrid] = total
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("TOTAL", np.array([total], np.int64))]))
        return responses
