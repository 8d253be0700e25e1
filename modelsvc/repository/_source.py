"""What the repository hands the model manager: one model's directory, completed config and versions."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from modelsvc.backends import DEFAULT_MODEL_FILENAMES, ModelConfig, backend_name


@dataclass
class ModelSource:
    """A model found in the repository, ready to be loaded."""

    #: the model's name (its directory's name)
    name: str
    #: the model's directory, ``<repository>/<name>``
    path: Path
    #: the completed configuration, as GET /v2/models/<name>/config shows it
    config: ModelConfig
    #: the versions the version policy selects, ascending
    versions: list[int] = field(default_factory=list)

    def artifact(self, version: int) -> Path:
        """The model file of ``version``: ``default_model_filename``, else the backend's default name.

        onnxruntime -> model.onnx, tensorrt -> model.plan, python -> model.py, pytorch -> model.pt;
        a backend without a default file name gets the version directory itself.
        """
        version_dir = self.path / str(version)
        if self.config.default_model_filename:
            return version_dir / str(self.config.default_model_filename)
        filename = DEFAULT_MODEL_FILENAMES.get(backend_name(self.config) or "")
        return version_dir / filename if filename else version_dir
