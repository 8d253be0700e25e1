"""Print the requirements of one container image, taken from pyproject.toml, as a pip requirements file.

    python docker/requirements.py --onnxruntime none                     # the logic server image
    python docker/requirements.py --onnxruntime cpu --extra s3           # modelsvc, CPU image
    python docker/requirements.py --onnxruntime gpu --extra tensorrt     # modelsvc, GPU image

The project's base dependencies choose onnxruntime by platform markers: onnxruntime-gpu on linux x86_64,
onnxruntime elsewhere. An image knows better: ``--onnxruntime`` keeps one of the two lines, without its
marker, or neither (the logic server runs no model, and onnxruntime-gpu is the heaviest wheel of the set).
``--onnxruntime-extras cuda,cudnn`` adds pip extras to the kept line. Each ``--extra`` appends that optional
dependency group. Every other line is printed as written, so versions stay where they are declared.

The image then installs the project itself with ``pip install --no-deps .``: nothing but these lines gets in.
Standard library only (tomllib): it runs in a bare ``python`` image before anything is installed.
"""

from __future__ import annotations

import argparse
import re
import sys
import tomllib
from collections.abc import Sequence
from pathlib import Path

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"

ONNXRUNTIME = {"cpu": "onnxruntime", "gpu": "onnxruntime-gpu"}
"""``--onnxruntime`` choice -> the distribution it keeps."""

_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")


def canonical(name: str) -> str:
    """PEP 503 normalised project name: ``Foo_bar.baz`` -> ``foo-bar-baz``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_name(line: str) -> str:
    """The canonical project name a requirement line names."""
    match = _NAME.match(line)
    if match is None:
        raise ValueError(f"not a requirement: {line!r}")
    return canonical(match.group(1))


def _without_marker(line: str) -> str:
    return line.split(";", 1)[0].strip()


def _with_extras(line: str, extras: Sequence[str]) -> str:
    if not extras:
        return line
    match = _NAME.match(line)
    assert match is not None
    return f"{match.group(1)}[{','.join(extras)}]{line[match.end() :]}"


def requirements(
    pyproject: dict[str, object],
    *,
    onnxruntime: str,
    onnxruntime_extras: Sequence[str] = (),
    extras: Sequence[str] = (),
) -> list[str]:
    """The requirement lines for one image (see the module docstring)."""
    project = pyproject["project"]
    assert isinstance(project, dict)
    keep = ONNXRUNTIME.get(onnxruntime)
    if onnxruntime not in (*ONNXRUNTIME, "none"):
        raise ValueError(f"--onnxruntime must be cpu, gpu or none, got {onnxruntime!r}")
    lines: list[str] = []
    for line in project["dependencies"]:
        name = requirement_name(line)
        if name in ONNXRUNTIME.values():
            if name == keep:
                lines.append(_with_extras(_without_marker(line), onnxruntime_extras))
            continue
        lines.append(line)
    optional = project.get("optional-dependencies", {})
    for extra in extras:
        if extra not in optional:
            raise ValueError(f"pyproject.toml has no optional dependency group {extra!r} (has: {', '.join(optional)})")
        lines.extend(optional[extra])
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--onnxruntime", required=True, choices=[*ONNXRUNTIME, "none"])
    parser.add_argument("--onnxruntime-extras", default="", metavar="A,B", help="pip extras for the kept line")
    parser.add_argument("--extra", action="append", default=[], metavar="NAME", help="an optional group (repeatable)")
    parser.add_argument("--pyproject", type=Path, default=PYPROJECT)
    args = parser.parse_args(argv)
    with args.pyproject.open("rb") as f:
        pyproject = tomllib.load(f)
    extras = [e for part in args.extra for e in part.split(",") if e]
    ort_extras = [e for e in args.onnxruntime_extras.split(",") if e]
    try:
        lines = requirements(pyproject, onnxruntime=args.onnxruntime, onnxruntime_extras=ort_extras, extras=extras)
    except ValueError as exc:
        print(f"requirements.py: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
