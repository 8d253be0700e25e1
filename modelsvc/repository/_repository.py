"""A Triton model repository on disk: ``<root>/<model>/config.pbtxt`` and ``<root>/<model>/<version>/``."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path

from google.protobuf import text_format

from modelsvc.backends import (
    BACKEND_PLATFORMS,
    DEFAULT_MODEL_FILENAMES,
    PLATFORM_BACKENDS,
    ConfigMismatchError,
    ModelConfig,
    ModelLoadError,
    backend_name,
    get_backend,
    visible_gpus,
)

from ._ensemble import ENSEMBLE_PLATFORM, check_ensemble, is_ensemble
from ._errors import ConfigError
from ._locate import Locator
from ._source import ModelSource
from ._validate import fill_defaults, select_versions, validate

CONFIG_FILENAME = "config.pbtxt"

_PARSE_PREFIX = re.compile(r"^\d+:\d+ : ")
#: file suffix of a ``default_model_filename`` -> backend, for configs that name no backend
_SUFFIX_BACKENDS = {
    ".onnx": "onnxruntime",
    ".plan": "tensorrt",
    ".engine": "tensorrt",
    ".py": "python",
    ".pt": "pytorch",
    ".xml": "openvino",
}


def _version_dirs(model_dir: Path) -> list[int]:
    versions = []
    for child in model_dir.iterdir():
        if child.name.isdigit() and child.is_dir():
            versions.append(int(child.name))
    return sorted(versions)


class ModelRepository:
    """Reads models from a Triton-layout repository and completes their configs as Triton does.

    ``strict_model_config=True`` (tritonserver's ``--strict-model-config=true``) or
    ``autocomplete=False`` (``--disable-auto-complete-config``) turn auto-complete off: every model
    then needs a ``config.pbtxt`` that lists its inputs and outputs. ``gpus`` overrides the GPU ids
    taken as present (default: the GPUs visible to this process), which decide ``KIND_AUTO`` and the
    default instance group.
    """

    def __init__(
        self,
        root: Path | str,
        *,
        strict_model_config: bool = False,
        autocomplete: bool = True,
        gpus: Sequence[int] | None = None,
    ) -> None:
        self.root = Path(root)
        self.strict_model_config = strict_model_config
        self.autocomplete = autocomplete and not strict_model_config
        self.gpus: tuple[int, ...] = tuple(gpus) if gpus is not None else visible_gpus()

    def model_names(self) -> list[str]:
        """Sorted names of the directories that hold a model (a config.pbtxt or a version directory)."""
        if not self.root.is_dir():
            raise ConfigError(self.root, "the model repository is not a directory")
        names = []
        for child in self.root.iterdir():
            if child.name.startswith(".") or not child.is_dir():
                continue
            if (child / CONFIG_FILENAME).is_file() or _version_dirs(child):
                names.append(child.name)
        return sorted(names)

    def load(self, name: str) -> ModelSource:
        """Read, complete and check model ``name``; ConfigError says what is wrong and where."""
        if not name or name.startswith(".") or "/" in name or "\\" in name:
            raise ConfigError(self.root / name, f"'{name}' is not a model name")
        model_dir = self.root / name
        if not model_dir.exists():
            raise ConfigError(model_dir, f"model '{name}' not found in the repository")
        if not model_dir.is_dir():
            raise ConfigError(model_dir, "a model must be a directory")

        config_path = model_dir / CONFIG_FILENAME
        config, text = self._read(config_path)
        loc = Locator(config_path if text is not None else model_dir, text)

        if not config.name:
            config.name = name
        elif config.name != name:
            raise loc.error(
                f"the configuration names the model '{config.name}' but its directory is '{name}'",
                loc.field("name", top=True),
            )

        try:
            available = _version_dirs(model_dir)
        except OSError as exc:
            raise ConfigError(model_dir, f"cannot list the model directory: {exc}") from exc
        if not available:
            hint = " (an ensemble needs one too, empty)" if is_ensemble(config) else ""
            raise ConfigError(model_dir, f"the model has no version directories (numeric, like 1/){hint}")
        if not config.HasField("version_policy"):
            config.version_policy.latest.num_versions = 1
        versions = select_versions(config, available, loc)

        self._set_backend(config, model_dir, available, loc)
        source = ModelSource(name=name, path=model_dir, config=config, versions=versions)
        ensemble = is_ensemble(config)
        if self.autocomplete:
            validate(config, loc, require_io=False, complete=False)
            if not ensemble:  # an ensemble has no model file to complete from
                self._autocomplete(source, loc)
        fill_defaults(config, loc, self.gpus)
        validate(config, loc, require_io=not self.autocomplete)
        if ensemble:
            check_ensemble(config, loc)
        elif config.HasField("ensemble_scheduling"):
            raise loc.error(
                'ensemble_scheduling is only for ensembles (platform: "ensemble")',
                loc.field("ensemble_scheduling", top=True),
            )
        return source

    # --- steps ---

    def _read(self, config_path: Path) -> tuple[ModelConfig, str | None]:
        config = ModelConfig()
        if not config_path.exists():
            if not self.autocomplete:
                raise ConfigError(
                    config_path,
                    "no config.pbtxt, and auto-complete is disabled (--strict-model-config or "
                    "--disable-auto-complete-config)",
                )
            return config, None
        try:
            text = config_path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(config_path, f"cannot read the configuration: {exc}") from exc
        try:
            text_format.Parse(text, config)
        except text_format.ParseError as exc:
            message = _PARSE_PREFIX.sub("", str(exc))
            line, column = exc.GetLine(), exc.GetColumn()
            raise ConfigError(config_path, message, line if line else None, column if line else None) from exc
        return config, text

    def _set_backend(self, config: ModelConfig, model_dir: Path, available: Sequence[int], loc: Locator) -> None:
        """Find the backend (from platform, backend or the model file), fill both names, check it exists."""
        if config.platform and config.backend:
            implied = PLATFORM_BACKENDS.get(config.platform)
            if implied is not None and implied != config.backend:
                raise loc.error(
                    f"platform '{config.platform}' and backend '{config.backend}' disagree",
                    loc.field("backend", top=True),
                )
        found = backend_name(config)
        if found is None:
            found = self._detect_backend(config, model_dir, available)
            if found is None:
                known = ", ".join(DEFAULT_MODEL_FILENAMES.values())
                raise loc.error(
                    f"the configuration sets no platform or backend, and no version directory holds a "
                    f"model file that implies one ({known})"
                )
        if found == ENSEMBLE_PLATFORM:  # no backend: its steps run on the composing models' (Triton shows "")
            config.platform = ENSEMBLE_PLATFORM
            return
        if not config.backend:
            config.backend = found
        if not config.platform and found in BACKEND_PLATFORMS:
            config.platform = BACKEND_PLATFORMS[found]
        try:
            get_backend(config)
        except ModelLoadError as exc:
            where = loc.field("backend", top=True) if loc.text else None
            if where is None and loc.text:
                where = loc.field("platform", top=True)
            raise loc.error(str(exc), where) from exc

    @staticmethod
    def _detect_backend(config: ModelConfig, model_dir: Path, available: Sequence[int]) -> str | None:
        if config.default_model_filename:
            return _SUFFIX_BACKENDS.get(Path(config.default_model_filename).suffix)
        for version in sorted(available, reverse=True):
            for backend, filename in DEFAULT_MODEL_FILENAMES.items():
                if (model_dir / str(version) / filename).exists():
                    return backend
        return None

    def _autocomplete(self, source: ModelSource, loc: Locator) -> None:
        config = source.config
        artifact = source.artifact(source.versions[-1])
        backend = get_backend(config)
        try:
            backend.autocomplete(config, artifact)
        except ConfigMismatchError as exc:
            where = None
            if exc.tensor is not None:
                where = loc.tensor(("input", "output"), exc.tensor, exc.field)
            elif exc.field is not None:
                where = loc.field(exc.field, top=True)
            raise loc.error(str(exc), where) from exc
        except ModelLoadError as exc:
            raise loc.error(f"auto-complete failed: {exc}") from exc
