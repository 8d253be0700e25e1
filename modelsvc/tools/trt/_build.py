"""The whole build: profiles, TensorRT's builder, the check against ONNX Runtime, and only then the files.

``build_plan`` refuses bad options before anything is loaded, builds the plan in memory, runs it and ONNX
Runtime on the same inputs (the min, opt and max shapes of every profile, random; or the ``--npz`` arrays), and
writes nothing unless every output is within the tolerance: the plan (``--save-engine OUT.plan``, or with
``--from-config`` ``REPO/NAME/VERSION/model.plan`` and a config.pbtxt that says ``platform: "tensorrt_plan"``),
then the timing and calibration caches, each through a temporary name.

Networks are strongly typed on TensorRT 10 and 11 alike (``_precision``): ``--fp16``/``--bf16`` convert the model
into a temporary folder before TensorRT parses it (removed after the build), ``--int8`` takes an explicitly
quantized (Q/DQ) model, and only TensorRT 10 still calibrates one without Q/DQ. The check always runs ONNX Runtime
on the original model, so a plan is held to the fp32 model's outputs, conversion included.

The tolerance logic is ``modelsvc export``'s (a default per precision, a flag to override it, nothing written
when an output is over it), with ``numpy.allclose``'s rule ``|plan - onnx| <= atol + rtol * |onnx|``. The
defaults (:data:`DEFAULT_TOLERANCES`): fp32 ``atol 1e-4`` (export's, and TF32 is off unless ``--tf32``). fp16
``atol 5e-2, rtol 1e-2``: fp16 keeps 11 significant bits, so a value near 8 (BERT's hidden states reach about
+-10 after LayerNorm) is stored to steps of 2**-7 = 0.008, and a 12-layer encoder that rounds each layer's
output to fp16 drifts by a few such steps; 5e-2 covers that for values of order 1, 1e-2 for larger ones. bf16
keeps 8 bits (8 times coarser steps): ``atol 2e-1, rtol 5e-2``; int8 ``atol 2e-1, rtol 1e-1`` (a check that the
plan is not broken, not of its accuracy: measure that on your task's data). None of them has been measured on a
GPU yet: no GPU was available where this was written.
"""

from __future__ import annotations

import sys
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ..inspect_model import onnx_tensors
from ._builder import BuilderSettings, BuiltPlan, build_serialized, can_calibrate, import_tensorrt
from ._config import PLAN_FILENAME, config_text, plan_config, read_config, source_onnx, write_atomic
from ._errors import BuildCheckError, BuildError, BuildUsageError
from ._precision import Conversion, convert, int8_mode, is_quantized, refuse_calibration
from ._report import LayerInfo, layers_from_inspector
from ._shapes import (
    DEFAULT_MAX_SEQUENCE_LENGTH,
    Profile,
    check_profiles,
    format_shape,
    parse_profiles,
    profile_shapes,
    profiles_from_config,
)

__all__ = ["DEFAULT_TOLERANCES", "PRECISIONS", "BuildOptions", "BuildReport", "CheckCase", "build_plan", "tolerances"]

PRECISIONS = ("fp32", "fp16", "bf16", "int8")
#: precision -> (atol, rtol) that the check allows unless --atol/--rtol say otherwise (see the module docstring)
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "fp32": (1e-4, 0.0),
    "tf32": (5e-2, 1e-2),
    "fp16": (5e-2, 1e-2),
    "bf16": (2e-1, 5e-2),
    "int8": (2e-1, 1e-1),
}
#: the largest batch fed to the int8 calibrator at once (rows of --calib-npz)
CALIBRATION_BATCH = 16
_SEED = 20261125


def _log_stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


@dataclass(frozen=True)
class BuildOptions:
    """What to build, and how; the fields are ``modelsvc build``'s flags."""

    #: the ONNX model (with --from-config: default the source model's newest version's file)
    onnx: Path | None = None
    #: where the plan goes without --from-config
    save_engine: Path | None = None
    #: REPO/NAME of a model whose config.pbtxt gives the profiles and the plan's config
    from_config: Path | None = None
    #: with --from-config: the repository that receives NAME/VERSION/model.plan and NAME/config.pbtxt
    model_repository: Path | None = None
    #: with --from-config: the plan model's name (default: the source's)
    model_name: str | None = None
    version: int = 1
    #: trtexec's shape flags, one string per profile each (they replace a derived profile)
    min_shapes: tuple[str, ...] = ()
    opt_shapes: tuple[str, ...] = ()
    max_shapes: tuple[str, ...] = ()
    #: with --from-config: the largest size of a -1 dim that is not the batch
    max_sequence_length: int = DEFAULT_MAX_SEQUENCE_LENGTH
    #: fp32 (the model's own types), fp16 or bf16 (the model converted first), int8 (a Q/DQ model; on TensorRT 10
    #: also a model without Q/DQ, calibrated on --calib-npz / --calib)
    precision: str = "fp32"
    #: allow TF32 math in fp32 layers
    tf32: bool = False
    #: int8: a calibration cache file (used when it exists, written after calibrating on --calib-npz)
    calib: Path | None = None
    #: int8: an .npz of real inputs to calibrate on
    calib_npz: Path | None = None
    #: a timing cache file: loaded when it exists, saved after the build
    timing_cache: Path | None = None
    #: the workspace memory pool limit in MiB
    workspace: int | None = None
    #: TensorRT's builder optimization level, 0..5
    builder_optimization_level: int | None = None
    #: an .npz of inputs to check on instead of random ones
    npz: Path | None = None
    #: the check's tolerances (None: the precision's default)
    atol: float | None = None
    rtol: float | None = None
    log: Callable[[str], None] = field(default=_log_stderr, compare=False, repr=False)


@dataclass(frozen=True)
class CheckCase:
    """One run of the check: the profile, the input shapes, and what compare_runners found."""

    profile: int
    shapes: dict[str, tuple[int, ...]]
    #: a ``modelsvc.tools.compare.CompareReport`` (plan as A, ONNX Runtime as B)
    report: Any

    def label(self) -> str:
        return f"profile {self.profile}: " + ", ".join(f"{n} {format_shape(s)}" for n, s in self.shapes.items())


@dataclass
class BuildReport:
    """What ``build_plan`` built, measured and wrote."""

    onnx_path: Path
    plan_path: Path
    #: the plan model's config.pbtxt (with --from-config), else None
    config_path: Path | None
    precision: str
    tensorrt_version: str
    plan_bytes: int
    build_seconds: float
    profiles: list[Profile]
    layers: list[LayerInfo]
    atol: float
    rtol: float
    checks: list[CheckCase]
    #: the timing cache file, whether it was loaded (and accepted) and whether it was saved
    timing_cache: Path | None = None
    timing_cache_loaded: bool = False
    timing_cache_saved: bool = False
    calibration_cache_saved: bool = False
    #: --fp16/--bf16: the converter, and the nodes it kept in fp32 (the converted file was temporary)
    conversion: Conversion | None = None
    notes: list[str] = field(default_factory=list)


def tolerances(options: BuildOptions) -> tuple[float, float]:
    """The (atol, rtol) of the check: the flags, else the precision's default."""
    key = "tf32" if options.precision == "fp32" and options.tf32 else options.precision
    atol, rtol = DEFAULT_TOLERANCES[key]
    return (options.atol if options.atol is not None else atol, options.rtol if options.rtol is not None else rtol)


def _validate(options: BuildOptions) -> None:
    def bad(message: str) -> BuildUsageError:
        return BuildUsageError(message)

    if options.precision not in PRECISIONS:
        raise bad(f"precision {options.precision!r} is not one of {', '.join(PRECISIONS)}")
    if options.from_config is None:
        if options.onnx is None or options.save_engine is None:
            raise bad("give --onnx MODEL.onnx and --save-engine OUT.plan, or --from-config REPO/NAME")
        if options.model_repository is not None or options.model_name is not None:
            raise bad("--model-repository and --model-name go with --from-config")
    else:
        if options.save_engine is not None:
            raise bad("--save-engine does not go with --from-config, which writes NAME/VERSION/model.plan")
        if options.model_repository is None:
            raise bad("--from-config needs --model-repository DIR, the repository that receives the plan model")
        name = options.model_name or options.from_config.name
        if not name or name in (".", "..") or "/" in name or "\\" in name or name.startswith("."):
            raise bad(f"model name {name!r} cannot be a folder name in a model repository")
        target = (options.model_repository / name).resolve()
        if target == options.from_config.resolve():
            raise bad(
                f"the plan model would replace the source model's folder {target}: "
                "give another --model-repository or --model-name"
            )
    if options.version < 1:
        raise bad(f"version {options.version} must be at least 1")
    if options.tf32 and options.precision != "fp32":
        raise bad(f"--tf32 applies to fp32 builds, not --{options.precision}")
    if options.precision != "int8" and (options.calib is not None or options.calib_npz is not None):
        raise bad("--calib and --calib-npz go with --int8")
    if options.workspace is not None and options.workspace < 1:
        raise bad(f"--workspace {options.workspace} MiB must be at least 1")
    level = options.builder_optimization_level
    if level is not None and not 0 <= level <= 5:
        raise bad(f"--builder-optimization-level {level} is outside 0..5")
    for name, value in (("--atol", options.atol), ("--rtol", options.rtol)):
        if value is not None and not (value >= 0 and np.isfinite(value)):
            raise bad(f"{name} {value} must be a finite number >= 0")


def _inputs_and_profiles(options: BuildOptions) -> tuple[Path, Any, list[Profile], bool]:
    """The ONNX file, the source config (or None), the checked, completed profiles, and whether the model is
    explicitly quantized (Q/DQ)."""
    import onnx

    config = None
    onnx_path = options.onnx
    if options.from_config is not None:
        config = read_config(options.from_config)
        onnx_path = onnx_path or source_onnx(options.from_config, config)
    assert onnx_path is not None
    if not onnx_path.is_file():
        raise BuildUsageError(f"--onnx {onnx_path}: no such file")
    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError and others for a file that is not a model
        raise BuildUsageError(f"--onnx {onnx_path}: not an ONNX model: {exc}") from None
    contrib = sorted({node.op_type for node in model.graph.node if node.domain == "com.microsoft"})
    if contrib:
        raise BuildUsageError(
            f"--onnx {onnx_path}: ONNX Runtime's own operators (com.microsoft: {', '.join(contrib)}), which "
            "TensorRT's ONNX parser does not read; they come from ONNX Runtime's transformer optimizer "
            "(`modelsvc export --optimize`): export the model without --optimize for TensorRT"
        )
    inputs, _ = onnx_tensors(model)
    if options.min_shapes or options.opt_shapes or options.max_shapes:
        profiles = parse_profiles(options.min_shapes, options.opt_shapes, options.max_shapes)
    elif config is not None:
        where = str(options.from_config / "config.pbtxt") if options.from_config else "config.pbtxt"
        profiles = profiles_from_config(config, options.max_sequence_length, where)
    else:
        profiles = []
    return onnx_path, config, check_profiles(profiles, inputs), is_quantized(model)


def _fits(shapes: Mapping[str, Sequence[int]], profile: Profile) -> bool:
    for name, ranges in profile.items():
        shape = shapes.get(name)
        if shape is None or len(shape) != len(ranges.min):
            return False
        if not all(lo <= d <= hi for d, lo, hi in zip(shape, ranges.min, ranges.max, strict=True)):
            return False
    return True


def _calibration_batches(path: Path, profiles: Sequence[Profile]) -> list[dict[str, np.ndarray[Any, Any]]]:
    """--calib-npz's arrays cut into equal batches of at most CALIBRATION_BATCH rows (a short last one dropped)."""
    try:
        with np.load(path, allow_pickle=False) as data:
            arrays = {name: data[name] for name in data.files}
    except FileNotFoundError:
        raise BuildUsageError(f"--calib-npz {path}: no such file") from None
    except (OSError, ValueError) as exc:
        raise BuildUsageError(f"--calib-npz {path}: not a readable .npz file: {exc}") from None
    names = list(profiles[0])
    missing = [n for n in names if n not in arrays]
    if missing:
        raise BuildUsageError(f"--calib-npz {path}: no array for input(s) {', '.join(missing)}")
    rows = {n: arrays[n].shape[0] if arrays[n].ndim else 0 for n in names}
    if len(set(rows.values())) != 1 or not next(iter(rows.values())):
        raise BuildUsageError(f"--calib-npz {path}: the arrays need the same number of rows (first dim), got {rows}")
    total = next(iter(rows.values()))
    size = min(total, CALIBRATION_BATCH)
    batches = [{n: arrays[n][start : start + size] for n in names} for start in range(0, total - size + 1, size)]
    if not _fits({n: a.shape for n, a in batches[0].items()}, profiles[0]):
        raise BuildUsageError(f"--calib-npz {path}: batches of {size} rows do not fit profile 0's shapes")
    return batches


def _check(
    onnx_path: Path, built: BuiltPlan, profiles: Sequence[Profile], options: BuildOptions, atol: float, rtol: float
) -> list[CheckCase]:
    from ..compare import CompareError, OnnxRunner, PlanRunner, compare_runners, load_npz, random_feeds

    cases: list[CheckCase] = []
    try:
        reference = OnnxRunner(onnx_path)
        try:
            npz_feeds = None
            if options.npz is not None:
                npz_feeds, notes = load_npz(options.npz, reference.inputs)
                for note in notes:
                    options.log(note)
                shapes = {n: tuple(a.shape) for n, a in npz_feeds.items()}
                fitting = [i for i, p in enumerate(profiles) if _fits(shapes, p)]
                if not fitting:
                    raise BuildUsageError(f"--npz {options.npz}: its shapes fit no profile of the plan")
            for index, profile in enumerate(profiles):
                if npz_feeds is not None and index != fitting[0]:
                    continue
                plan = PlanRunner(built.plan, profile=index)
                try:
                    cases_shapes = [shapes] if npz_feeds is not None else profile_shapes(profile)
                    for case_shapes in cases_shapes:
                        feeds = (
                            npz_feeds
                            if npz_feeds is not None
                            else random_feeds(reference.inputs, case_shapes, seed=_SEED + len(cases))
                        )
                        report = compare_runners(plan, reference, feeds, atol, rtol)
                        cases.append(CheckCase(index, {n: tuple(s) for n, s in case_shapes.items()}, report))
                finally:
                    plan.close()
        finally:
            reference.close()
    except CompareError as exc:
        raise BuildError(f"checking the plan against ONNX Runtime failed: {exc}") from None
    return cases


def _read_optional(path: Path | None) -> bytes:
    if path is None or not path.is_file():
        return b""
    try:
        return path.read_bytes()
    except OSError as exc:
        raise BuildUsageError(f"cannot read {path}: {exc}") from exc


def _precision_plan(options: BuildOptions, onnx_path: Path, quantized: bool) -> bool:
    """Whether the build calibrates (TensorRT 10's weakly typed INT8); BuildUsageError for a precision the model
    cannot take. Decided from the model alone, before TensorRT is imported."""
    if options.precision == "int8":
        calibration = options.calib_npz is not None or options.calib is not None
        calibrate = int8_mode(quantized=quantized, calibration=calibration, onnx_path=onnx_path) == "calibrate"
        if calibrate and options.calib_npz is None and options.calib is not None and not options.calib.is_file():
            raise BuildUsageError(
                f"--calib {options.calib}: no such cache; give --calib-npz FILE (real inputs) to calibrate and write it"
            )
        return calibrate
    if quantized and options.precision in ("fp16", "bf16"):
        raise BuildUsageError(
            f"--{options.precision}: {onnx_path} is already quantized (QuantizeLinear/DequantizeLinear nodes): "
            "build it with --int8, which keeps its Q/DQ types"
        )
    return False


def _notes(quantized: bool, calibrate: bool) -> list[str]:
    if calibrate:
        return ["INT8 by TensorRT 10's calibrator (a weakly typed network: TensorRT chose each layer's precision)"]
    note = "strongly typed: each tensor has the ONNX model's type, no precision flag was set"
    return [note + (" (int8 where its Q/DQ nodes say)" if quantized else "")]


def build_plan(options: BuildOptions) -> BuildReport:
    """Build, check, then write (see the module's docstring). BuildUsageError: bad options or TensorRT missing;
    BuildCheckError: over the tolerance, nothing written; BuildError: the build or the check could not run."""
    _validate(options)
    onnx_path, config, profiles, quantized = _inputs_and_profiles(options)
    calibrate = _precision_plan(options, onnx_path, quantized)
    trt = import_tensorrt()  # a missing TensorRT is a usage error before anything else is read or built
    if calibrate and not can_calibrate(trt):
        raise refuse_calibration(str(trt.__version__))
    atol, rtol = tolerances(options)
    settings = BuilderSettings(
        precision=options.precision,
        calibrate=calibrate,
        tf32=options.tf32,
        workspace_mib=options.workspace,
        optimization_level=options.builder_optimization_level,
        timing_cache=_read_optional(options.timing_cache),
        calibration_cache=_read_optional(options.calib),
        calibration_batches=_calibration_batches(options.calib_npz, profiles) if options.calib_npz else (),
    )
    conversion = None
    with tempfile.TemporaryDirectory(prefix="modelsvc-build-") as scratch:
        if options.precision in ("fp16", "bf16"):
            conversion = convert(onnx_path, options.precision, Path(scratch))
            options.log(conversion.describe())
        built = build_serialized(conversion.path if conversion else onnx_path, profiles, settings, options.log)
    checks = _check(onnx_path, built, profiles, options, atol, rtol)
    failed = [case for case in checks if not case.report.passed]
    if failed:
        worst = failed[0]
        outputs = ", ".join(worst.report.failed)
        raise BuildCheckError(
            f"the plan differs from ONNX Runtime beyond atol {atol:g} + rtol {rtol:g} in {outputs} "
            f"({worst.label()}); nothing was written",
            checks,
        )

    config_path = None
    if options.from_config is not None:
        assert options.model_repository is not None
        name = options.model_name or options.from_config.name
        model_dir = options.model_repository / name
        version_dir = model_dir / str(options.version)
        version_dir.mkdir(parents=True, exist_ok=True)
        plan_path = version_dir / PLAN_FILENAME
        write_atomic(plan_path, built.plan)
        config_path = model_dir / "config.pbtxt"
        text = config_text(plan_config(config, name), onnx_path, options.precision)
        write_atomic(config_path, text.encode("utf-8"))
    else:
        assert options.save_engine is not None
        plan_path = options.save_engine
        if plan_path.parent != Path():
            plan_path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(plan_path, built.plan)
    timing_saved = False
    if options.timing_cache is not None and built.timing_cache:
        write_atomic(options.timing_cache, built.timing_cache)
        timing_saved = True
    calibration_saved = False
    if options.calib is not None and built.calibration_cache:
        write_atomic(options.calib, built.calibration_cache)
        calibration_saved = True
    return BuildReport(
        onnx_path=onnx_path,
        plan_path=plan_path,
        config_path=config_path,
        precision=options.precision + (" (tf32 allowed)" if options.tf32 else ""),
        tensorrt_version=built.tensorrt_version,
        plan_bytes=len(built.plan),
        build_seconds=built.seconds,
        profiles=list(profiles),
        layers=layers_from_inspector(built.inspector_json),
        atol=atol,
        rtol=rtol,
        checks=checks,
        timing_cache=options.timing_cache,
        timing_cache_loaded=built.timing_cache_loaded,
        timing_cache_saved=timing_saved,
        calibration_cache_saved=calibration_saved,
        conversion=conversion,
        notes=_notes(quantized, calibrate),
    )
