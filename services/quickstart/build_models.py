"""Rebuild the quickstart repository's small ONNX models (needs the dev extra for onnx).

    python services/quickstart/build_models.py

The files are tiny and committed, so serving the repository needs no build step.
"""

from __future__ import annotations

from pathlib import Path

from modelsvc.tools.onnx_models import add_sub, identity, token_classifier, write_model

REPO = Path(__file__).resolve().parent / "model_repository"

IDENTITY = """name: "identity"
platform: "onnxruntime_onnx"
max_batch_size: 32
input [ { name: "INPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_FP32 dims: [ 16 ] } ]
dynamic_batching { }
instance_group [ { count: 1 kind: KIND_CPU } ]
"""

TOKEN = """name: "token_classifier"
backend: "onnxruntime"
max_batch_size: 16
input [
  { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] },
  { name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }
]
output [ { name: "logits" data_type: TYPE_FP32 dims: [ 4 ] } ]
dynamic_batching { max_queue_delay_microseconds: 2000 }
"""


def main() -> None:
    write_model(REPO, "identity", identity(), IDENTITY)
    # add_sub ships without a config.pbtxt: modelsvc completes it from the ONNX graph, as Triton does.
    write_model(REPO, "add_sub", add_sub(), None)
    write_model(REPO, "token_classifier", token_classifier(vocab=500, hidden=32, layers=1), TOKEN)
    print(f"wrote models under {REPO}")


if __name__ == "__main__":
    main()
