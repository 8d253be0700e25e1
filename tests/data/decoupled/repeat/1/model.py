"""N responses per request, as a decoupled model sends them (Triton's python backend API).

Inputs: N (how many responses; -1: none and no final flag, the sender dropped; -2: execute returns a list of
responses, which a decoupled model must not), DELAY_MS (optional: the pause before each response; with a pause
the responses go from a thread of the model's, after execute returned), ERROR_AT (optional: the response of that
index is an error). Outputs: OUT (the response's index) and BATCH (how many requests the execute call that got it had).
Request parameters: "record", a file the model appends to: "cancelled" when it sees is_cancelled(), and, with
"check_closed": true, the message of the exception that sending after the final flag raised.
"""

import json
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


def _scalar(request, name, default):
    tensor = pb_utils.get_input_tensor_by_name(request, name)
    return default if tensor is None else int(tensor.as_numpy().reshape(-1)[0])


class TritonPythonModel:
    def initialize(self, args):
        self.threads = []

    def execute(self, requests):
        if _scalar(requests[0], "N", 0) == -2:
            return [pb_utils.InferenceResponse([]) for _ in requests]  # what a decoupled model must not do
        for request in requests:
            if _scalar(request, "N", 0) == -1:
                request.get_response_sender()  # dropped without its final flag
                continue
            job = (
                request.get_response_sender(),
                _scalar(request, "N", 0),
                _scalar(request, "DELAY_MS", 0),
                _scalar(request, "ERROR_AT", -1),
                json.loads(request.parameters()),
                len(requests),
            )
            if job[2] > 0:
                thread = threading.Thread(target=self.respond, args=job, daemon=True)
                thread.start()
                self.threads.append(thread)
            else:
                self.respond(*job)
        self.threads = [t for t in self.threads if t.is_alive()]
        return None

    def respond(self, sender, n, delay_ms, error_at, params, batch):
        record = params.get("record")
        for i in range(n):
            if delay_ms:
                time.sleep(delay_ms / 1000)
            if sender.is_cancelled():
                if record:
                    with open(record, "a") as f:
                        f.write("cancelled\n")
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                return
            if i == error_at:
                response = pb_utils.InferenceResponse(
                    error=pb_utils.TritonError(f"error at response {i}", pb_utils.TritonError.INVALID_ARG)
                )
            else:
                response = pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUT", np.array([[i]], np.int32)),
                        pb_utils.Tensor("BATCH", np.array([[batch]], np.int32)),
                    ]
                )
            sender.send(response, flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL if i == n - 1 else 0)
        if n == 0:
            sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
        if params.get("check_closed") and record:
            try:
                sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
                message = "no exception"
            except Exception as exc:  # Triton raises its own exception type: its text is what the tests compare
                message = str(exc)
            with open(record, "a") as f:
                f.write(message + "\n")

    def finalize(self):
        for thread in self.threads:
            thread.join(5)
