"""The runners: one protocol over an ONNX file (ONNX Runtime, CPU), a TensorRT plan and a served model.

``open_runner(source)`` picks one: ``http://``, ``https://`` or ``grpc://`` URLs of the form
``SCHEME://HOST:PORT/v2/models/NAME[/versions/V]`` are served models; files ending in ``.onnx`` run in ONNX
Runtime; ``.plan`` and ``.engine`` files are TensorRT plans (``PlanRunner``, needs ``modelsvc[tensorrt]`` and a GPU).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from ...protocol import CONFIG_TO_WIRE, ONNX_TO_CONFIG
from ._errors import RunnerFailed, SourceError
from ._types import Array, Runner, TensorDecl

__all__ = ["OnnxRunner", "ServedRunner", "open_runner", "parse_model_url"]

ONNX_SUFFIXES = (".onnx",)
PLAN_SUFFIXES = (".plan", ".engine")
URL_SCHEMES = ("http", "https", "grpc")


class OnnxRunner:
    """An ONNX file in ONNX Runtime on the CPU execution provider."""

    def __init__(self, path: str | Path) -> None:
        import onnxruntime as ort

        self.source = str(path)
        file = Path(path)
        if not file.is_file():
            raise SourceError(f"{self.source}: no such file")
        options = ort.SessionOptions()
        options.log_severity_level = 3  # errors only: the comparison prints its own report
        try:
            self._session = ort.InferenceSession(str(file), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own exception types for every kind of bad file
            raise SourceError(f"{self.source}: ONNX Runtime cannot load it: {exc}") from None
        self.inputs: list[TensorDecl] = [
            TensorDecl(i.name, _onnx_datatype(self.source, i.name, i.type), _onnx_dims(i.shape))
            for i in self._session.get_inputs()
        ]
        self.outputs: list[str] = [o.name for o in self._session.get_outputs()]

    def run(self, feeds: Mapping[str, Array]) -> dict[str, Array]:
        try:
            values = self._session.run(self.outputs, dict(feeds))
        except Exception as exc:  # onnxruntime's Fail/InvalidArgument/RuntimeException
            raise RunnerFailed(f"{self.source}: ONNX Runtime failed: {exc}") from None
        return {name: np.asarray(value) for name, value in zip(self.outputs, values, strict=True)}

    def close(self) -> None:
        del self._session


def _onnx_datatype(source: str, name: str, onnx_type: str) -> str:
    config = ONNX_TO_CONFIG.get(onnx_type)
    if config is None:
        raise SourceError(f"{source}: input {name!r} has type {onnx_type}, which the v2 protocol has no datatype for")
    return CONFIG_TO_WIRE[config]


def _onnx_dims(shape: Sequence[int | str | None]) -> tuple[int, ...]:
    return tuple(d if isinstance(d, int) and d >= 0 else -1 for d in shape)


_MODEL_PATH = re.compile(r"^/v2/models/(?P<name>[^/]+)(?:/versions/(?P<version>[^/]+))?/?$")


def parse_model_url(url: str) -> tuple[str, str, str | None]:
    """``SCHEME://HOST:PORT/v2/models/NAME[/versions/V]`` -> (server URL, model name, version or None)."""
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in URL_SCHEMES:
        raise SourceError(f"{url}: a served model's URL starts with http://, https:// or grpc://")
    host, slash, path = rest.partition("/")
    match = _MODEL_PATH.match(slash + path)
    if not host or match is None:
        raise SourceError(
            f"{url}: expected {scheme}://HOST:PORT/v2/models/NAME or {scheme}://HOST:PORT/v2/models/NAME/versions/V"
        )
    return f"{scheme.lower()}://{host}", match["name"], match["version"]


class ServedRunner:
    """A model on a v2 server (modelsvc, Triton) through ``modelsvc.client``, over HTTP or gRPC.

    Inputs and outputs come from the model's metadata (read once, here); for a model with
    ``max_batch_size`` > 0 the metadata's shapes include the batch dimension as -1, as Triton's do.
    """

    def __init__(self, url: str, timeout: float = 60.0) -> None:
        from ...client import Client, ClientError, ConnectError, ModelNotFound
        from ...client import Timeout as ClientTimeout

        self.source = url
        server, self.model_name, self.version = parse_model_url(url)
        self._errors: tuple[type[Exception], ...] = (ClientError,)
        try:
            self._client = Client(server, timeout=timeout)
        except ValueError as exc:
            raise SourceError(f"{url}: {exc}") from None
        try:
            metadata = self._client.model_metadata(self.model_name, self.version)
        except ModelNotFound as exc:
            self._client.close()
            raise SourceError(f"{url}: no model {self._label} on {server}: {exc}") from None
        except (ConnectError, ClientTimeout) as exc:
            self._client.close()
            raise SourceError(f"{url}: cannot reach the server at {server}: {exc}") from None
        except ClientError as exc:
            self._client.close()
            raise SourceError(f"{url}: reading the metadata of {self._label} failed: {exc}") from None
        self.inputs: list[TensorDecl] = [TensorDecl(t.name, t.datatype, tuple(t.shape)) for t in metadata.inputs]
        self.outputs: list[str] = [t.name for t in metadata.outputs]

    @property
    def _label(self) -> str:
        return repr(self.model_name) + (f" version {self.version}" if self.version else "")

    def run(self, feeds: Mapping[str, Array]) -> dict[str, Array]:
        try:
            result = self._client.infer(self.model_name, feeds, version=self.version)
        except self._errors as exc:
            raise RunnerFailed(f"{self.source}: inference on {self._label} failed: {exc}") from None
        return dict(result.outputs)

    def close(self) -> None:
        self._client.close()


def open_runner(source: str) -> Runner:
    """The runner for ``source``: a served model's URL, an ``.onnx`` file, or a ``.plan``/``.engine`` file."""
    if "://" in source:
        return ServedRunner(source)
    suffix = Path(source).suffix.lower()
    if suffix in ONNX_SUFFIXES:
        return OnnxRunner(source)
    if suffix in PLAN_SUFFIXES:
        from ._plan import PlanRunner

        return PlanRunner(source)
    raise SourceError(
        f"{source}: not a model source; expected a file ending in {', '.join(ONNX_SUFFIXES + PLAN_SUFFIXES)} "
        "or a URL http://HOST:PORT/v2/models/NAME[/versions/V] (or grpc://...)"
    )
