"""Decoupled: N responses from a thread of their own, stopping when the stream is cancelled (and counting it)."""

import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _scalar(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else int(tensor.as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def initialize(self, args):
        self.cancelled = 0
        self.lock = threading.Lock()

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self._respond, args=(request,), daemon=True).start()
        return None

    def _respond(self, request):
        sender = request.get_response_sender()
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        n = _scalar(request, "N", 1)
        fail_at = _scalar(request, "FAIL_AT", -1)
        delay_s = _scalar(request, "DELAY_MS", 0) / 1000
        if n < 0:
            with self.lock:
                seen = self.cancelled
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([seen], np.int32))]), flags=final)
            return
        for i in range(n):
            if sender.is_cancelled():
                with self.lock:
                    self.cancelled += 1
                sender.send(flags=final)
                return
            if i == fail_at:
                error = pb_utils.TritonError(f"failed at response {i}")
                sender.send(pb_utils.InferenceResponse(error=error), flags=final)
                return
            sender.send(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.array([i], np.int32))]))
            if delay_s:
                time.sleep(delay_s)
        sender.send(flags=final)
