"""BLS to a decoupled model: each request calls repeat with its N and ERROR_AT, through exec(decoupled=True)
(async_exec(decoupled=True) when ASYNC is 1, exec() without it when ASYNC is 2), and answers with what came back:
OUT, one value per response (-1 for a response without outputs), and ERRORS, the messages of the responses that
had one."""

import numpy as np
import triton_python_backend_utils as pb_utils


def _scalar(request, name):
    return int(pb_utils.get_input_tensor_by_name(request, name).as_numpy().reshape(-1)[0])


class TritonPythonModel:
    async def execute(self, requests):
        answers = []
        for request in requests:
            call = pb_utils.InferenceRequest(
                model_name="repeat",
                requested_output_names=["OUT"],
                inputs=[
                    pb_utils.Tensor("N", np.array([[_scalar(request, "N")]], np.int32)),
                    pb_utils.Tensor("ERROR_AT", np.array([[_scalar(request, "ERROR_AT")]], np.int32)),
                ],
            )
            mode = _scalar(request, "ASYNC")
            if mode == 2:  # without decoupled=True: refused
                responses = [call.exec()]
            elif mode == 1:
                responses = await call.async_exec(decoupled=True)
            else:
                responses = call.exec(decoupled=True)
            values, errors = [], []
            for response in responses:
                if response.has_error():
                    errors.append(response.error().message().encode())
                    continue
                out = pb_utils.get_output_tensor_by_name(response, "OUT")
                values.append(-1 if out is None else int(out.as_numpy().reshape(-1)[0]))
            answers.append(
                pb_utils.InferenceResponse(
                    [
                        pb_utils.Tensor("OUT", np.array(values, np.int32)),
                        pb_utils.Tensor("ERRORS", np.array(errors, np.object_)),
                    ]
                )
            )
        return answers
