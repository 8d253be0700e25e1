"""The python backend: Triton's ``backend: "python"`` models, a ``model.py`` defining ``TritonPythonModel``.

Models written for Triton's python backend run unchanged: ``import triton_python_backend_utils as
pb_utils`` finds :mod:`modelsvc.backends.python_utils`; ``auto_complete_config(config)`` (optional),
``initialize(args)`` (optional, ``args`` with Triton's keys, all strings), ``execute(requests)`` returning
one ``InferenceResponse`` per request (a decoupled model answers through each request's response sender
and returns None: see ``_pb_sender``), and ``finalize()`` (optional) are called as Triton calls them.

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

Where the code lives: ``_python_import`` imports model.py, ``_python_instance`` runs the requests, and
``modelsvc.backends.python_utils`` (with the ``_pb_*`` modules here) is the ``pb_utils`` API the models call.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from google.protobuf import json_format

from modelsvc.protocol._pbjson import message_to_json

from .. import python_utils as pb
from .._base import ConfigMismatchError, ModelConfig, ModelInstance, ModelLoadError
from .._devices import placements
from ._pb_bls import _Caller
from ._python_import import _ModelFile
from ._python_instance import PythonInstance, _OutputSpec

logger = logging.getLogger("modelsvc.backends.python")


# --- the model's JSON configuration -------------------------------------------------------------------


def config_json(config: ModelConfig) -> dict[str, Any]:
    """The configuration as Triton hands it to python models (``args["model_config"]``): every field
    present with its default at every level (messages only where set), 64-bit integers as numbers,
    enums by name."""
    return message_to_json(config, defaults=True)


def _transaction_policy_is_decoupled(config: ModelConfig) -> bool:
    return bool(config.HasField("model_transaction_policy") and config.model_transaction_policy.decoupled)


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
            config.CopyFrom(completed)
        finally:
            model_file.release()

    def create_instances(self, config: ModelConfig, artifact: Path, version: int) -> list[ModelInstance]:
        """One ``TritonPythonModel`` per instance (per ``instance_group`` entry, ``count`` x each GPU),
        each initialized with its own ``args``; ModelLoadError naming the file or the failure."""
        model_file = _ModelFile(artifact, config.name, version)
        instances: list[PythonInstance] = []
        try:
            cls = model_file.model_class()
            placements = _placements(config)
            outputs = {entry.name: _OutputSpec.of(entry) for entry in config.output}
            outputs.update(_state_outputs(config))
            caller = _Caller(config.name, version, len(placements))
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
                    _transaction_policy_is_decoupled(config),
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


def _state_outputs(config: ModelConfig) -> dict[str, _OutputSpec]:
    """Implicit state (``sequence_batching { state }``): the model returns each state output in its response,
    as in Triton's python backend; the sequence batcher keeps it and never sends it to the client."""
    return {
        state.output_name: _OutputSpec.typed(state.output_name, state.data_type, tuple(state.dims))
        for state in config.sequence_batching.state
    }


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

