"""Embedded mode: the modelsvc engine inside the logic server's process, behind the client's own API.

``model_service: embedded`` starts the engine on the service's model repository and hands the client
``modelsvc.client``'s in-process binding to its data plane: no network hop and no serialization (tensors pass
as numpy arrays), the same validation, batching, errors and statistics as the model service itself. This module
only wires the engine to that binding.
"""

from __future__ import annotations

from pathlib import Path

from modelsvc.client import InProcessTransport
from modelsvc.engine import DataPlane, ModelManager
from modelsvc.repository import ModelRepository
from modelsvc.server import Metrics


class EmbeddedModelService:
    """Loads a model repository in-process; ``binding()`` gives the client its way in.

    engine = EmbeddedModelService(Path("model_repository"))
    await engine.start()
    client = AsyncClient(binding=engine.binding())
    """

    def __init__(self, repository: Path, *, strict_model_config: bool = False) -> None:
        self.repository = repository
        self.models = ModelManager(ModelRepository(repository, strict_model_config=strict_model_config))
        self.dataplane = DataPlane(self.models)
        self.metrics = Metrics(self.models)
        """The model service's own metrics (nv_* families), for the logic server to expose."""

    async def start(self) -> None:
        """Load every model; a model that fails to load is an error here (as --exit-on-error true)."""
        errors = await self.models.load_all()
        if errors:
            await self.models.close()
            raise RuntimeError("embedded model service: " + "; ".join(errors))
        self.dataplane.accepting = True

    async def close(self) -> None:
        self.dataplane.draining = True
        await self.models.close()

    def binding(self) -> InProcessTransport:
        """The client's binding to this engine's data plane; closing the client leaves the engine running."""
        return InProcessTransport(self.dataplane, str(self.repository), scheme="embedded")
