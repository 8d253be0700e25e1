"""The repeat model with ``async def execute``: N responses per request, DELAY_MS apart (asyncio.sleep), so that
the instance takes the next request while this one waits; ERROR_AT as in repeat. Not batched."""

import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


def _scalar(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else int(tensor.as_numpy().reshape(-1)[0])


class TritonPythonModel:
    async def execute(self, requests):
        await asyncio.gather(*(self.respond(r, len(requests)) for r in requests))
        return None

    async def respond(self, request, batch):
        sender = request.get_response_sender()
        n, delay_ms, error_at = (
            _scalar(request, "N", 0),
            _scalar(request, "DELAY_MS", 0),
            _scalar(request, "ERROR_AT", -1),
        )
        for i in range(n):
            await asyncio.sleep(delay_ms / 1000)
            if request.is_cancelled():
                break
            if i == error_at:
                response = pb_utils.InferenceResponse(error=pb_utils.TritonError(f"error at response {i}"))
            else:
                response = pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUT", np.array([i], np.int32)),
                        pb_utils.Tensor("BATCH", np.array([batch], np.int32)),
                    ]
                )
            if i == n - 1:
                sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            sender.send(response)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
