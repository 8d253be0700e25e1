"""The house's shape, checked: tests mirror the packages, and no file grows past what one reading holds.

- every test file lives in the folder of the layer it tests (``tests/engine/``, ``tests/server/``, ...); only the
  checks of the whole project stay at the top;
- each test folder names a layer that exists: a modelsvc subpackage, ``logicd``, ``loadtests``, or one of the
  folders for what is not a package (``deploy`` for the chart and the images, ``interop`` against a real Triton);
- a source file holds at most 500 lines (a little over is tolerated where a split would cut one idea), a test file
  at most 600.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TESTS = ROOT / "tests"
WHOLE_PROJECT = {"test_import_graph.py", "test_layout.py", "test_public_faces.py", "test_readme.py"}
NOT_PACKAGES = {"deploy", "interop", "data"}
SOURCE_LIMIT, TEST_LIMIT = 520, 600


def _lines(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_only_the_whole_project_checks_sit_at_the_top_of_tests() -> None:
    top = {p.name for p in TESTS.glob("test_*.py")}
    assert top == WHOLE_PROJECT, f"move these into the folder of the layer they test: {sorted(top - WHOLE_PROJECT)}"


def test_every_test_folder_names_a_layer_of_the_project() -> None:
    layers = {p.name for p in (ROOT / "modelsvc").iterdir() if (p / "__init__.py").exists()} | {"logicd", "loadtests"}
    folders = {p.name for p in TESTS.iterdir() if p.is_dir() and not p.name.startswith(("_", "."))}
    assert folders - layers - NOT_PACKAGES == set()
    for folder in folders - {"data"}:
        assert (TESTS / folder / "__init__.py").exists(), f"tests/{folder} needs an __init__.py (unique module names)"
        assert list((TESTS / folder).glob("test_*.py")), f"tests/{folder} holds no tests"


def test_no_file_grows_past_one_reading() -> None:
    too_long = [
        f"{p.relative_to(ROOT)}: {n} lines"
        for top in ("modelsvc", "logicd", "services", "loadtests")
        for p in (ROOT / top).rglob("*.py")
        if (n := _lines(p)) > SOURCE_LIMIT
    ]
    too_long += [f"{p.relative_to(ROOT)}: {n} lines" for p in TESTS.rglob("*.py") if (n := _lines(p)) > TEST_LIMIT]
    assert not too_long, "split these by topic: " + "; ".join(too_long)
