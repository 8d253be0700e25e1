"""``logicd plan`` and modelsvc's ingest workers: a model measured with ``--workers N`` (``ingest_workers``) asks for
a CPU for each worker and one for the engine in its pod's request, is priced with them, and its values set
``model.workers`` as measured (issue 28)."""

from __future__ import annotations

from pathlib import Path

import pytest

from logicd._cli import main
from logicd.plan import Planned, example_plan, parse_plan, plan_all
from logicd.plan._values import values_for, values_option

ROOT = Path(__file__).resolve().parents[2]
MODEL = "      resources: {cpu: 2, memory: 8Gi, gpu: 1}\n"


def with_workers(workers: str) -> str:
    text = example_plan()
    assert MODEL in text
    return text.replace(MODEL, MODEL + f"      ingest_workers: {workers}\n", 1)


def planned(text: str) -> Planned:
    return plan_all(parse_plan(text, "plan.yaml"), ROOT, "plan.yaml", sensitive=False)


def model_pod_cpu(p: Planned, option: str) -> int:
    deployment = next(
        d for d in p.option(option).deployments if d.pod.service == "doc-classifier" and d.pod.half == "model"
    )
    return deployment.pod.cpu


def test_the_model_pod_requests_a_cpu_per_worker_and_one_for_the_engine() -> None:
    plain, seven, one = planned(example_plan()), planned(with_workers("7")), planned(with_workers("1"))
    option = values_option(plain).name
    assert model_pod_cpu(plain, option) == 2000
    assert model_pod_cpu(seven, option) == 8000  # 7 workers + the engine, over the 2 CPUs the plan gave
    assert model_pod_cpu(one, option) == 2000  # 1 worker + the engine fit the 2 CPUs already requested
    assert seven.option(option).cost_peak >= plain.option(option).cost_peak
    values = values_for(seven, "doc-classifier", seven.option(option))
    assert values["model"]["workers"] == 7
    assert values["model"]["resources"]["requests"]["cpu"] == "8"
    assert "workers" not in values_for(plain, "doc-classifier", plain.option(option))["model"]  # the chart's auto


@pytest.mark.parametrize("bad", ["-1", "2.5", "'four'", "5000"])
def test_a_bad_worker_count_is_one_line_and_exit_2(
    bad: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(with_workers(bad))
    assert main(["plan", str(plan)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "ingest_workers" in err
