"""A real MLServer for interop tests (loadtests/harness/_mlserver.py starts it) serving the echo model, from
``.venv-mlserver/``, which ``ensure_env()`` creates at the repository root once (``python -m venv`` and uv, see
tests/_venvs.py).
"""

from __future__ import annotations

import json
from pathlib import Path

from loadtests.harness import _mlserver
from loadtests.harness._mlserver import REQUIREMENTS, VENV
from tests._venvs import ensure_venv

__all__ = ["VENV", "MLServerProcess", "ensure_env"]


ECHO_MODEL = '''"""Echoes an FP32 tensor and a BYTES tensor, decoded and re-encoded with MLServer's codecs."""

from mlserver import MLModel
from mlserver.codecs import NumpyCodec, StringCodec
from mlserver.types import InferenceRequest, InferenceResponse, ResponseOutput


class EchoModel(MLModel):
    async def load(self) -> bool:
        return True

    async def predict(self, payload: InferenceRequest) -> InferenceResponse:
        by_name = {i.name: i for i in payload.inputs}
        numbers = NumpyCodec.decode_input(by_name["INPUT0"])
        text = by_name["TEXT"]
        words = StringCodec.decode_input(text)
        return InferenceResponse(
            model_name=self.name,
            id=payload.id,
            outputs=[
                NumpyCodec.encode_output("OUTPUT0", numbers),
                ResponseOutput(name="TEXT_OUT", datatype="BYTES", shape=text.shape, data=words),
            ],
        )
'''

ECHO_SETTINGS = {
    "name": "echo",
    "implementation": "model.EchoModel",
    "platform": "custom",
    "inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [-1, 4]},
        {"name": "TEXT", "datatype": "BYTES", "shape": [-1]},
    ],
    "outputs": [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 4]},
        {"name": "TEXT_OUT", "datatype": "BYTES", "shape": [-1]},
    ],
}


def ensure_env() -> Path:
    """The ``mlserver`` executable of ``.venv-mlserver/``, created when missing or stale (tests/_venvs.py)."""
    return ensure_venv(VENV, REQUIREMENTS, "mlserver")


class MLServerProcess(_mlserver.MLServerProcess):
    """``mlserver start`` on a folder holding ``settings.json`` and the echo model."""

    def write_folder(self) -> None:
        super().write_folder()
        model = self.folder / "echo"
        model.mkdir(exist_ok=True)
        (model / "model-settings.json").write_text(json.dumps(ECHO_SETTINGS, indent=2))
        (model / "model.py").write_text(ECHO_MODEL)
