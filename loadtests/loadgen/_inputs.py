"""What to send: the target (v2 HTTP, v2 gRPC or a REST route) and the request payloads, built once.

For v2 targets the inputs come from the model's metadata and configuration (names, datatypes, shapes,
``max_batch_size``); the data is random, zeros, or read from perf_analyzer's ``--input-data`` JSON:
``{"data": [{"INPUT0": [1, 2, ...]}, {"INPUT0": {"content": [...], "shape": [4, 4]}}, {"X": {"b64": "..."}}]}``
where each entry is one batch-1 request (shapes without the batch dimension). For REST targets the file is a
JSON list of request bodies, ``{"data": [body, ...]}``, or one body (an object without "data").

HTTP payloads are complete HTTP/1.1 requests (head and body) so that sending one is a single write; v2 HTTP
uses the binary tensor extension both ways. gRPC payloads are ``ModelInferRequest`` messages with raw contents.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np

Array = np.ndarray[Any, Any]

#: length of the random strings sent to BYTES inputs
STRING_LENGTH = 16


class LoadgenError(Exception):
    """A problem with the target or the inputs, explained for the command line."""


@dataclass(frozen=True)
class Target:
    """Where the load goes.

    ``url`` is ``http://host:port`` (v2 HTTP), ``grpc://host:port`` (v2 gRPC) or, with ``rest``, the full URL of a
    REST route. ``stats_url`` is the HTTP base URL of a modelsvc/Triton whose statistics for ``model`` are read
    around each window; it defaults to the target itself for v2 HTTP (gRPC reads them over gRPC).
    """

    url: str
    model: str = ""
    model_version: str = ""
    rest: bool = False
    stats_url: str = ""

    @property
    def protocol(self) -> str:
        """``http``, ``grpc`` or ``rest``."""
        if self.rest:
            return "rest"
        return "grpc" if urlsplit(self.url).scheme == "grpc" else "http"

    @property
    def host_port(self) -> tuple[str, int]:
        parts = urlsplit(self.url)
        if parts.hostname is None:
            raise LoadgenError(f"no host in --url {self.url!r}")
        default = {"http": 80, "https": 443, "grpc": 8001}.get(parts.scheme, 80)
        return parts.hostname, parts.port or default

    @property
    def model_path(self) -> str:
        """``/v2/models/{model}`` or ``/v2/models/{model}/versions/{version}``."""
        path = f"/v2/models/{self.model}"
        return f"{path}/versions/{self.model_version}" if self.model_version else path

    def check(self) -> None:
        scheme = urlsplit(self.url).scheme
        if scheme not in ("http", "grpc"):
            raise LoadgenError(f"--url must start with http:// or grpc://, not {self.url!r}")
        if self.rest and scheme != "http":
            raise LoadgenError("--rest targets are http:// URLs of a route")
        if not self.rest and not self.model:
            raise LoadgenError("--model is required for v2 targets (or give --rest for a REST route)")


@dataclass(frozen=True)
class InputSpec:
    """How to fill the requests: ``data`` is ``random``, ``zero`` (or ``zeros``) or a JSON file's path;
    ``shapes`` gives the dims (without the batch dimension) of inputs whose metadata has ``-1``."""

    data: str = "random"
    shapes: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    batch_size: int = 1
    seed: int = 0


@dataclass(frozen=True)
class Payloads:
    """Requests ready to send, cycled through in order; ``items`` are bytes (HTTP) or ModelInferRequest (gRPC)."""

    items: Sequence[Any]
    batch_size: int = 1
    description: str = ""


def parse_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """``NAME:d1,d2`` (perf_analyzer's ``--shape``) into (name, dims)."""
    name, sep, dims = text.rpartition(":")
    if not sep or not name:
        raise LoadgenError(f"--shape wants NAME:d1,d2, not {text!r}")
    try:
        return name, tuple(int(d) for d in dims.split(","))
    except ValueError:
        raise LoadgenError(f"--shape wants integer dims, not {text!r}") from None


# ---------------------------------------------------------------------------------------------------------
# v2 inputs


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    dims: tuple[int, ...]  # without the batch dimension; -1 where the model takes any size


def _json(url: str) -> Any:
    import httpx

    try:
        response = httpx.get(url, timeout=10.0)
    except httpx.HTTPError as exc:
        raise LoadgenError(f"GET {url} failed: {exc}") from exc
    if response.status_code != 200:
        raise LoadgenError(f"GET {url} answered {response.status_code}: {response.text[:200]}")
    return response.json()


def model_inputs(target: Target) -> tuple[list[TensorSpec], list[str], int]:
    """(inputs, output names, max_batch_size) from the model's metadata and configuration."""
    if target.protocol == "grpc":
        import grpc
        from google.protobuf import json_format
        from tritonclient.grpc import service_pb2, service_pb2_grpc

        host, port = target.host_port
        with grpc.insecure_channel(f"{host}:{port}") as channel:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
            try:
                meta_msg = stub.ModelMetadata(
                    service_pb2.ModelMetadataRequest(name=target.model, version=target.model_version), timeout=10
                )
                config_msg = stub.ModelConfig(
                    service_pb2.ModelConfigRequest(name=target.model, version=target.model_version), timeout=10
                )
            except grpc.RpcError as exc:
                raise LoadgenError(f"model metadata over gRPC failed: {exc.code().name} {exc.details()}") from exc
        meta = json_format.MessageToDict(meta_msg, preserving_proto_field_name=True)
        config = json_format.MessageToDict(config_msg, preserving_proto_field_name=True).get("config", {})
    else:
        base = target.url.rstrip("/")
        meta = _json(f"{base}{target.model_path}")
        config = _json(f"{base}{target.model_path}/config")
    max_batch = int(config.get("max_batch_size", 0))
    inputs = []
    for item in meta.get("inputs", []):
        shape = tuple(int(d) for d in item.get("shape", []))
        inputs.append(TensorSpec(item["name"], item["datatype"], shape[1:] if max_batch > 0 else shape))
    outputs = [item["name"] for item in meta.get("outputs", [])]
    return inputs, outputs, max_batch


def _np_dtype(datatype: str) -> Any:
    if datatype == "BYTES":
        return np.object_
    if datatype == "BF16":
        raise LoadgenError("BF16 inputs are not supported by the load generator")
    from tritonclient.utils import triton_to_np_dtype

    return triton_to_np_dtype(datatype)


def _resolve_dims(spec: TensorSpec, shapes: Mapping[str, tuple[int, ...]]) -> tuple[int, ...]:
    if spec.name in shapes:
        given = shapes[spec.name]
        if len(given) != len(spec.dims) or any(d not in (-1, g) for d, g in zip(spec.dims, given, strict=True)):
            raise LoadgenError(f"--shape {spec.name}:{given} does not fit the model's dims {list(spec.dims)}")
        return given
    if any(d < 0 for d in spec.dims):
        raise LoadgenError(f"input {spec.name} has dims {list(spec.dims)}: give --shape {spec.name}:d1,d2,...")
    return spec.dims


def _synthetic(spec: TensorSpec, dims: tuple[int, ...], mode: str, rng: np.random.Generator) -> Array:
    dtype = _np_dtype(spec.datatype)
    if spec.datatype == "BYTES":
        size = int(np.prod(dims, dtype=np.int64))
        if mode == "zero":
            strings = [b"0" * STRING_LENGTH] * size
        else:
            strings = [rng.bytes(STRING_LENGTH).hex()[:STRING_LENGTH].encode() for _ in range(size)]
        return np.array(strings, dtype=np.object_).reshape(dims)
    if mode == "zero":
        return np.zeros(dims, dtype=dtype)
    if np.issubdtype(dtype, np.floating):
        return rng.random(dims).astype(dtype)
    if dtype == np.bool_:
        return rng.integers(0, 2, dims).astype(np.bool_)
    return rng.integers(0, 100, dims).astype(dtype)  # small values: valid ids for most embedding tables


def _from_entry(spec: TensorSpec, value: Any, default_dims: tuple[int, ...] | None) -> Array:
    dtype = _np_dtype(spec.datatype)
    shape: Sequence[int] | None = default_dims
    if isinstance(value, dict):
        shape = value.get("shape", shape)
        if "b64" in value:
            raw = base64.b64decode(value["b64"])
            if spec.datatype == "BYTES":
                raise LoadgenError(f"input {spec.name}: b64 data for BYTES inputs is not supported, give content")
            arr = np.frombuffer(raw, dtype=dtype)
            return arr.reshape(shape) if shape is not None else arr
        value = value.get("content")
    if spec.datatype == "BYTES":
        arr = np.array([str(v).encode() if not isinstance(v, bytes) else v for v in np.ravel(value)], dtype=np.object_)
    else:
        arr = np.asarray(value, dtype=dtype)
    if shape is not None:
        arr = arr.reshape(shape)
    elif arr.ndim == 0:
        arr = arr.reshape(1)
    return arr


def _file_entries(path: Path, single_body: bool = False) -> list[Any]:
    """The entries of an input file; with ``single_body`` (REST) an object without "data" is one body."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise LoadgenError(f"--input-data {path}: {exc}") from exc
    if single_body and isinstance(doc, dict) and "data" not in doc:
        return [doc]
    entries = doc.get("data") if isinstance(doc, dict) else doc
    if not isinstance(entries, list) or not entries:
        raise LoadgenError(f"--input-data {path}: want a non-empty list, or {{'data': [...]}}")
    return entries


def v2_tensors(specs: Sequence[TensorSpec], max_batch: int, inputs: InputSpec) -> tuple[list[dict[str, Array]], str]:
    """The tensors of each request (batch dimension included when the model batches) and a description."""
    if inputs.batch_size > 1 and max_batch == 0:
        raise LoadgenError("--batch-size > 1 needs a model with max_batch_size > 0")
    if max_batch and inputs.batch_size > max_batch:
        raise LoadgenError(f"--batch-size {inputs.batch_size} exceeds the model's max_batch_size {max_batch}")
    mode = "zero" if inputs.data in ("zero", "zeros") else inputs.data
    per_sample: list[dict[str, Array]]
    if mode in ("random", "zero"):
        rng = np.random.default_rng(inputs.seed)
        per_sample = [{s.name: _synthetic(s, _resolve_dims(s, inputs.shapes), mode, rng) for s in specs}]
        described = f"{mode} data"
    else:
        entries = _file_entries(Path(mode))
        per_sample = []
        for i, entry in enumerate(entries):
            if not isinstance(entry, dict):
                raise LoadgenError(f"--input-data {mode}: entry {i} is not an object of inputs")
            sample = {}
            for s in specs:
                if s.name not in entry:
                    raise LoadgenError(f"--input-data {mode}: entry {i} lacks input {s.name}")
                default = _resolve_dims(s, inputs.shapes) if s.name in inputs.shapes or -1 not in s.dims else None
                try:
                    sample[s.name] = _from_entry(s, entry[s.name], default)
                except (ValueError, TypeError) as exc:  # a reshape to the wrong size, ragged lists, bad base64
                    want = f" (want shape {list(default)})" if default is not None else ""
                    raise LoadgenError(f"--input-data {mode}: entry {i}, input {s.name}: {exc}{want}") from None
            per_sample.append(sample)
        described = f"{len(per_sample)} entries of {mode}"
    requests = []
    for start in range(len(per_sample)):
        if max_batch:
            indices = [(start + k) % len(per_sample) for k in range(inputs.batch_size)]
            requests.append({s.name: _batch(s.name, [per_sample[k][s.name] for k in indices], indices, inputs, mode)
                             for s in specs})  # fmt: skip
        else:
            requests.append(per_sample[start])
    return requests, described


def _batch(name: str, arrays: Sequence[Array], indices: Sequence[int], inputs: InputSpec, source: str) -> Array:
    """The batch of one input: the samples stacked (they must all have the same shape)."""
    try:
        return np.stack(arrays)
    except ValueError:
        shapes = ", ".join(f"entry {i} {list(a.shape)}" for i, a in zip(indices, arrays, strict=True))
        raise LoadgenError(
            f"--input-data {source}: input {name} has different shapes in the entries batched together "
            f"({shapes}); with --batch-size {inputs.batch_size} every entry must have the same shape"
        ) from None


def _raw(arr: Array, datatype: str) -> bytes:
    if datatype == "BYTES":
        from tritonclient.utils import serialize_byte_tensor

        return bytes(serialize_byte_tensor(arr).tobytes())
    return np.ascontiguousarray(arr).tobytes()


def http_request(method: str, host: str, port: int, path: str, body: bytes, headers: Mapping[str, str]) -> bytes:
    """One complete HTTP/1.1 keep-alive request."""
    lines = [f"{method} {path} HTTP/1.1", f"Host: {host}:{port}", f"Content-Length: {len(body)}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body


def encode_v2_http(
    target: Target, tensors: Mapping[str, Array], specs: Sequence[TensorSpec], outputs: Sequence[str]
) -> bytes:
    """A v2 infer request with binary tensors (inputs and outputs), as a complete HTTP request."""
    by_name = {s.name: s for s in specs}
    raws = {name: _raw(arr, by_name[name].datatype) for name, arr in tensors.items()}
    header = {
        "inputs": [
            {
                "name": name,
                "shape": list(arr.shape),
                "datatype": by_name[name].datatype,
                "parameters": {"binary_data_size": len(raws[name])},
            }
            for name, arr in tensors.items()
        ],
        "outputs": [{"name": o, "parameters": {"binary_data": True}} for o in outputs],
    }
    head = json.dumps(header, separators=(",", ":")).encode()
    host, port = target.host_port
    headers = {"Content-Type": "application/octet-stream", "Inference-Header-Content-Length": str(len(head))}
    return http_request("POST", host, port, f"{target.model_path}/infer", head + b"".join(raws.values()), headers)


def encode_v2_grpc(target: Target, tensors: Mapping[str, Array], specs: Sequence[TensorSpec]) -> Any:
    from tritonclient.grpc import service_pb2

    by_name = {s.name: s for s in specs}
    request = service_pb2.ModelInferRequest(model_name=target.model, model_version=target.model_version)
    for name, arr in tensors.items():
        tensor = request.inputs.add()
        tensor.name = name
        tensor.datatype = by_name[name].datatype
        tensor.shape.extend(arr.shape)
        request.raw_input_contents.append(_raw(arr, by_name[name].datatype))
    return request


def prepare(target: Target, inputs: InputSpec | None = None) -> Payloads:
    """Build the payloads for ``target`` (reads the model's metadata for v2 targets)."""
    inputs = inputs or InputSpec()
    target.check()
    if target.rest:
        if inputs.data in ("random", "zero", "zeros"):
            raise LoadgenError("REST targets need --input-data FILE.json (a list of request bodies)")
        parts = urlsplit(target.url)
        path = parts.path or "/"
        if parts.query:
            path += f"?{parts.query}"
        host, port = target.host_port
        bodies = [json.dumps(b).encode() for b in _file_entries(Path(inputs.data), single_body=True)]
        items = [http_request("POST", host, port, path, b, {"Content-Type": "application/json"}) for b in bodies]
        return Payloads(items, 1, f"{len(items)} bodies of {inputs.data}")
    specs, outputs, max_batch = model_inputs(target)
    requests, described = v2_tensors(specs, max_batch, inputs)
    if target.protocol == "grpc":
        items = [encode_v2_grpc(target, r, specs) for r in requests]
    else:
        items = [encode_v2_http(target, r, specs, outputs) for r in requests]
    shapes = ", ".join(
        f"{n} {list(a.shape)} {s.datatype}" for s in specs for n, a in requests[0].items() if n == s.name
    )
    return Payloads(items, inputs.batch_size if max_batch else 1, f"{described}: {shapes}")
