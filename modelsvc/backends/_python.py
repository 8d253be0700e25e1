"""The python backend: Triton's ``backend: "python"`` models, a ``model.py`` defining ``TritonPythonModel``.

Models written for Triton's python backend run unchanged: ``import triton_python_backend_utils as
pb_utils`` finds :mod:`modelsvc.backends.python_utils`; ``auto_complete_config(config)`` (optional),
``initialize(args)`` (optional, ``args`` with Triton's keys, all strings), ``execute(requests)`` returning
one ``InferenceResponse`` per request, and ``finalize()`` (optional) are called as Triton calls them.

Where it differs from Triton. Triton runs each instance in a process of its own and moves tensors
through shared memory; here each instance is a ``TritonPythonModel`` object inside the server process,
run on its instance's worker thread (one thread per instance, as for every backend): no copies and no
inter-process hop, at the price of sharing the GIL (numpy, tokenizers and ONNX Runtime release it).

- Batching as in Triton: with ``max_batch_size`` > 0 and ``dynamic_batching`` the scheduler forms
  batches as for any model, then hands ``execute`` the list of the batch's requests, each with its own
  tensors (the instance has ``execute_requests``; see ``RequestsInstance``).
- ``async def execute`` runs on an event loop of the instance's own, on a thread of its own, kept for
  the instance's life (Triton also keeps one loop per instance); the worker thread waits for it.
- Business Logic Scripting goes to the server's data plane in-process (see ``_inprocess``). A model
  calling itself synchronously with a single instance would wait forever, in Triton as here: that call
  answers at once with an error instead. Other cycles (A calls B calls A, every instance busy) cannot be
  seen; a BLS ``timeout`` bounds them.
- ``model.py`` is imported once per model version under a unique name, as a module of a package whose
  path is the version directory, so ``from .helpers import x`` works and two models' ``model.py`` never
  collide. Like Triton, the version directory and the model directory are appended to ``sys.path`` while
  the version is loaded, so ``import helpers`` works too; but helper modules of one name in two models
  are one module here, since they share a process.

Errors. An exception raised by ``execute`` fails every request of the batch with INTERNAL naming the
model (a ``TritonModelException``'s message is passed on; anything else stays in the log, traceback
and all). A response carrying a ``TritonError`` fails that request alone, with the model's message and a
status from its code (INVALID_ARG is 400, NOT_FOUND 404, UNAVAILABLE 503, others 500). A response
without a requested output, with an output the config does not list, or with a datatype or shape the
config does not allow fails that request. ``initialize`` raising, a missing ``model.py`` or a file
without ``TritonPythonModel`` fail the load; the message shows in the repository index.
"""

from __future__ import annotations

import asyncio
import importlib.abc
import importlib.util
import inspect
import itertools
import json
import logging
import re
import sys
import threading
from collections import Counter
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2

from modelsvc.protocol import CONFIG_TO_WIRE, NUMPY_DTYPES, InternalError, ModelsvcError, Unavailable
from modelsvc.protocol._pbjson import message_to_json

from . import python_utils as pb
from ._base import Arrays, BatchRequest, ConfigMismatchError, ModelConfig, ModelInstance, ModelLoadError
from ._devices import placements

logger = logging.getLogger("modelsvc.backends.python")


_PACKAGE = "_modelsvc_python_models"
"""The (synthetic) package under which every model.py is imported."""


# --- the model's JSON configuration -------------------------------------------------------------------


def config_json(config: ModelConfig) -> dict[str, Any]:
    """The configuration as Triton hands it to python models (``args["model_config"]``): every field
    present with its default at every level (messages only where set), 64-bit integers as numbers,
    enums by name."""
    return message_to_json(config, defaults=True)


def _transaction_policy_is_decoupled(config: ModelConfig) -> bool:
    return bool(config.HasField("model_transaction_policy") and config.model_transaction_policy.decoupled)


_DECOUPLED = "decoupled models (model_transaction_policy { decoupled: true }) are not supported by modelsvc"


# --- importing model.py ------------------------------------------------------------------------------

_import_lock = threading.Lock()
_path_refs: Counter[str] = Counter()
_paths_added: set[str] = set()
_numbers = itertools.count(1)


# sys.path is only ever replaced here, never changed in place: an import in another thread (the server
# reads other models while this one loads) walks the list it read, and a change in place under that walk
# skips entries, so a module beside them is "not found"


def _add_paths(paths: Sequence[str]) -> None:
    with _import_lock:
        added: list[str] = []
        for path in paths:
            if _path_refs[path] == 0 and path not in sys.path and path not in added:
                added.append(path)
                _paths_added.add(path)
            _path_refs[path] += 1
        if added:
            sys.path = [*sys.path, *added]


def _remove_paths(paths: Sequence[str]) -> None:
    with _import_lock:
        gone: set[str] = set()
        for path in paths:
            _path_refs[path] -= 1
            if _path_refs[path] <= 0:
                del _path_refs[path]
                if path in _paths_added:
                    _paths_added.discard(path)
                    gone.add(path)
        if gone:
            sys.path = [p for p in sys.path if p not in gone]


class _ModelFile:
    """``model.py`` imported under a unique module name, and Triton's ``sys.path`` entries for it.

    Shared by the instances of one model version; the last ``release()`` undoes the import.
    """

    def __init__(self, artifact: Path, model: str, version: int) -> None:
        if not artifact.is_file():
            raise ModelLoadError(f"python model file not found: '{artifact}'")
        if artifact.suffix != ".py":
            raise ModelLoadError(f"python model file must end with '.py': '{artifact}'")
        self.artifact = artifact
        self.users = 1
        self._lock = threading.Lock()
        safe = re.sub(r"\W", "_", model)
        self.package = f"{_PACKAGE}.{safe}_v{version}_{next(_numbers)}"
        self._paths = [str(artifact.parent), str(artifact.parent.parent)]
        if _PACKAGE not in sys.modules:
            root = ModuleType(_PACKAGE, "python models loaded by modelsvc")
            root.__path__ = []
            sys.modules.setdefault(_PACKAGE, root)
        package = ModuleType(self.package)
        package.__path__ = [str(artifact.parent)]
        package.__package__ = self.package
        sys.modules[self.package] = package
        _add_paths(self._paths)
        name = self.package + "." + re.sub(r"\W", "_", artifact.stem)
        try:
            spec = importlib.util.spec_from_file_location(name, artifact)
            if spec is None or spec.loader is None:
                raise ModelLoadError(f"cannot import '{artifact}'")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            self._import(spec.loader, module)
        except ModelLoadError:
            self._undo()
            raise
        except Exception as exc:
            self._undo()
            logger.error("importing '%s' failed", artifact, exc_info=exc)
            raise ModelLoadError(f"failed to import '{artifact}': {type(exc).__name__}: {exc}") from exc
        self.module = module

    def _import(self, loader: importlib.abc.Loader, module: ModuleType) -> None:
        """Run model.py with this model's folders first on sys.path, then forget the helper modules it imported
        from them: another model's ``import helpers`` finds its own file, and a reload reads the files anew.
        (model.py keeps the helper modules it bound; Triton gets the same from a process per model.)"""
        roots = [Path(p).resolve() for p in self._paths]
        with _import_lock:
            saved = sys.path
            before = set(sys.modules)
            sys.path = [*self._paths, *saved]
            try:
                loader.exec_module(module)
            finally:
                sys.path = saved
                for name in set(sys.modules) - before:
                    origin = getattr(sys.modules.get(name), "__file__", None)  # another thread's import may have failed
                    if name.startswith(self.package + ".") or not origin:
                        continue
                    if any(Path(origin).resolve().is_relative_to(root) for root in roots):
                        sys.modules.pop(name, None)

    def model_class(self) -> type:
        cls = getattr(self.module, "TritonPythonModel", None)
        if not isinstance(cls, type):
            raise ModelLoadError(f"'{self.artifact}' defines no class TritonPythonModel")
        if not callable(getattr(cls, "execute", None)):
            raise ModelLoadError(f"TritonPythonModel in '{self.artifact}' has no execute method")
        return cls

    def acquire(self) -> None:
        with self._lock:
            self.users += 1

    def release(self) -> None:
        with self._lock:
            self.users -= 1
            last = self.users == 0
        if last:
            self._undo()

    def _undo(self) -> None:
        prefix = self.package + "."
        for name in [n for n in list(sys.modules) if n == self.package or n.startswith(prefix)]:
            del sys.modules[name]
        _remove_paths(self._paths)


# --- the backend --------------------------------------------------------------------------------------


def _version_of(artifact: Path) -> int:
    name = artifact.parent.name
    return int(name) if name.isdigit() else 0


class PythonBackend:
    """Loads ``model.py`` files; each instance is one ``TritonPythonModel`` object."""

    name = "python"

    def __init__(self) -> None:
        pb.install()

    def autocomplete(self, config: ModelConfig, artifact: Path) -> None:
        """Call the model's ``auto_complete_config`` (if it has one) and take the configuration it returns."""
        if _transaction_policy_is_decoupled(config):
            raise ConfigMismatchError(_DECOUPLED, field="model_transaction_policy")
        model_file = _ModelFile(artifact, config.name, _version_of(artifact))
        try:
            hook = getattr(model_file.model_class(), "auto_complete_config", None)
            if hook is None:
                return
            given = pb.ModelConfig(config_json(config))
            try:
                returned = hook(given)
            except Exception as exc:
                logger.error("auto_complete_config of '%s' failed", artifact, exc_info=exc)
                raise ModelLoadError(
                    f"auto_complete_config of '{artifact}' failed: {type(exc).__name__}: {exc}"
                ) from exc
            if returned is None:
                returned = given
            if not isinstance(returned, pb.ModelConfig):
                raise ModelLoadError(
                    f"auto_complete_config of '{artifact}' must return the pb_utils.ModelConfig it was given, "
                    f"not {type(returned).__name__}"
                )
            completed = ModelConfig()
            try:
                json_format.ParseDict(returned.as_dict(), completed)
            except json_format.ParseError as exc:
                raise ModelLoadError(
                    f"auto_complete_config of '{artifact}' made an invalid configuration: {exc}"
                ) from exc
            if completed.name != config.name:
                raise ConfigMismatchError(
                    f"auto_complete_config of '{artifact}' renamed the model to '{completed.name}'", field="name"
                )
            if _transaction_policy_is_decoupled(completed):
                raise ConfigMismatchError(_DECOUPLED)
            config.CopyFrom(completed)
        finally:
            model_file.release()

    def create_instances(self, config: ModelConfig, artifact: Path, version: int) -> list[ModelInstance]:
        """One ``TritonPythonModel`` per instance (per ``instance_group`` entry, ``count`` x each GPU),
        each initialized with its own ``args``; ModelLoadError naming the file or the failure."""
        if _transaction_policy_is_decoupled(config):
            raise ModelLoadError(_DECOUPLED)
        model_file = _ModelFile(artifact, config.name, version)
        instances: list[PythonInstance] = []
        try:
            cls = model_file.model_class()
            placements = _placements(config)
            outputs = {entry.name: _OutputSpec.of(entry) for entry in config.output}
            caller = pb._Caller(config.name, version, len(placements))
            base_args = {
                "model_config": json.dumps(config_json(config)),
                "model_repository": str(artifact.parent.parent),
                "model_version": str(version),
                "model_name": config.name,
            }
            for name, kind, device_id in placements:
                try:
                    model = cls()
                except Exception as exc:
                    logger.error("creating TritonPythonModel of '%s' failed", artifact, exc_info=exc)
                    raise ModelLoadError(
                        f"TritonPythonModel() of '{artifact}' failed: {type(exc).__name__}: {exc}"
                    ) from exc
                model_file.acquire()
                instance = PythonInstance(
                    name,
                    "cpu" if kind == "CPU" else f"gpu:{device_id}",
                    model,
                    model_file,
                    caller,
                    outputs,
                    config.max_batch_size > 0,
                )
                instances.append(instance)
                args = {
                    **base_args,
                    "model_instance_kind": kind,
                    "model_instance_name": name,
                    "model_instance_device_id": str(device_id),
                }
                instance.initialize(args)
        except BaseException:
            for instance in instances:
                instance.close(finalize=instance.initialized)
            raise
        finally:
            model_file.release()  # the instances hold the module from here on
        return list(instances)


def _placements(config: ModelConfig) -> list[tuple[str, str, int]]:
    """(instance name, kind "CPU"/"GPU", device id) for every instance the instance groups ask for; as in
    Triton's python backend, every instance is numbered and a CPU instance has device id 0."""
    try:
        where = placements(config, "python")
    except ValueError as exc:
        raise ModelLoadError(str(exc)) from None
    return [
        (f"{p.group}_{p.number}", "CPU" if p.gpu is None else "GPU", 0 if p.gpu is None else p.gpu) for p in where
    ]


# --- outputs ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _OutputSpec:
    """What the config allows for one output, as the model must produce it (its ``reshape`` if it has one)."""

    name: str
    datatype: str
    dtype: np.dtype[Any] | None
    dims: tuple[int, ...]

    @classmethod
    def of(cls, entry: Any) -> _OutputSpec:
        type_name = model_config_pb2.DataType.Name(entry.data_type)
        datatype = CONFIG_TO_WIRE.get(type_name, type_name)
        dims = tuple(entry.reshape.shape) if entry.HasField("reshape") else tuple(entry.dims)
        return cls(entry.name, datatype, NUMPY_DTYPES.get(datatype), dims)

    def conform(self, array: np.ndarray[Any, Any], rows: int | None) -> np.ndarray[Any, Any] | str:
        """The array as the server sends it, or what is wrong with it. ``rows``: the request's batch size."""
        if self.datatype == "BYTES":
            if array.dtype.kind not in ("U", "S", "O"):
                return f"output '{self.name}' has numpy dtype {array.dtype}; the configuration says BYTES"
            if array.dtype.kind != "O" or not pb._all_bytes(array):
                array = pb._bytes_array(array)
        elif self.dtype is not None and array.dtype != self.dtype:
            return f"output '{self.name}' has numpy dtype {array.dtype}; the configuration says {self.datatype}"
        shape = array.shape
        expected = self.dims if rows is None else (rows, *self.dims)
        if len(shape) != len(expected) or any(e != -1 and e != s for s, e in zip(shape, expected, strict=True)):
            shown = list(self.dims) if rows is None else [rows, *self.dims]
            return f"output '{self.name}' has shape {list(shape)}; the configuration expects {shown}"
        return array


# --- an instance --------------------------------------------------------------------------------------


class _LoopThread:
    """An event loop on a thread of its own for one instance's coroutines (``async def execute``), kept
    for the instance's life so that what a model binds to its loop keeps working between calls."""

    def __init__(self, name: str, caller: pb._Caller) -> None:
        self.loop = asyncio.new_event_loop()
        self._caller = caller
        self._thread = threading.Thread(target=self._run, name=f"{name}-asyncio", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        pb._set_caller(self._caller)
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def run(self, awaitable: Any) -> Any:
        """Run ``awaitable`` on the loop and wait for its result (from any other thread)."""

        async def wrapped() -> Any:
            return await awaitable

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result()

    def close(self) -> None:
        async def cancel_the_rest() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

        try:
            asyncio.run_coroutine_threadsafe(cancel_the_rest(), self.loop).result(10)
        except Exception:
            logger.exception("cancelling the tasks left on a python model's event loop failed")
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join()
        self.loop.close()


def _run_coroutine(coroutine: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine to its end on a fresh loop, on a thread without a running loop."""
    return asyncio.run(coroutine)


class PythonInstance:
    """One ``TritonPythonModel`` object; the scheduler hands it each batch as a list of requests."""

    def __init__(
        self,
        name: str,
        device: str,
        model: Any,
        model_file: _ModelFile,
        caller: pb._Caller,
        outputs: dict[str, _OutputSpec],
        batching: bool,
    ) -> None:
        self.name = name
        self.device = device
        self.providers = ["python"]
        self.initialized = False
        self._model = model
        self._file = model_file
        self._caller = caller
        self._label = caller.model
        self._outputs = outputs
        self._batching = batching
        self._loop: _LoopThread | None = None
        self._closed = False
        self._execute_is_async = inspect.iscoroutinefunction(getattr(model, "execute", None))

    # -- life cycle ----------------------------------------------------------------------------------
    def initialize(self, args: dict[str, str]) -> None:
        """Call the model's ``initialize(args)``; ModelLoadError with its message when it raises."""
        init = getattr(self._model, "initialize", None)
        try:
            if init is not None:
                result = init(args)
                if inspect.isawaitable(result):
                    self._await(result)
        except Exception as exc:
            logger.error("initialize() of model '%s' instance '%s' failed", self._label, self.name, exc_info=exc)
            raise ModelLoadError(
                f"initialize() of model '{self._label}' (instance '{self.name}') failed: {type(exc).__name__}: {exc}"
            ) from exc
        self.initialized = True

    def close(self, finalize: bool = True) -> None:
        """Call the model's ``finalize()`` (on a thread of its own, never on the server's event loop) once."""
        if self._closed:
            return
        self._closed = True
        worker = threading.Thread(target=self._finish, args=(finalize,), name=f"{self.name}-finalize")
        worker.start()
        worker.join()

    def _finish(self, finalize: bool) -> None:
        # the server's loop waits for this thread: a BLS call from finalize would wait for it in turn
        pb._refuse_server_calls("not available in finalize(), as in Triton")
        try:
            method = getattr(self._model, "finalize", None) if finalize else None
            if method is not None:
                result = method()
                if inspect.isawaitable(result):
                    self._await(result)
        except Exception:
            logger.exception("finalize() of model '%s' instance '%s' failed", self._label, self.name)
        finally:
            if self._loop is not None:
                self._loop.close()
                self._loop = None
            self._file.release()

    def _await(self, awaitable: Any) -> Any:
        if self._loop is None:
            self._loop = _LoopThread(self.name, self._caller)
        return self._loop.run(awaitable)

    # -- execution -----------------------------------------------------------------------------------
    def execute(self, inputs: Arrays, output_names: Sequence[str]) -> Arrays:
        """One request on its own (``output_names`` empty: every output); raises the request's error."""
        names = tuple(output_names) or tuple(self._outputs)
        (answer,) = self.execute_requests([BatchRequest(inputs, names)])
        if isinstance(answer, BaseException):
            raise answer
        return answer

    def execute_requests(self, batch: Sequence[BatchRequest]) -> list[Arrays | BaseException]:
        """Run ``execute`` on the batch's requests; one entry per request: its outputs or its error."""
        if self._closed:
            raise Unavailable(f"model instance '{self.name}' is closed")
        version = self._caller.version
        requests = [
            pb.InferenceRequest._incoming(
                [pb.Tensor._wrap(name, array) for name, array in item.inputs.items()],
                item.outputs,
                item.request,
                self._label,
                version,
            )
            for item in batch
        ]
        pb._set_caller(self._caller)
        try:
            if self._execute_is_async:
                responses = self._await(self._model.execute(requests))
            else:
                responses = self._model.execute(requests)
                if inspect.isawaitable(responses):
                    responses = self._await(responses)
        except pb.TritonModelException as exc:
            logger.error("model '%s' instance '%s': execute() raised: %s", self._label, self.name, exc.message())
            message = f"model '{self._label}' failed to execute the request: {exc.message()}"
            return [InternalError(message) for _ in batch]
        except Exception as exc:
            logger.error("model '%s' instance '%s': execute() raised", self._label, self.name, exc_info=exc)
            return [
                InternalError(f"model '{self._label}' failed to execute the request; see the server log") for _ in batch
            ]
        finally:
            pb._set_caller(None)
        if not isinstance(responses, list | tuple) or len(responses) != len(batch):
            got = f"{len(responses)} responses" if isinstance(responses, list | tuple) else repr(type(responses))
            message = (
                f"model '{self._label}': execute() must return a list of one InferenceResponse per request; "
                f"it returned {got} for {len(batch)} request(s)"
            )
            logger.error("%s", message)
            return [InternalError(message) for _ in batch]
        return [self._answer(item, response) for item, response in zip(batch, responses, strict=True)]

    def _answer(self, item: BatchRequest, response: Any) -> Arrays | ModelsvcError:
        """A response as the request's outputs, or the error that fails this request."""
        if not isinstance(response, pb.InferenceResponse):
            return self._fault(f"execute() returned {type(response).__name__} where an InferenceResponse belongs")
        error = response.error()
        if error is not None:
            return pb._error_from_triton(error)
        produced: dict[str, np.ndarray[Any, Any]] = {}
        tensors: list[Any] = response.output_tensors()
        for tensor in tensors:
            if not isinstance(tensor, pb.Tensor):
                return self._fault(f"a response holds {type(tensor).__name__} where a pb_utils.Tensor belongs")
            if tensor.name() not in self._outputs:
                listed = ", ".join(self._outputs) or "none"
                return self._fault(
                    f"returned output '{tensor.name()}', which the configuration does not list (outputs: {listed})"
                )
            produced[tensor.name()] = tensor.as_numpy()
        rows: int | None = None
        if self._batching and item.inputs:
            rows = next(iter(item.inputs.values())).shape[0]
        out: Arrays = {}
        for name in item.outputs:
            array = produced.get(name)
            if array is None:
                return self._fault(f"did not return the requested output '{name}'")
            spec = self._outputs.get(name)
            if spec is not None:
                conformed = spec.conform(array, rows)
                if isinstance(conformed, str):
                    return self._fault(conformed)
                array = conformed
            out[name] = array
        return out

    def _fault(self, what: str) -> InternalError:
        message = f"model '{self._label}' {what}"
        logger.error("%s", message)
        return InternalError(message)

    def __repr__(self) -> str:
        return f"PythonInstance(name={self.name!r}, device={self.device!r})"
