"""Triton python models for the python backend's tests (tests/backends/test_python_backend*.py,
test_backend_contract.py): model.py texts and their configs, and ``write_python_model``, which puts one in a model
repository.

The model.py texts are written as Triton's documentation writes them; they would run unchanged on Triton's
python backend.
"""

from __future__ import annotations

from pathlib import Path

# --- models, as a Triton user writes them ---------------------------------------------------------------

ADD_SUB_PY = """\
import json

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            out_0, out_1 = (
                in_0.as_numpy() + in_1.as_numpy(),
                in_0.as_numpy() - in_1.as_numpy(),
            )
            out_tensor_0 = pb_utils.Tensor("OUTPUT0", out_0.astype(self.output0_dtype))
            out_tensor_1 = pb_utils.Tensor("OUTPUT1", out_1.astype(self.output1_dtype))
            inference_response = pb_utils.InferenceResponse(output_tensors=[out_tensor_0, out_tensor_1])
            responses.append(inference_response)
        return responses

    def finalize(self):
        print("Cleaning up...")
"""

ADD_SUB_CONFIG = """name: "{name}"
backend: "{backend}"
max_batch_size: 8
input [
  {{ name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
  {{ name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }}
]
output [
  {{ name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }},
  {{ name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] }}
]
"""

PREPROCESS_PY = """\
import json

import numpy as np
import triton_python_backend_utils as pb_utils
from transformers import AutoTokenizer, TensorType


class TritonPythonModel:
    def initialize(self, args):
        model_config = json.loads(args["model_config"])
        path = model_config["parameters"]["tokenizer_path"]["string_value"]
        self.tokenizer = AutoTokenizer.from_pretrained(path)

    def execute(self, requests):
        responses = []
        for request in requests:
            query = [
                t[0].decode("UTF-8")
                for t in pb_utils.get_input_tensor_by_name(request, "QUERY").as_numpy().tolist()
            ]
            tokens = self.tokenizer(text=query, padding=True, return_tensors=TensorType.NUMPY)
            outputs = [
                pb_utils.Tensor("input_ids", tokens["input_ids"].astype(np.int64)),
                pb_utils.Tensor("attention_mask", tokens["attention_mask"].astype(np.int64)),
            ]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
"""

PREPROCESS_CONFIG = """name: "preprocess"
backend: "python"
max_batch_size: 8
input [ { name: "QUERY" data_type: TYPE_STRING dims: [ 1 ] } ]
output [
  { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] },
  { name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }
]
parameters { key: "tokenizer_path" value { string_value: "%s" } }
instance_group [ { kind: KIND_CPU count: 1 } ]
"""

BLS_PY = """\
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            model_name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0][0].decode()
            infer_request = pb_utils.InferenceRequest(
                model_name=model_name,
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[
                    pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                    pb_utils.get_input_tensor_by_name(request, "INPUT1"),
                ],
            )
            infer_response = infer_request.exec()
            if infer_response.has_error():
                error = infer_response.error()
                responses.append(
                    pb_utils.InferenceResponse(
                        error=pb_utils.TritonError("BLS failed: " + error.message(), error.code())
                    )
                )
                continue
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.get_output_tensor_by_name(infer_response, "OUTPUT0"),
                        pb_utils.get_output_tensor_by_name(infer_response, "OUTPUT1"),
                    ]
                )
            )
        return responses
"""

BLS_CONFIG = """name: "bls"
backend: "python"
max_batch_size: 8
input [
  { name: "MODEL_NAME" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] }
]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
"""

BLS_ASYNC_PY = """\
import asyncio

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            inputs = [
                pb_utils.get_input_tensor_by_name(request, "INPUT0"),
                pb_utils.get_input_tensor_by_name(request, "INPUT1"),
            ]
            infer_response_awaits = []
            for model_name in ("add_sub", "add_sub_py", "no_such_model"):
                inference_request = pb_utils.InferenceRequest(
                    model_name=model_name, requested_output_names=["OUTPUT0", "OUTPUT1"], inputs=inputs
                )
                infer_response_awaits.append(inference_request.async_exec())
            onnx, python, missing = await asyncio.gather(*infer_response_awaits)
            if onnx.has_error() or python.has_error() or not missing.has_error():
                raise pb_utils.TritonModelException("unexpected BLS results")
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.get_output_tensor_by_name(onnx, "OUTPUT0"),
                        pb_utils.get_output_tensor_by_name(python, "OUTPUT1"),
                        pb_utils.Tensor("ERROR", np.array([[missing.error().message()]], dtype=np.object_)),
                    ]
                )
            )
        return responses
"""

BLS_ASYNC_CONFIG = """name: "bls_async"
backend: "python"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [
  { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "OUTPUT1" data_type: TYPE_FP32 dims: [ 16 ] },
  { name: "ERROR" data_type: TYPE_STRING dims: [ 1 ] }
]
"""

COUNTER_PY = '''\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    """Answers each request with its own input, the number of requests execute() received with it,
    its request id and its parameters; a negative input fails that request alone."""

    def execute(self, requests):
        responses = []
        for request in requests:
            value = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            if (value < 0).any():
                error = pb_utils.TritonError("negative input", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse(error=error))
                continue
            batch = value.shape[0]
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[
                        pb_utils.Tensor("OUT", value),
                        pb_utils.Tensor("COUNT", np.full((batch, 1), len(requests), dtype=np.int32)),
                        pb_utils.Tensor("REQUEST_ID", np.array([[request.request_id()]] * batch, dtype=np.object_)),
                        pb_utils.Tensor("PARAMETERS", np.array([[request.parameters()]] * batch, dtype=np.object_)),
                    ]
                )
            )
        return responses
'''

COUNTER_CONFIG = """name: "counter"
backend: "python"
max_batch_size: 8
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [
  { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "COUNT" data_type: TYPE_INT32 dims: [ 1 ] },
  { name: "REQUEST_ID" data_type: TYPE_STRING dims: [ 1 ] },
  { name: "PARAMETERS" data_type: TYPE_STRING dims: [ 1 ] }
]
dynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 30000000 }
"""

AUTO_PY = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        inputs = [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]}]
        outputs = [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]}]
        config = auto_complete_model_config.as_dict()
        input_names = [input["name"] for input in config["input"]]
        output_names = [output["name"] for output in config["output"]]
        for input in inputs:
            if input["name"] not in input_names:
                auto_complete_model_config.add_input(input)
        for output in outputs:
            if output["name"] not in output_names:
                auto_complete_model_config.add_output(output)
        auto_complete_model_config.set_max_batch_size(4)
        auto_complete_model_config.set_dynamic_batching()
        return auto_complete_model_config

    def execute(self, requests):
        return [
            pb_utils.InferenceResponse(
                [pb_utils.Tensor("OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * 2)]
            )
            for r in requests
        ]
"""

FAULTS_PY = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        mode = int(pb_utils.get_input_tensor_by_name(requests[0], "MODE").as_numpy()[0])
        good = np.zeros((1, 2), dtype=np.float32)
        if mode == 0:
            return [pb_utils.InferenceResponse([]) for _ in requests]
        if mode == 1:
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", good.astype(np.float64))]) for _ in requests]
        if mode == 2:
            return [pb_utils.InferenceResponse([pb_utils.Tensor("EXTRA", good)]) for _ in requests]
        if mode == 3:
            raise ValueError("secret detail")
        if mode == 4:
            raise pb_utils.TritonModelException("the model refuses")
        if mode == 5:
            return []
        if mode == 6:
            wrong = np.zeros((1, 3), np.float32)
            return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", wrong)]) for _ in requests]
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", good)]) for _ in requests]
"""

FAULTS_CONFIG = """name: "faults"
backend: "python"
max_batch_size: 0
input [ { name: "MODE" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_FP32 dims: [ 1, 2 ] } ]
"""

HELPER_PY = """\
import triton_python_backend_utils as pb_utils
import numpy as np

from .helpers import WHO


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse([pb_utils.Tensor("WHO", np.array([WHO], dtype=np.object_))])
                for _ in requests]
"""

HELPER_CONFIG = """name: "{name}"
backend: "python"
input [ {{ name: "IN" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "WHO" data_type: TYPE_STRING dims: [ 1 ] }} ]
"""


def write_python_model(repo: Path, name: str, model_py: str, config: str | None, **files: str) -> Path:
    version = repo / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    (version / "model.py").write_text(model_py)
    for filename, text in files.items():
        (version / filename).write_text(text)
    if config is not None:
        (repo / name / "config.pbtxt").write_text(config)
    return repo / name
