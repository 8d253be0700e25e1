"""Writing ensemble configs and folders for the tests (Triton's layout: config.pbtxt and an empty ``1/``)."""

from __future__ import annotations

from pathlib import Path


def ensemble(name: str, inputs: str, outputs: str, steps: str, max_batch_size: int = 8, extra: str = "") -> str:
    """An ensemble config; ``inputs``/``outputs`` are ``NAME:TYPE:dims`` lists, ``steps`` the step entries."""

    def tensors(spec: str) -> str:
        rows = []
        for item in spec.split():
            tname, ttype, dims = item.split(":")
            rows.append(f'{{ name: "{tname}" data_type: TYPE_{ttype} dims: [ {dims} ] }}')
        return ", ".join(rows)

    return f"""name: "{name}"
platform: "ensemble"
max_batch_size: {max_batch_size}
input [ {tensors(inputs)} ]
output [ {tensors(outputs)} ]
ensemble_scheduling {{
  step [
{steps}
  ]
}}
{extra}"""


def step(model: str, inputs: dict[str, str], outputs: dict[str, str], version: int = -1) -> str:
    """One step entry: ``inputs`` maps model input -> ensemble tensor, ``outputs`` model output -> ensemble tensor."""
    ins = ", ".join(f'{{ key: "{k}" value: "{v}" }}' for k, v in inputs.items())
    outs = ", ".join(f'{{ key: "{k}" value: "{v}" }}' for k, v in outputs.items())
    return f'    {{ model_name: "{model}" model_version: {version} input_map [ {ins} ] output_map [ {outs} ] }}'


def write_ensemble(repo: Path, name: str, config: str) -> None:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)  # Triton's layout: an empty version folder
    (repo / name / "config.pbtxt").write_text(config)
