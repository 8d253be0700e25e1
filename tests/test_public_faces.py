"""The public faces: what ``from modelsvc.client import *``, ``from modelsvc.engine import *`` and
``from logicd import *`` give is exactly what each package's ``__all__`` lists, every name there (as httpx tests its
one public face); ruff's RUF022 keeps it sorted."""

from __future__ import annotations

import inspect
from types import ModuleType

import pytest

import logicd
import modelsvc.client
import modelsvc.engine


def _public(package: ModuleType) -> set[str]:
    """The names a reader of the package's namespace sees: not private, not a submodule."""
    return {name for name in vars(package) if not name.startswith("_") and not inspect.ismodule(vars(package)[name])}


@pytest.mark.parametrize("package", [modelsvc.client, modelsvc.engine, logicd], ids=lambda p: p.__name__)
def test_all_is_the_whole_public_face(package: ModuleType) -> None:
    names = list(package.__all__)
    assert len(names) == len(set(names))
    for name in names:
        assert hasattr(package, name), name
    assert _public(package) == set(names) - {"__version__"}


def test_the_documented_entry_points_are_public() -> None:
    assert {"Client", "AsyncClient", "Model", "AsyncModel", "InferResult", "ClientError", "deadline"} <= set(
        modelsvc.client.__all__
    )
    assert {"create_app", "load_config", "load_service", "Service", "Context", "ServiceConfig"} <= set(logicd.__all__)


def test_the_engine_offers_what_its_doors_bind_to() -> None:
    """The transports, embedded mode (``logicd._embedded``) and ``modelsvc serve`` bind to these; ``modelsvc.server``
    still offers the engine's names it offered before the engine had a package of its own."""
    import modelsvc.server

    assert {"DataPlane", "ModelManager", "ModelControlMode", "Tracing", "Trace", "http_error"} <= set(
        modelsvc.engine.__all__
    )
    for name in ("DataPlane", "ModelControlMode", "ModelEntry", "ModelManager", "ModelVersion", "TensorSpec"):
        assert getattr(modelsvc.server, name) is getattr(modelsvc.engine, name), name
