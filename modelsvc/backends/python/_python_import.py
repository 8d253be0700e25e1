"""Importing a python model's ``model.py``: once per model version, under a unique module name inside a
synthetic package whose path is the version directory, with Triton's ``sys.path`` entries (the version and
model directories) added while the version is loaded."""

from __future__ import annotations

import importlib.abc
import importlib.util
import itertools
import logging
import re
import sys
import threading
from collections import Counter
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from .._base import ModelLoadError

logger = logging.getLogger("modelsvc.backends.python")

_PACKAGE = "_modelsvc_python_models"
"""The (synthetic) package under which every model.py is imported."""

_import_lock = threading.Lock()
_path_refs: Counter[str] = Counter()
_paths_added: set[str] = set()
_numbers = itertools.count(1)


# sys.path is only ever replaced here, never changed in place: an import in another thread (the server
# reads other models while this one loads) walks the list it read, and a change in place under that walk
# skips entries, so a module beside them is "not found"


def _add_paths(paths: Sequence[str]) -> None:
    with _import_lock:
        added: list[str] = []
        for path in paths:
            if _path_refs[path] == 0 and path not in sys.path and path not in added:
                added.append(path)
                _paths_added.add(path)
            _path_refs[path] += 1
        if added:
            sys.path = [*sys.path, *added]


def _remove_paths(paths: Sequence[str]) -> None:
    with _import_lock:
        gone: set[str] = set()
        for path in paths:
            _path_refs[path] -= 1
            if _path_refs[path] <= 0:
                del _path_refs[path]
                if path in _paths_added:
                    _paths_added.discard(path)
                    gone.add(path)
        if gone:
            sys.path = [p for p in sys.path if p not in gone]


class _ModelFile:
    """``model.py`` imported under a unique module name, and Triton's ``sys.path`` entries for it.

    Shared by the instances of one model version; the last ``release()`` undoes the import.
    """

    def __init__(self, artifact: Path, model: str, version: int) -> None:
        if not artifact.is_file():
            raise ModelLoadError(f"python model file not found: '{artifact}'")
        if artifact.suffix != ".py":
            raise ModelLoadError(f"python model file must end with '.py': '{artifact}'")
        self.artifact = artifact
        self.users = 1
        self._lock = threading.Lock()
        safe = re.sub(r"\W", "_", model)
        self.package = f"{_PACKAGE}.{safe}_v{version}_{next(_numbers)}"
        self._paths = [str(artifact.parent), str(artifact.parent.parent)]
        if _PACKAGE not in sys.modules:
            root = ModuleType(_PACKAGE, "python models loaded by modelsvc")
            root.__path__ = []
            sys.modules.setdefault(_PACKAGE, root)
        package = ModuleType(self.package)
        package.__path__ = [str(artifact.parent)]
        package.__package__ = self.package
        sys.modules[self.package] = package
        _add_paths(self._paths)
        name = self.package + "." + re.sub(r"\W", "_", artifact.stem)
        try:
            spec = importlib.util.spec_from_file_location(name, artifact)
            if spec is None or spec.loader is None:
                raise ModelLoadError(f"cannot import '{artifact}'")
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            self._import(spec.loader, module)
        except ModelLoadError:
            self._undo()
            raise
        except Exception as exc:
            self._undo()
            logger.error("importing '%s' failed", artifact, exc_info=exc)
            raise ModelLoadError(f"failed to import '{artifact}': {type(exc).__name__}: {exc}") from exc
        self.module = module

    def _import(self, loader: importlib.abc.Loader, module: ModuleType) -> None:
        """Run model.py with this model's folders first on sys.path, then forget the helper modules it imported
        from them: another model's ``import helpers`` finds its own file, and a reload reads the files anew.
        (model.py keeps the helper modules it bound; Triton gets the same from a process per model.)"""
        roots = [Path(p).resolve() for p in self._paths]
        with _import_lock:
            saved = sys.path
            before = set(sys.modules)
            sys.path = [*self._paths, *saved]
            try:
                loader.exec_module(module)
            finally:
                sys.path = saved
                for name in set(sys.modules) - before:
                    origin = getattr(sys.modules.get(name), "__file__", None)  # another thread's import may have failed
                    if name.startswith(self.package + ".") or not origin:
                        continue
                    if any(Path(origin).resolve().is_relative_to(root) for root in roots):
                        sys.modules.pop(name, None)

    def model_class(self) -> type:
        cls = getattr(self.module, "TritonPythonModel", None)
        if not isinstance(cls, type):
            raise ModelLoadError(f"'{self.artifact}' defines no class TritonPythonModel")
        if not callable(getattr(cls, "execute", None)):
            raise ModelLoadError(f"TritonPythonModel in '{self.artifact}' has no execute method")
        return cls

    def acquire(self) -> None:
        with self._lock:
            self.users += 1

    def release(self) -> None:
        with self._lock:
            self.users -= 1
            last = self.users == 0
        if last:
            self._undo()

    def _undo(self) -> None:
        prefix = self.package + "."
        for name in [n for n in list(sys.modules) if n == self.package or n.startswith(prefix)]:
            del sys.modules[name]
        _remove_paths(self._paths)

