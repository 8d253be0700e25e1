"""bench_backends' variants: MiniLM per backend and precision, each built once into a model repository of its own
whose model is named ``minilm`` (so that the doc_classifier's logic server can be pointed at it), and its parity.

A variant's repository holds the doc_classifier's model as ``python -m services.build --backend B --precision P``
would deploy it: exported by ``modelsvc export --format F --precision P`` (as the build does), with the config the
build writes (``services.build.config_text``: the committed config, its backend line swapped), and one change:
``max_batch_size`` 32, so that the grid's batch-32 requests fit (a request over ``max_batch_tokens`` runs alone, as
the service's config says). The baseline, onnxruntime fp32, is today's build, copied. The build's own parity check
is not run (the export's, with a lower bound, is): parity is measured and shown here instead.

Parity of a variant: the smallest cosine similarity of its ``sentence_embedding`` with sentence-transformers'
fp32 PyTorch vectors for the embedder's reference texts (services/embedder/tests/reference.json, made by
sentence-transformers itself); and, served, whether the doc_classifier gives the long documents the labels it gives
them on the baseline (bench_backends counts them).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import numpy as np

from loadtests.harness import _servers

SERVICES = _servers.ROOT / "services"
MODEL = "minilm"
GRID_MAX_BATCH = 32
REFERENCE_JSON = SERVICES / "embedder" / "tests" / "reference.json"
TOKENIZER_JSON = SERVICES / "embedder" / "tokenizer" / "tokenizer.json"


@dataclass(frozen=True)
class Variant:
    backend: str
    """Triton's backend name: onnxruntime, openvino, pytorch."""
    precision: str
    """fp32, bf16 or int8 (services.build's --precision)."""
    accelerator: str = ""
    """A cpu_execution_accelerator of the onnxruntime backend ("openvino": the ONNX model runs on OpenVINO)."""
    calibrated: bool = True
    """int8: activations quantized, calibrated on the doc_classifier's own text (what services.build builds); False:
    the older int8 without calibration (onnxruntime: dynamic quantization; openvino: int8 weights only)."""

    @property
    def key(self) -> str:
        backend = f"{self.backend}+{self.accelerator}" if self.accelerator else self.backend
        if self.precision == "int8" and not self.calibrated:
            return f"{backend}-int8-{'dynamic' if self.backend == 'onnxruntime' else 'weights'}"
        return f"{backend}-{self.precision}"

    @property
    def module(self) -> str:
        """The library the backend needs (its import name)."""
        runs_on = self.accelerator or self.backend
        return {"onnxruntime": "onnxruntime", "openvino": "openvino", "pytorch": "torch"}[runs_on]

    @property
    def extra(self) -> str:
        return {"onnxruntime": "", "openvino": "openvino", "pytorch": "pytorch"}[self.accelerator or self.backend]


VARIANTS = (
    Variant("onnxruntime", "fp32"),
    Variant("onnxruntime", "fp32", "openvino"),
    Variant("onnxruntime", "int8"),
    Variant("onnxruntime", "int8", calibrated=False),
    Variant("openvino", "fp32"),
    Variant("openvino", "bf16"),
    Variant("openvino", "int8"),
    Variant("openvino", "int8", calibrated=False),
    Variant("pytorch", "fp32"),
    Variant("pytorch", "bf16"),
)
BASELINE = VARIANTS[0]


ACCELERATOR_CONFIG = """
# bench_backends: run the CPU instances on {name}
optimization {{ execution_accelerators {{ cpu_execution_accelerator: [ {{ name: "{name}" }} ] }} }}
"""


class Unavailable(Exception):
    """A variant that cannot be built here: its table row says why, the run goes on."""


@dataclass
class Built:
    """A variant built into ``repo`` (the model repository holding ``minilm``)."""

    variant: Variant
    repo: Path
    model_file: Path
    runtime: str
    """The runtime the worker calls: the backend, or openvino for an ONNX model it is asked to accelerate."""
    params: dict[str, str] = field(default_factory=dict)
    """The worker's KEY=VALUE options, from the config's parameters."""
    build_s: float = 0.0
    notes: list[str] = field(default_factory=list)
    """What runs (the table's "runs as")."""
    build_notes: list[str] = field(default_factory=list)
    """What the export said (its own parity check), or that the build came from the cache."""


# ---------------------------------------------------------------------------------------------------------
# building


def _missing_module(variant: Variant) -> str | None:
    if importlib.util.find_spec(variant.module) is None:
        return f"not installed: pip install 'modelsvc[{variant.extra}]'"
    return None


def _services_build() -> Any:
    import services.build as build_module

    return build_module


def _baseline_model(say: Callable[[str], None]) -> Path:
    """The services' ONNX Runtime fp32 build (built first when missing): the doc_classifier's where that is what it
    is built as, else the embedder's (ONNX Runtime fp32 on every CPU, the same export and the same config text);
    on a CPU with VNNI, AMX or native bf16 the doc_classifier's own default is OpenVINO, not the baseline."""
    build_module = _services_build()
    if build_module.missing():
        say("  building the services' model (python -m services.build)")
        build_module.build(say=say)
    for service in ("doc_classifier", "embedder"):
        config = build_module.config_file(service).read_text(encoding="utf-8")
        if config == build_module.wanted_config(service, "onnxruntime", "fp32"):
            return Path(build_module.model_file(service))
    raise Unavailable("neither service is built at onnxruntime fp32: python -m services.build --service embedder")


FORMATS = {"onnxruntime": "onnx", "openvino": "openvino", "pytorch": "torchscript"}
"""backend -> ``modelsvc export --format``"""


EXPORT_MIN_COSINE = 0.9
"""The export's own bound, lowered (its default is 0.999 on every output, per token for last_hidden_state) so that
a variant just short of parity is built and measured; parity is judged here, on sentence_embedding and labels."""


def _export(variant: Variant, baseline: Path, repo: Path, say: Callable[[str], None]) -> list[str]:
    """``modelsvc export --format F --precision P`` of the services' source model into ``repo``, with the config
    ``python -m services.build --backend B --precision P`` writes: the committed one, its backend line swapped."""
    try:
        from modelsvc.tools.export import ExportError, ExportOptions, export_model
    except ImportError as exc:
        raise Unavailable(f"modelsvc export cannot run: {exc}") from None
    if "format" not in {f.name for f in fields(ExportOptions)}:
        raise Unavailable("modelsvc export has no --format/--precision here")
    calibration = None
    if variant.precision == "int8" and variant.calibrated:  # as services.build calibrates the classifier's model
        repo.mkdir(parents=True, exist_ok=True)
        calibration = str(_services_build().write_calibration(["doc_classifier"], repo / "calibration.json"))
    options = ExportOptions(
        model=str(_services_build()._source()), model_repository=repo, model_name=MODEL, pooling="mean",
        format=FORMATS[variant.backend], precision=variant.precision, max_batch_size=GRID_MAX_BATCH,
        max_queue_delay_microseconds=2000, overwrite_config=True, log=lambda line: say(f"    {line}"),
        min_cosine=EXPORT_MIN_COSINE, calibration=calibration,
    )  # fmt: skip
    try:
        report = export_model(options)
    except ExportError as exc:  # the export's own refusal: a precision that loses parity, a format it cannot write
        raise Unavailable(f"modelsvc export refused: {str(exc).splitlines()[0][:200]}") from None
    except ImportError as exc:
        raise Unavailable(f"modelsvc export needs {exc.name}: {exc}") from None
    cosines: dict[str, float] = getattr(report, "min_cosine", {})
    notes = []
    if cosines:
        notes.append("export's check, min cosine " + ", ".join(f"{k} {v:.4f}" for k, v in cosines.items()))
        say(f"    {notes[-1]}")
    if text := getattr(report, "text_min_cosine", {}):
        notes.append(f"calibrated int8 ({report.float_kept} float), on held-out text min cosine "
                     + ", ".join(f"{k} {v:.4f}" for k, v in text.items()))  # fmt: skip
        say(f"    {notes[-1]}")
    if ran := getattr(report, "ran_precision", ""):
        notes.append(f"export ran {ran}")
    committed = _config_path(baseline.parents[1]).read_text()
    config = _services_build().config_text(committed, variant.backend, variant.precision)
    _config_path(repo / MODEL).write_text(config)
    return notes


def default_variant() -> str:
    """The variant ``python -m services.build`` builds by default on this machine (its ``--backend auto``)."""
    backend, precision = _services_build().choose("doc_classifier")
    return f"{backend}-{precision}"


def build_variant(variant: Variant, workdir: Path, say: Callable[[str], None], cache: Path | None = None) -> Built:
    """``variant`` built into ``workdir/<key>/minilm``; Unavailable when it cannot be built here.

    With ``cache``, an exported variant is kept in ``cache/<key>`` and reused while the exporter's code, the
    source model and this module are unchanged (``stamp``); a refusal is remembered the same way."""
    if problem := _missing_module(variant):
        raise Unavailable(problem)
    repo = workdir / variant.key
    target = repo / MODEL
    started = time.monotonic()
    notes: list[str] = []
    if variant.backend == BASELINE.backend and variant.precision == BASELINE.precision:
        source = _baseline_model(say).parents[1]
        shutil.copytree(source, target)
        if variant.accelerator:  # today's model, its CPU instances on the accelerator
            with _config_path(target).open("a") as config:
                config.write(ACCELERATOR_CONFIG.format(name=variant.accelerator))
    else:
        baseline = _baseline_model(say)
        kept = cache / variant.key if cache is not None else None
        stamp = _stamp(variant, baseline)
        if kept is not None and _read_json(kept / STAMP) == stamp:
            saved = _read_json(kept / BUILT) or {}
            if saved.get("refused"):
                raise Unavailable(f"{saved['refused']} (cached in {kept})")
            shutil.copytree(kept / MODEL, target)
            notes = [*saved.get("notes", []), "cached build"]
        else:
            try:
                notes = _export(variant, baseline, repo, say)
            except Unavailable as exc:
                if kept is not None:
                    _keep(kept, stamp, {"refused": str(exc)}, None)
                raise
            if kept is not None:
                _keep(kept, stamp, {"notes": notes}, target)
    built = _describe(variant, repo)
    built.build_notes = notes
    built.build_s = time.monotonic() - started
    return built


BUILD_VERSION = 2
"""Raise when what build_variant does for an exported variant changes (its cached builds are then stale)."""
STAMP = "stamp.json"
BUILT = "built.json"


def _stamp(variant: Variant, baseline: Path) -> dict[str, Any]:
    """What a cached build depends on: the exporter's code, services.build (the config), the source model, and
    how this module builds (BUILD_VERSION)."""
    import modelsvc.tools.export

    digest = hashlib.sha256(f"bench_backends build {BUILD_VERSION}".encode())
    exporter = Path(modelsvc.tools.export.__file__).parent
    code = [*sorted(exporter.glob("*.py")), *sorted(exporter.parent.glob("_inspect*.py")), SERVICES / "build.py"]
    for path in code:
        digest.update(path.read_bytes())
    source = _services_build()._source()
    weights = sorted(str((p.name, p.stat().st_size)) for p in source.iterdir() if p.is_file())
    return {"variant": variant.key, "code": digest.hexdigest(), "source": str(source), "files": weights,
            "baseline": baseline.stat().st_size}  # fmt: skip


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _keep(kept: Path, stamp: dict[str, Any], built: dict[str, Any], model: Path | None) -> None:
    shutil.rmtree(kept, ignore_errors=True)
    kept.mkdir(parents=True)
    if model is not None:
        shutil.copytree(model, kept / MODEL)
    (kept / BUILT).write_text(json.dumps(built))
    (kept / STAMP).write_text(json.dumps(stamp))  # last: a half-written cache entry has no stamp


def _config_path(model_dir: Path) -> Path:
    return model_dir / "config.pbtxt"


def _describe(variant: Variant, repo: Path) -> Built:
    """Read the built model's config: raise max_batch_size for the grid, find the model file and its runtime."""
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2

    model_dir = repo / MODEL
    path = _config_path(model_dir)
    text = path.read_text()
    text, n = re.subn(r"(?m)^max_batch_size:\s*\d+", f"max_batch_size: {GRID_MAX_BATCH}", text)
    if n != 1:
        raise Unavailable(f"{path}: no max_batch_size line to raise to {GRID_MAX_BATCH}")
    path.write_text(text)
    config = text_format.Parse(text, model_config_pb2.ModelConfig())
    backend = config.backend or {"onnxruntime_onnx": "onnxruntime", "pytorch_libtorch": "pytorch"}.get(
        config.platform, config.platform
    )
    files = [p for p in sorted((model_dir / "1").iterdir()) if p.suffix in (".onnx", ".xml", ".pt")]
    if config.default_model_filename:
        files = [model_dir / "1" / config.default_model_filename]
    if not files:
        raise Unavailable(f"{model_dir / '1'}: no model file")
    params = {k: v.string_value for k, v in config.parameters.items()}
    runtime = backend
    notes = [f"{backend} {files[0].name}"]
    accelerators = [a.name for a in config.optimization.execution_accelerators.cpu_execution_accelerator]
    if backend == "onnxruntime" and "openvino" in accelerators:
        runtime = "openvino"
        notes.append("cpu_execution_accelerator openvino")
    worker = {k: v for k, v in params.items() if k.isupper()}
    worker["outputs"] = ",".join(o.name for o in config.output)
    if worker.get("INFERENCE_PRECISION_HINT"):
        notes.append(f"INFERENCE_PRECISION_HINT {worker['INFERENCE_PRECISION_HINT']}")
    return Built(variant, repo, files[0], runtime, worker, notes=notes)


# ---------------------------------------------------------------------------------------------------------
# parity


def reference_batch() -> tuple[dict[str, list[list[int]]], np.ndarray[Any, Any]]:
    """The embedder's short reference texts as one padded batch, and sentence-transformers' vectors for them."""
    from tokenizers import Tokenizer

    data = json.loads(REFERENCE_JSON.read_text(encoding="utf-8"))
    tokenizer = Tokenizer.from_file(str(TOKENIZER_JSON))
    tokenizer.no_truncation()
    tokenizer.no_padding()
    encodings = [tokenizer.encode(item["text"]).ids for item in data["short"]]
    width = max(len(e) for e in encodings)
    ids = [e + [0] * (width - len(e)) for e in encodings]
    mask = [[1] * len(e) + [0] * (width - len(e)) for e in encodings]
    reference = np.asarray([item["embedding"] for item in data["short"]], dtype=np.float64)
    return {"input_ids": ids, "attention_mask": mask}, reference


def min_cosine(got: np.ndarray[Any, Any], reference: np.ndarray[Any, Any]) -> float:
    a = got / np.linalg.norm(got, axis=1, keepdims=True)
    b = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    return float(np.min(np.sum(a * b, axis=1)))
