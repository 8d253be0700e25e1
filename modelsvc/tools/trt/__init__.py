"""``modelsvc build``: an ONNX model to a TensorRT plan, checked against ONNX Runtime before it is written.

    from modelsvc.tools.trt import BuildOptions, build_plan
    report = build_plan(BuildOptions(from_config=Path("repo/minilm"), model_repository=Path("plans"),
                                     model_name="minilm_trt", precision="fp16"))

The profiles come from trtexec's shape flags or from a config.pbtxt (``_shapes``, pure); TensorRT's builder is
``_builder`` (the only module that imports TensorRT or CUDA); what --fp16, --bf16 and --int8 mean on strongly
typed networks (the model converted before TensorRT parses it) is ``_precision``; the check, the tolerances and
the writing are ``_build``; the plan's config.pbtxt is ``_config``; the layers of the report ``_report``.
(The folder is ``trt``, not ``build``: tools and ignore files skip folders named like a build output.)
"""

from ._build import DEFAULT_TOLERANCES, PRECISIONS, BuildOptions, BuildReport, CheckCase, build_plan, tolerances
from ._config import PLAN_FILENAME, PLAN_PLATFORM, plan_config
from ._errors import TENSORRT_EXTRA, BuildCheckError, BuildError, BuildUsageError
from ._precision import AUTOCAST_EXTRA, FP32_OPS, Conversion, is_quantized
from ._report import LayerInfo, layers_from_inspector, precision_counts
from ._shapes import (
    DEFAULT_MAX_SEQUENCE_LENGTH,
    OPT_SEQUENCE_LENGTH,
    Profile,
    ShapeRange,
    check_profiles,
    format_shape,
    opt_batch_size,
    parse_profiles,
    parse_shape_spec,
    profiles_from_config,
)

__all__ = [
    "AUTOCAST_EXTRA",
    "DEFAULT_MAX_SEQUENCE_LENGTH",
    "DEFAULT_TOLERANCES",
    "FP32_OPS",
    "OPT_SEQUENCE_LENGTH",
    "PLAN_FILENAME",
    "PLAN_PLATFORM",
    "PRECISIONS",
    "TENSORRT_EXTRA",
    "BuildCheckError",
    "BuildError",
    "BuildOptions",
    "BuildReport",
    "BuildUsageError",
    "CheckCase",
    "Conversion",
    "LayerInfo",
    "Profile",
    "ShapeRange",
    "build_plan",
    "check_profiles",
    "format_shape",
    "is_quantized",
    "layers_from_inspector",
    "opt_batch_size",
    "parse_profiles",
    "parse_shape_spec",
    "plan_config",
    "precision_counts",
    "profiles_from_config",
    "tolerances",
]
