"""``modelsvc compare A B``: two models on the same inputs, the max absolute and relative difference per output.

A and B are any of an ONNX file (ONNX Runtime, CPU), a TensorRT plan (``.plan``/``.engine``, needs
``modelsvc[tensorrt]`` and a GPU) and a served model (``http://HOST:PORT/v2/models/NAME[/versions/V]`` or
``grpc://...``)::

    from modelsvc.tools.compare import common_inputs, compare_runners, open_runner, random_feeds, render_table

    a, b = open_runner("model.onnx"), open_runner("http://localhost:8000/v2/models/model")
    inputs, notes = common_inputs(a.inputs, b.inputs)
    report = compare_runners(a, b, random_feeds(inputs, seed=0), atol=1e-5, rtol=1e-3)
    print(render_table(report), report.passed)

The inputs (random within the declared shapes, or an ``.npz``) are described in ``_inputs``; the differences and
the pass rule (``numpy.allclose``) in ``_report``; the errors and their exit statuses in ``_errors``.
"""

from ._errors import CompareError, IncompatibleModels, RunnerFailed, SourceError, UsageError
from ._inputs import (
    DEFAULT_BATCH,
    DEFAULT_DIM,
    INT_HIGH,
    common_inputs,
    load_npz,
    parse_shapes,
    random_feeds,
    resolve_shapes,
)
from ._plan import PlanRunner
from ._report import REL_FLOOR, CompareReport, OutputDiff, compare_runners, diff_output, render_table
from ._runners import OnnxRunner, ServedRunner, open_runner, parse_model_url
from ._types import Runner, TensorDecl, describe

__all__ = [
    "DEFAULT_BATCH",
    "DEFAULT_DIM",
    "INT_HIGH",
    "REL_FLOOR",
    "CompareError",
    "CompareReport",
    "IncompatibleModels",
    "OnnxRunner",
    "OutputDiff",
    "PlanRunner",
    "Runner",
    "RunnerFailed",
    "ServedRunner",
    "SourceError",
    "TensorDecl",
    "UsageError",
    "common_inputs",
    "compare_runners",
    "describe",
    "diff_output",
    "load_npz",
    "open_runner",
    "parse_model_url",
    "parse_shapes",
    "random_feeds",
    "render_table",
    "resolve_shapes",
]
