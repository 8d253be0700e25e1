"""The import graph of the project runs one way (shared/DESIGN.md, "Dependency direction").

Every import counts: at module level, inside functions, and under ``if TYPE_CHECKING:``. A circle hidden behind a
lazy or type-only import is still a circle for a reader, so the walk reads the source (``ast``), not ``sys.modules``.

The rules:
- no cycle between any two modules of modelsvc, logicd, loadtests and services;
- ``modelsvc.protocol`` imports nothing of the project;
- ``modelsvc.engine`` (the model service without a socket) never imports ``modelsvc.server`` (its doors);
- the server and the engine never import ``modelsvc.client``, nor the client them;
- a backend's folder (``modelsvc.backends.<name>``) imports no other backend's, but for the ONNX Runtime backend's
  ``openvino`` CPU execution accelerator;
- modelsvc never imports logicd; logicd imports modelsvc's client and protocol, and its engine only for the embedded
  mode (``logicd._embedded``);
- nothing in modelsvc or logicd imports loadtests, services or tests; loadtests imports no tests, and of the
  services only services.build (what builds the models it measures); services import no loadtests.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("modelsvc", "logicd", "loadtests", "services")

#: logicd may import these parts of modelsvc (prefix match); the embedded mode may also import the engine
LOGICD_MAY_IMPORT = ("modelsvc.client", "modelsvc.protocol")
EMBEDDED = "logicd._embedded"
ENGINE = ("modelsvc.engine", "modelsvc.server", "modelsvc.repository", "modelsvc.backends", "modelsvc.scheduler")
BACKEND_FOLDERS = ("onnxruntime", "openvino", "pytorch", "tensorrt", "python")
#: the one edge between backend folders: ``cpu_execution_accelerator { name: "openvino" }`` of ONNX models
ACCELERATOR = ("modelsvc.backends.onnxruntime", "modelsvc.backends.openvino")


def modules(root: Path, packages: Iterable[str]) -> dict[str, tuple[Path, bool]]:
    """Dotted module name -> (file, whether it is a package's ``__init__``)."""
    found: dict[str, tuple[Path, bool]] = {}
    for package in packages:
        for file in sorted((root / package).rglob("*.py")):
            parts = list(file.relative_to(root).with_suffix("").parts)
            is_package = parts[-1] == "__init__"
            found[".".join(parts[:-1] if is_package else parts)] = (file, is_package)
    return found


def import_graph(root: Path, packages: Iterable[str], extra: Iterable[str] = ("tests",)) -> dict[str, set[str]]:
    """Module -> the project modules it imports (any import anywhere in the file).

    ``from a.b import c`` points at ``a.b.c`` when that is a module, else at ``a.b``. Modules named in ``extra``
    (as top-level names) are edges' targets only: importing ``tests`` is seen, the tests themselves are not walked.
    """
    mods = modules(root, packages)
    outside = tuple(extra)

    def known(name: str) -> str | None:
        if name.split(".")[0] in outside:
            return name.split(".")[0]
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {}
    for name, (file, is_package) in mods.items():
        package = name if is_package else name.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(file.read_text(encoding="utf-8"), str(file))):
            if isinstance(node, ast.Import):
                targets.update(t for alias in node.names if (t := known(alias.name)))
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                for alias in node.names:
                    full = f"{source}.{alias.name}"
                    target = full if full in mods else known(source)
                    if target:
                        targets.add(target)
        targets.discard(name)
        graph[name] = targets
    return graph


def cycles(graph: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    on_stack.add(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in on_stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        found.append(sorted(component))
    return found


def _under(name: str, prefixes: Iterable[str]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _backend_folder(name: str) -> str | None:
    """``modelsvc.backends.<name>`` when ``name`` lies in a backend's folder, else None."""
    parts = name.split(".")
    if parts[:2] == ["modelsvc", "backends"] and len(parts) > 2 and parts[2] in BACKEND_FOLDERS:
        return ".".join(parts[:3])
    return None


def forbidden(graph: Mapping[str, set[str]]) -> list[str]:
    """Every edge that runs the wrong way, as ``a -> b (why)``."""
    wrong = []
    for source, targets in sorted(graph.items()):
        top = source.split(".")[0]
        for target in sorted(targets):
            why = None
            if _under(source, ["modelsvc.protocol"]) and not _under(target, ["modelsvc.protocol"]):
                why = "modelsvc.protocol imports nothing of the project"
            elif _under(source, ["modelsvc.engine"]) and _under(target, ["modelsvc.server"]):
                why = "the engine never imports its doors"
            elif _under(source, ["modelsvc.server", "modelsvc.engine"]) and _under(target, ["modelsvc.client"]):
                why = "the server never imports the client"
            elif _under(source, ["modelsvc.client"]) and _under(target, ["modelsvc.server", "modelsvc.engine"]):
                why = "the client never imports the server"
            elif (a := _backend_folder(source)) and (b := _backend_folder(target)) and a != b and (a, b) != ACCELERATOR:
                why = "a backend's folder imports no other backend's"
            elif top in ("modelsvc", "logicd") and _under(target, ["loadtests", "services", "tests"]):
                why = "the packages never import loadtests, services or tests"
            elif top == "modelsvc" and _under(target, ["logicd"]):
                why = "modelsvc never imports logicd"
            elif top == "logicd" and _under(target, ["modelsvc"]) and not _under(target, LOGICD_MAY_IMPORT):
                if not (source == EMBEDDED and _under(target, ENGINE)):
                    why = "logicd imports modelsvc's client and protocol (the engine only in logicd._embedded)"
            elif top == "loadtests" and (
                _under(target, ["tests"]) or (_under(target, ["services"]) and not _under(target, ["services.build"]))
            ):
                why = "loadtests imports no tests, and of the services only services.build"
            elif top == "services" and _under(target, ["loadtests"]):
                why = "services never import loadtests"
            if why:
                wrong.append(f"{source} -> {target} ({why})")
    return wrong


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(ROOT, PACKAGES)


def test_the_walk_sees_the_packages(graph: dict[str, set[str]]) -> None:
    assert "modelsvc.engine._dataplane" in graph
    assert "modelsvc.backends.onnxruntime._onnxruntime" in graph
    assert "modelsvc.protocol" in graph["modelsvc.client._core"] or any(
        t.startswith("modelsvc.protocol") for t in graph["modelsvc.client._core"]
    )
    assert any(t.startswith("modelsvc.client") for t in graph["logicd._app"])


def test_no_import_cycles(graph: dict[str, set[str]]) -> None:
    assert cycles(graph) == []


def test_imports_run_one_way(graph: dict[str, set[str]]) -> None:
    assert forbidden(graph) == []


def _write(root: Path, files: Mapping[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_checks_catch_type_only_cycles_and_wrong_directions(tmp_path: Path) -> None:
    """The walk is not blind: a cycle through ``TYPE_CHECKING`` and a function-level import are found, and so
    are a protocol that imports the server and a server that imports the client."""
    _write(
        tmp_path,
        {
            "modelsvc/__init__.py": "",
            "modelsvc/protocol/__init__.py": "from ..server import _a\n",
            "modelsvc/server/__init__.py": "",
            "modelsvc/server/_a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._b import B\n",
            "modelsvc/server/_b.py": "def f():\n    from . import _a\n    from modelsvc.client import _c\n",
            "modelsvc/client/__init__.py": "",
            "modelsvc/client/_c.py": "",
            "modelsvc/engine/__init__.py": "",
            "modelsvc/engine/_d.py": "def f():\n    from ..server import _a\n",
            "modelsvc/backends/__init__.py": "",
            "modelsvc/backends/pytorch/__init__.py": "",
            "modelsvc/backends/pytorch/_p.py": "from ..openvino import _o\n",
            "modelsvc/backends/openvino/__init__.py": "",
            "modelsvc/backends/openvino/_o.py": "",
            "modelsvc/backends/onnxruntime/__init__.py": "",
            "modelsvc/backends/onnxruntime/_x.py": "from ..openvino import _o\n",
        },
    )
    toy = import_graph(tmp_path, ["modelsvc"])
    assert cycles(toy) == [["modelsvc.server._a", "modelsvc.server._b"]]
    assert forbidden(toy) == [
        "modelsvc.backends.pytorch._p -> modelsvc.backends.openvino._o (a backend's folder imports no other backend's)",
        "modelsvc.engine._d -> modelsvc.server._a (the engine never imports its doors)",
        "modelsvc.protocol -> modelsvc.server._a (modelsvc.protocol imports nothing of the project)",
        "modelsvc.server._b -> modelsvc.client._c (the server never imports the client)",
    ]
