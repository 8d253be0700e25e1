"""One variant's runtime in a process of its own, for bench_backends' in-process rows:
``python -m loadtests.backends._worker RUNTIME MODEL_FILE [KEY=VALUE ...]``.

The runtime is called directly, as a user of the library would call it: an ONNX Runtime ``InferenceSession``, an
OpenVINO compiled model's infer request, a TorchScript module under ``torch.inference_mode()``. Each variant runs
in its own process so that the runtimes never share a process (their thread pools would compete, and torch's
OpenMP threads spin after a call) and so that the benchmark process itself imports none of them.

The worker answers JSON lines on stdin with JSON lines on stdout:

``{"op": "info"}``                                what runs: providers, OpenVINO's read-back inference precision, dtype
``{"op": "cell", "batch": B, "tokens": S, "max_calls": N, "max_s": T, "warm": W}``
                                                  W untimed calls, then time-boxed calls of batch B x S tokens:
                                                  ``calls``, ``seconds``
``{"op": "embed", "input_ids": [[...]], "attention_mask": [[...]]}``
                                                  ``sentence_embedding`` of a padded batch (for the parity check)

KEY=VALUE are the runtime's options from the variant's config.pbtxt ``parameters`` (OpenVINO:
INFERENCE_PRECISION_HINT or HINT_BF16, PERFORMANCE_HINT, NUM_STREAMS, INFERENCE_NUM_THREADS) and ``outputs=a,b`` (the
config's output names in order, how a TorchScript module's tuple is read).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

Arrays = dict[str, np.ndarray[Any, Any]]
Loaded = tuple[dict[str, Any], Callable[[Arrays], Any], dict[str, Any]]
"""input name -> NumPy dtype, the call, what runs"""
OUTPUT = "sentence_embedding"
OPENVINO_KEYS = ("INFERENCE_PRECISION_HINT", "PERFORMANCE_HINT", "NUM_STREAMS", "INFERENCE_NUM_THREADS")


def _onnxruntime(path: str, params: dict[str, str]) -> Loaded:
    import onnxruntime as ort

    options = ort.SessionOptions()
    # as modelsvc's ONNX Runtime backend does by default: idle threads sleep (this worker shares 2 cores with
    # the servers and the other workers)
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    names = {i.name: np.int32 if i.type == "tensor(int32)" else np.int64 for i in session.get_inputs()}
    outputs = [o.name for o in session.get_outputs()]
    if OUTPUT not in outputs:
        raise SystemExit(f"{path}: no output {OUTPUT!r} (outputs: {outputs})")

    def run(feed: Arrays) -> Any:
        return session.run([OUTPUT], feed)[0]

    return names, run, {"runtime": f"onnxruntime {ort.__version__}", "providers": session.get_providers()}


def _openvino(path: str, params: dict[str, str]) -> Loaded:
    import openvino as ov

    core = ov.Core()
    config = {k: params[k].upper() for k in OPENVINO_KEYS if k in params}
    if params.get("HINT_BF16", "").upper() == "YES":  # Triton's key for the same
        config["INFERENCE_PRECISION_HINT"] = "bf16"
    if "INFERENCE_PRECISION_HINT" in config:
        config["INFERENCE_PRECISION_HINT"] = config["INFERENCE_PRECISION_HINT"].lower()
    config.setdefault("PERFORMANCE_HINT", "LATENCY")  # one synchronous request at a time, all cores on it
    compiled = core.compile_model(path, "CPU", config)
    request = compiled.create_infer_request()
    names = {p.get_any_name(): np.int32 if p.get_element_type() == ov.Type.i32 else np.int64 for p in compiled.inputs}
    out_port = next((p for p in compiled.outputs if OUTPUT in p.get_names()), None)
    if out_port is None:
        raise SystemExit(f"{path}: no output {OUTPUT!r}")
    ran = compiled.get_property("INFERENCE_PRECISION_HINT").get_type_name()  # what runs, e.g. f32 for bf16 asked

    def run(feed: Arrays) -> Any:
        result = request.infer(feed)
        return np.asarray(result[out_port], dtype=np.float32)

    info = {"runtime": f"openvino {ov.get_version()}", "asked": config, "inference_precision": ran}
    return names, run, info


def _pytorch(path: str, params: dict[str, str]) -> Loaded:
    # as modelsvc's PyTorch backend starts it: OpenMP threads that wait passively (spinning ones took 2-5x longer per
    # call here whenever anything else ran on the 2 cores)
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    import torch

    module = torch.jit.load(path, map_location="cpu")  # type: ignore[no-untyped-call]
    module.eval()
    args = [a.name for a in module.forward.schema.arguments][1:]  # minus self
    outputs = [o for o in params.get("outputs", "").split(",") if o]

    def pick(result: Any) -> Any:
        if isinstance(result, dict):
            return result[OUTPUT]
        if isinstance(result, (tuple, list)):
            # Triton's rule: outputs named <name>__<i> index the tuple, else config order
            for i, name in enumerate(outputs):
                if name == OUTPUT or name.startswith(f"{OUTPUT}__"):
                    index = int(name.rsplit("__", 1)[1]) if "__" in name else i
                    return result[index]
            return result[-1]
        return result

    def run(feed: Arrays) -> Any:
        with torch.inference_mode():
            tensors = [torch.from_numpy(feed[name]) for name in args]
            return pick(module(*tensors)).float().numpy()

    dtypes = sorted({str(p.dtype) for p in module.parameters()})
    info = {"runtime": f"torch {torch.__version__}", "threads": torch.get_num_threads(), "weights": dtypes}
    return dict.fromkeys(args, np.int64), run, info


RUNTIMES = {"onnxruntime": _onnxruntime, "openvino": _openvino, "pytorch": _pytorch}


def token_batch(batch: int, tokens: int, seed: int = 0) -> Arrays:
    """A batch of ``batch`` rows of ``tokens`` tokens ([CLS] words [SEP]), no padding: what each cell runs."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1000, 29000, size=(batch, tokens), dtype=np.int64)
    ids[:, 0], ids[:, -1] = 101, 102
    return {
        "input_ids": ids,
        "attention_mask": np.ones((batch, tokens), dtype=np.int64),
        "token_type_ids": np.zeros((batch, tokens), dtype=np.int64),
    }


def _feed(inputs: dict[str, Any], arrays: Arrays) -> Arrays:
    """The model's inputs by name, in its integer type; an input named ``<name>__<i>`` gets ``<name>``."""
    return {n: arrays[n.split("__")[0]].astype(dtype, copy=False) for n, dtype in inputs.items()}


def serve(runtime: str, path: str, params: dict[str, str]) -> None:
    inputs, run, info = RUNTIMES[runtime](path, params)
    names = list(inputs)
    print(json.dumps({"ready": True, "inputs": names, **info}), flush=True)
    for line in sys.stdin:
        command = json.loads(line)
        op = command["op"]
        if op == "info":
            answer: dict[str, Any] = {"inputs": names, **info}
        elif op == "cell":
            feed = _feed(inputs, token_batch(int(command["batch"]), int(command["tokens"])))
            for _ in range(int(command.get("warm", 0))):
                run(feed)
            calls, started = 0, time.perf_counter()
            while True:
                run(feed)
                calls += 1
                elapsed = time.perf_counter() - started
                if calls >= int(command["max_calls"]) or elapsed >= float(command["max_s"]):
                    break
            answer = {"calls": calls, "seconds": elapsed}
        elif op == "embed":
            ids = np.asarray(command["input_ids"], dtype=np.int64)
            mask = np.asarray(command["attention_mask"], dtype=np.int64)
            arrays = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            answer = {"embedding": np.asarray(run(_feed(inputs, arrays)), dtype=np.float64).tolist()}
        else:
            answer = {"error": f"unknown op {op!r}"}
        print(json.dumps(answer), flush=True)


def main(argv: list[str]) -> int:
    if len(argv) < 2 or argv[0] not in RUNTIMES:
        print(f"usage: python -m loadtests.backends._worker {{{','.join(RUNTIMES)}}} MODEL_FILE [KEY=VALUE ...]",
              file=sys.stderr)  # fmt: skip
        return 2
    params = dict(a.split("=", 1) for a in argv[2:])
    serve(argv[0], argv[1], params)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
