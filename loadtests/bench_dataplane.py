"""CPU per request of modelsvc's own request path, with no sockets: decode, validate, queue, batch,
execute (identity), scatter, encode. The steadiest number on a shared machine; use it for before/after.

    python -m loadtests.bench_dataplane            # this checkout
    PYTHONPATH=/path/to/other/checkout python -m loadtests.bench_dataplane   # a baseline checkout

Prints CPU microseconds per request at concurrency 1 and 8 (best of 5 windows).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

import numpy as np

import modelsvc
from modelsvc.repository import ModelRepository
from modelsvc.server import DataPlane, InferEndpoint, ModelManager
from modelsvc.tools.onnx_models import identity, write_model

CONFIG = """name: "identity"
platform: "onnxruntime_onnx"
max_batch_size: 32
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
dynamic_batching { }
"""


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        write_model(Path(tmp), "identity", identity(), CONFIG)
        models = ModelManager(ModelRepository(Path(tmp)))
        await models.load_all()
        dataplane = DataPlane(models)
        dataplane.accepting = True
        endpoint = InferEndpoint(dataplane)
        head = json.dumps(
            {
                "inputs": [
                    {"name": "INPUT0", "shape": [1, 16], "datatype": "FP32", "parameters": {"binary_data_size": 64}}
                ],
                "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
            }
        ).encode()
        body = head + np.ones(16, np.float32).tobytes()
        headers = [(b"inference-header-content-length", str(len(head)).encode())]

        async def one() -> None:
            reply = await endpoint.handle("identity", None, headers, body)
            assert reply.status == 200, reply.body

        print(f"modelsvc from {Path(modelsvc.__file__).parent}")
        print(f"| {'concurrency':>11} | {'CPU us/request':>14} | {'requests/s (one core)':>21} |")
        print(f"|{'-' * 13}|{'-' * 16}|{'-' * 23}|")
        for conc in (1, 8):
            n = 16_000
            best = float("inf")
            for _ in range(5):
                c0 = time.process_time()
                for _ in range(n // conc):
                    await asyncio.gather(*(one() for _ in range(conc)))
                best = min(best, (time.process_time() - c0) / n)
            print(f"| {conc:>11} | {best * 1e6:14.1f} | {1 / best:21.0f} |")
        await models.close()


if __name__ == "__main__":
    import uvloop

    uvloop.run(main())
