"""Triton's defaults for what a config leaves out, and its checks of what a config says.

Every failed check raises a ConfigError located at the field in ``config.pbtxt`` where it can.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tritonclient.grpc import model_config_pb2

from modelsvc.backends import ModelConfig

from ..backends import backend_name
from ..scheduler.sequence._sequence_config import SequenceConfigError, SequenceSettings
from ._locate import Locator

KIND_AUTO = model_config_pb2.ModelInstanceGroup.KIND_AUTO
KIND_GPU = model_config_pb2.ModelInstanceGroup.KIND_GPU
KIND_CPU = model_config_pb2.ModelInstanceGroup.KIND_CPU

#: instances per group when ``count`` is absent, as in Triton: 1, except KIND_CPU groups of the backends
#: below, which get CPU_DEFAULT_INSTANCE_COUNT
DEFAULT_INSTANCE_COUNT = 1
CPU_DEFAULT_INSTANCE_COUNT = 2
_TWO_CPU_INSTANCE_BACKENDS = ("onnxruntime", "tensorflow")
#: backends whose models get the sequence batcher's control and state tensors (tested with them)
_SEQUENCE_BACKENDS = ("python", "onnxruntime")
#: backends whose default and KIND_AUTO groups run on the CPU on a GPU machine too (Triton's openvino backend
#: prefers KIND_CPU: its devices are OpenVINO's, not CUDA GPUs)
_CPU_PREFERRING_BACKENDS = ("openvino",)

_IO = ("input", "output")


def fill_defaults(config: ModelConfig, loc: Locator, gpus: Sequence[int]) -> None:
    """Add what Triton's GET /config shows for fields the config leaves out."""
    if not config.HasField("version_policy"):
        config.version_policy.latest.num_versions = 1
    _normalize_instance_groups(config, loc, gpus)


def _kind_name(kind: int) -> str:
    return str(model_config_pb2.ModelInstanceGroup.Kind.Name(kind))


def _normalize_instance_groups(config: ModelConfig, loc: Locator, gpus: Sequence[int]) -> None:
    """Triton's NormalizeInstanceGroup: a default group, and a name, kind and count for every group."""
    if config.HasField("ensemble_scheduling"):
        return
    cpu_preferred = backend_name(config) in _CPU_PREFERRING_BACKENDS
    if len(config.instance_group) == 0:
        group = config.instance_group.add(name=config.name, kind=KIND_GPU if gpus and not cpu_preferred else KIND_CPU)
    for index, group in enumerate(config.instance_group):
        if not group.name:
            group.name = f"{config.name}_{index}"
        if group.kind == KIND_AUTO:
            on_gpu = bool(gpus) and not cpu_preferred and all(g in gpus for g in group.gpus)
            group.kind = KIND_GPU if on_gpu else KIND_CPU
        if group.kind not in (KIND_CPU, KIND_GPU):
            raise loc.error(
                f"instance group '{group.name}' has kind {_kind_name(group.kind)}; modelsvc supports "
                "KIND_CPU, KIND_GPU and KIND_AUTO",
                loc.item_field("instance_group", index, "kind"),
            )
        if group.count < 0:
            raise loc.error(
                f"instance group '{group.name}' has count {group.count}; count must be at least 1",
                loc.item_field("instance_group", index, "count"),
            )
        if group.count == 0:
            two = group.kind == KIND_CPU and backend_name(config) in _TWO_CPU_INSTANCE_BACKENDS
            group.count = CPU_DEFAULT_INSTANCE_COUNT if two else DEFAULT_INSTANCE_COUNT
        if group.kind == KIND_GPU and len(group.gpus) == 0:
            # With no GPU visible the list stays empty: the backend then tries GPU 0 and refuses
            # (or, with allow_cpu_fallback, runs on CPU).
            group.gpus.extend(gpus)


def select_versions(config: ModelConfig, available: Sequence[int], loc: Locator) -> list[int]:
    """The versions ``config.version_policy`` selects among ``available`` (ascending)."""
    policy = config.version_policy
    choice = policy.WhichOneof("policy_choice")
    ordered = sorted(available)
    if choice == "all":
        return ordered
    if choice == "specific":
        wanted = sorted(set(policy.specific.versions))
        if not wanted:
            raise loc.error("version_policy specific lists no versions", loc.field("specific"))
        missing = [v for v in wanted if v not in available]
        if missing:
            listed = ", ".join(map(str, ordered))
            raise loc.error(
                f"version_policy specific asks for version {', '.join(map(str, missing))}, which has no "
                f"directory (versions present: {listed})",
                loc.field("versions") or loc.field("specific"),
            )
        return wanted
    count = policy.latest.num_versions if choice == "latest" else 1
    if count < 1:
        raise loc.error("version_policy latest must have num_versions of at least 1", loc.field("latest"))
    return ordered[-count:]


def validate(config: ModelConfig, loc: Locator, *, require_io: bool, complete: bool = True) -> None:
    """Triton's checks of a config; with ``complete=False`` only of what is written (before auto-complete)."""
    if config.max_batch_size < 0:
        raise loc.error(
            f"max_batch_size must be 0 (no batching) or more, got {config.max_batch_size}",
            loc.field("max_batch_size", top=True),
        )
    for kind in _IO:
        entries = getattr(config, kind)
        if complete and require_io and len(entries) == 0:
            raise loc.error(
                f"the configuration lists no {kind}s; with auto-complete disabled (--strict-model-config "
                f"or --disable-auto-complete-config) every {kind} must be listed"
            )
        seen: dict[str, int] = {}
        for index, entry in enumerate(entries):
            _validate_tensor(kind, index, entry, loc, complete)
            if entry.name in seen:
                raise loc.error(
                    f"{kind} '{entry.name}' is listed more than once",
                    loc.tensor((kind,), entry.name, nth=1),
                )
            seen[entry.name] = index
    if complete:
        _validate_batching(config, loc)
        _validate_sequence_batching(config, loc)


def _validate_tensor(kind: str, index: int, entry: Any, loc: Locator, complete: bool) -> None:
    if not entry.name:
        raise loc.error(f"{kind} {index} has no name", loc.item_field(kind, index))
    where = loc.tensor((kind,), entry.name)
    if complete and entry.data_type == model_config_pb2.TYPE_INVALID:
        raise loc.error(
            f"{kind} '{entry.name}' has no data_type (TYPE_FP32, TYPE_INT64, TYPE_STRING, ...)",
            loc.tensor((kind,), entry.name, "data_type") or where,
        )
    if complete and len(entry.dims) == 0:
        raise loc.error(f"{kind} '{entry.name}' has no dims", where)
    bad = [d for d in entry.dims if d < 1 and d != -1]
    if bad:
        raise loc.error(
            f"{kind} '{entry.name}' has dims {list(entry.dims)}: each dimension must be at least 1, or -1 "
            "for a variable-size dimension",
            loc.tensor((kind,), entry.name, "dims") or where,
        )


def _validate_batching(config: ModelConfig, loc: Locator) -> None:
    if not config.HasField("dynamic_batching"):
        return
    batching = config.dynamic_batching
    where = loc.field("dynamic_batching", top=True)
    if config.max_batch_size == 0:
        raise loc.error(
            "dynamic_batching needs max_batch_size of at least 1 (the model must batch); with "
            "max_batch_size 0 remove dynamic_batching",
            where,
        )
    for size in batching.preferred_batch_size:
        if not 1 <= size <= config.max_batch_size:
            raise loc.error(
                f"dynamic_batching preferred_batch_size {size} must be between 1 and max_batch_size "
                f"({config.max_batch_size})",
                loc.field("preferred_batch_size") or where,
            )
    levels = batching.priority_levels
    if levels == 0:
        if batching.default_priority_level != 0:
            raise loc.error(
                "dynamic_batching default_priority_level is set but priority_levels is 0",
                loc.field("default_priority_level") or where,
            )
        if len(batching.priority_queue_policy) > 0:
            raise loc.error(
                "dynamic_batching priority_queue_policy is set but priority_levels is 0",
                loc.field("priority_queue_policy") or where,
            )
        return
    if not 1 <= batching.default_priority_level <= levels:
        raise loc.error(
            f"dynamic_batching default_priority_level must be between 1 and priority_levels ({levels}), "
            f"got {batching.default_priority_level}",
            loc.field("default_priority_level") or where,
        )
    for level in sorted(batching.priority_queue_policy):
        if not 1 <= level <= levels:
            raise loc.error(
                f"dynamic_batching priority_queue_policy has level {level}; levels run from 1 to "
                f"priority_levels ({levels})",
                loc.field("priority_queue_policy") or where,
            )


def _validate_sequence_batching(config: ModelConfig, loc: Locator) -> None:
    """Triton's checks of ``sequence_batching`` (controls, state, initial state, strategy), located in the text."""
    where = loc.field("sequence_batching", top=True)
    try:
        settings = SequenceSettings.from_model_config(config)
    except SequenceConfigError as exc:
        start = where or 0
        raise loc.error(str(exc), (loc.field(exc.field, start) if exc.field else None) or where) from None
    if settings is None:
        return
    backend = backend_name(config)
    if (settings.controls or settings.states) and backend not in _SEQUENCE_BACKENDS:
        raise loc.error(
            f"sequence_batching with control inputs or implicit state is supported for the "
            f"{' and '.join(_SEQUENCE_BACKENDS)} backends; model '{config.name}' uses backend '{backend}'",
            where,
        )
