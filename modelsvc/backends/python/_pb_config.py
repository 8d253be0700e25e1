"""pb_utils model-configuration helpers: ``ModelConfig`` (what ``auto_complete_config`` receives, changes and
returns) and the readers of a config dict (``get_input_config_by_name`` and the like)."""

from __future__ import annotations

import json
from typing import Any


def get_input_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The ``input`` entry called ``name`` of a model config dict (``json.loads(args["model_config"])``)."""
    return next((entry for entry in model_config.get("input", []) if entry.get("name") == name), None)


def get_output_config_by_name(model_config: dict[str, Any], name: str) -> dict[str, Any] | None:
    """The ``output`` entry called ``name`` of a model config dict."""
    return next((entry for entry in model_config.get("output", []) if entry.get("name") == name), None)


def using_decoupled_model_transaction_policy(model_config: dict[str, Any]) -> bool:
    return bool(model_config.get("model_transaction_policy", {}).get("decoupled", False))


_INPUT_KEYS = frozenset({"name", "data_type", "dims", "optional"})
_OUTPUT_KEYS = frozenset({"name", "data_type", "dims"})


class ModelConfig:
    """The model configuration that ``auto_complete_config`` receives, changes and returns.

    ``as_dict()`` gives the configuration as Triton's JSON (a dict); the setters change it, and the
    returned object becomes the model's configuration.
    """

    def __init__(self, model_config: str | dict[str, Any]) -> None:
        config = json.loads(model_config) if isinstance(model_config, str) else model_config
        config.setdefault("name", "")
        config.setdefault("max_batch_size", 0)
        config.setdefault("input", [])
        config.setdefault("output", [])
        self._config: dict[str, Any] = config

    def as_dict(self) -> dict[str, Any]:
        return self._config

    def set_max_batch_size(self, max_batch_size: int) -> None:
        """Set ``max_batch_size``; ValueError when the configuration already says more."""
        if self._config["max_batch_size"] > max_batch_size:
            raise ValueError(
                f"configuration specified max_batch_size {self._config['max_batch_size']}, but "
                f"auto_complete_config of model '{self._config['name']}' sets {max_batch_size}"
            )
        self._config["max_batch_size"] = max_batch_size

    def set_dynamic_batching(self) -> None:
        """Add an empty ``dynamic_batching`` unless there is one; ValueError with another scheduler."""
        for other in ("sequence_batching", "ensemble_scheduling"):
            if other in self._config:
                raise ValueError(
                    f"configuration of model '{self._config['name']}' sets {other}; auto_complete_config "
                    "cannot add dynamic_batching"
                )
        self._config.setdefault("dynamic_batching", {})

    def add_input(self, input: dict[str, Any]) -> None:  # Triton's parameter name
        self._add("input", input, _INPUT_KEYS)

    def add_output(self, output: dict[str, Any]) -> None:
        self._add("output", output, _OUTPUT_KEYS)

    def set_model_transaction_policy(self, transaction_policy_dict: dict[str, Any]) -> None:
        unknown = set(transaction_policy_dict) - {"decoupled"}
        if unknown:
            raise ValueError(f"model_transaction_policy has no field(s) {sorted(unknown)}")
        self._config["model_transaction_policy"] = dict(transaction_policy_dict)

    def _add(self, kind: str, entry: dict[str, Any], allowed: frozenset[str]) -> None:
        model = self._config["name"]
        name = entry.get("name")
        if name is None:
            raise ValueError(f"{kind} in auto_complete_config of model '{model}' has no 'name'")
        extra = set(entry) - allowed
        if extra:
            raise ValueError(
                f"{kind} '{name}' in auto_complete_config of model '{model}' has unknown properties "
                f"{sorted(extra)} (allowed: {sorted(allowed)})"
            )
        for key in ("data_type", "dims"):
            if key not in entry:
                raise ValueError(f"{kind} '{name}' in auto_complete_config of model '{model}' has no '{key}'")
        for existing in self._config[kind]:
            if existing.get("name") != name:
                continue
            listed = existing.get("data_type", "TYPE_INVALID")
            if listed != "TYPE_INVALID" and listed != entry["data_type"]:
                raise ValueError(
                    f"model '{model}': the configuration says {listed} for {kind} '{name}', "
                    f"auto_complete_config says {entry['data_type']}"
                )
            dims = existing.get("dims")
            if dims and list(dims) != list(entry["dims"]):
                raise ValueError(
                    f"model '{model}': the configuration says dims {list(dims)} for {kind} '{name}', "
                    f"auto_complete_config says {list(entry['dims'])}"
                )
            existing.update(entry)
            return
        self._config[kind].append(dict(entry))
