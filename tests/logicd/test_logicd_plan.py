"""``logicd plan`` (logicd.plan): the plan file's checks, capacity from a sweep's results.json, the bin packing's
edge cases, the example's shape (split with packing cheapest, the naive move sized fairly just above it, before
dearest), the CLI's exit status and outputs (in-process). The closed-form packing against pod-by-pod placement is
in test_logicd_plan_pack.py, accelerators side by side and break-even in test_logicd_plan_accelerators.py, bad
numbers in test_logicd_plan_numbers.py, the values rendered by the chart in tests/deploy/test_plan_values.py; the
README's commands run as a subprocess in tests/test_readme.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any
from xml.etree import ElementTree

import pytest
import yaml

from loadtests import loadgen, sweep
from logicd._cli import main
from logicd.plan import PlanError, Planned, as_json, example_plan, parse_plan, plan_all
from logicd.plan._pack import Node, expand, reserved_cpu, reserved_memory

ROOT = Path(__file__).resolve().parents[2]

NODES = """
node_types:
  - {name: cpu4, vcpus: 4, memory: 16Gi, price_per_hour: 0.2, allocatable: {cpu: 4, memory: 8Gi}}
  - {name: gpu8, vcpus: 8, memory: 32Gi, gpus: 1, price_per_hour: 1.0, allocatable: {cpu: 8, memory: 16Gi}}
cluster: {headroom: 0, min_replicas: 1, daemonsets: {cpu: 0, memory: 0Mi}, gpu_daemonsets: {cpu: 0, memory: 0Mi}}
"""


def planned(text: str, base: Path = ROOT, sensitive: bool = False) -> Planned:
    return plan_all(parse_plan(text, "plan.yaml"), base, "plan.yaml", sensitive=sensitive)


def fails(text: str, base: Path = ROOT) -> str:
    with pytest.raises(PlanError) as info:
        planned(text, base)
    return str(info.value)


def pods_on(nodes: list[Node]) -> list[list[str]]:
    """Each node (groups expanded) as the sorted labels of its pods."""
    return [sorted(p.label for p, n in node.pods.items() for _ in range(n)) for node in expand(nodes)]


# --- the example ------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def example() -> Planned:
    return planned(example_plan())


def test_the_example_reproduces_the_shape_of_the_move(example: Planned) -> None:
    """From the inputs alone: before (CPU only) is dearest; split with packing is cheapest; the naive move, a
    monolith per GPU node holding the logic workers that keep its GPU busy, costs only a little more."""
    cost = {o.name: o.cost_peak for o in example.options if not o.unavailable}
    assert cost["cpu-only"] > cost["monolith-per-gpu-node"] > cost["split-packed"]
    assert cost["monolith-per-gpu-node"] < 1.05 * cost["split-packed"]
    assert min(cost, key=cost.__getitem__) == "split-packed"
    naive = example.option("monolith-per-gpu-node")
    gpu_nodes = [n for n in expand(naive.nodes_peak) if n.shape.gpu]
    monolith = next(d for d in naive.deployments if d.pod.half == "monolith")
    # g5.2xlarge leaves 7410m beside the model's 2 CPUs for 5 one-CPU workers of 20 req/s: the model's 100 req/s
    assert monolith.capacity_rps == 100
    assert monolith.pod.cpu == 2000 + 5 * 1000
    assert monolith.note == "5 logic worker(s) beside the model"
    assert len(gpu_nodes) == monolith.peak == 6  # ceil(400 / (100 x 0.75))
    assert all(sum(n.pods.values()) == 1 for n in gpu_nodes)
    split = example.option("split-packed")
    on_gpu = [p for n in split.nodes_peak if n.shape.gpu for p in n.pods if not p.gpu]
    assert {p.half for p in on_gpu} >= {"logic", "model"}  # logic pods and CPU models on GPU nodes' spare CPUs
    assert all(o.cost_average < o.cost_peak for o in example.options if not o.unavailable)


def test_allocatable_follows_the_gke_or_the_eks_reservation() -> None:
    assert reserved_cpu(4000) == 80  # 6 % + 1 % + 2 x 0.5 % of a core
    assert reserved_cpu(8000) == 90
    assert abs(reserved_memory(16 * 2**30) - (2.6 * 2**30 + 100 * 2**20)) <= 1  # 1 + 0.8 + 0.8 GiB + eviction
    assert reserved_memory(16 * 2**30, "eks", 29) == (11 * 29 + 255 + 100) * 2**20  # per pod, not per GiB
    node = "  - {name: g, vcpus: 4, memory: 16Gi, max_pods: 29, price_per_hour: 1}\n"
    base = "services:" + cpu_service(peak=1)
    gke = planned("node_types:\n" + node + base).shapes[0]
    eks = planned("cluster: {kubelet_reservation: eks}\nnode_types:\n" + node + base).shapes[0]
    daemonsets = (512) * 2**20
    assert gke.memory == 16 * 2**30 - reserved_memory(16 * 2**30) - daemonsets
    assert eks.memory == 16 * 2**30 - (11 * 29 + 255 + 100) * 2**20 - daemonsets
    assert gke.cpu == eks.cpu == 4000 - 80 - 300


# --- bin packing ------------------------------------------------------------------------------------------


def cpu_service(
    name: str = "s", peak: float = 4, cpu: str = "1", memory: str = "2Gi", pod: str = "", **extra: Any
) -> str:
    more = "".join(f"\n    {k}: {v}" for k, v in extra.items())
    return f"""
  - name: {name}
    kind: cpu
    peak_rps: {peak}
    latency_budget_ms: 100{more}
    pod: {{resources: {{cpu: {cpu}, memory: {memory}}}, capacity: {{rps: 1}}{pod}}}"""


def test_exactly_full_nodes() -> None:
    """Four 1-CPU 2Gi pods fill a node of allocatable 4 CPU and 8Gi exactly; a fifth opens a second node."""
    full = planned(NODES + "services:" + cpu_service(peak=4)).option("split-packed")
    assert [n.shape.name for n in full.nodes_peak] == ["cpu4"]
    assert (full.nodes_peak[0].cpu, full.nodes_peak[0].memory) == (4000, 8 * 2**30)
    over = planned(NODES + "services:" + cpu_service(peak=5)).option("split-packed")
    assert [len(p) for p in pods_on(over.nodes_peak)] == [4, 1]


def test_a_part_filled_node_becomes_the_cheapest_type_that_holds_its_pods() -> None:
    small = "  - {name: cpu1, vcpus: 1, memory: 4Gi, price_per_hour: 0.06, allocatable: {cpu: 1, memory: 2Gi}}\n"
    text = NODES.replace("cluster:", small + "cluster:") + "services:" + cpu_service(peak=5)
    nodes = planned(text).option("split-packed").nodes_peak
    assert sorted((n.shape.name, sum(n.pods.values())) for n in expand(nodes)) == [
        ("cpu1", 1),
        ("cpu4", 4),
    ]  # $0.26, not 5 x cpu1


def test_a_pod_bigger_than_every_node_names_the_service() -> None:
    message = fails(NODES + "services:" + cpu_service(name="huge", cpu="9"))
    assert message == fails(NODES + "services:" + cpu_service(name="huge", cpu="9", peak=0, min_replicas=0))
    assert "services[0] (huge)" in message
    assert "huge/pod" in message
    assert "cpu 9" in message
    assert "no node type holds" in message
    assert "lower the pod's requests" in message


def test_a_zero_traffic_service_gets_its_minimum_replicas() -> None:
    text = NODES + "services:" + cpu_service(name="idle", peak=0) + cpu_service(name="unused", peak=0, min_replicas=0)
    p = planned(text)
    split = p.option("split-packed")
    assert {d.pod.service: d.peak for d in split.deployments} == {"idle": 1, "unused": 0}
    assert pods_on(split.nodes_peak) == [["idle/pod"]]
    assert all(d.headroom is None for d in split.deployments)
    empty = planned(NODES + "services:" + cpu_service(peak=0, min_replicas=0))
    assert empty.option("split-packed").nodes_peak == []
    assert empty.peak_rps == 0
    out = json.dumps(as_json(empty))
    assert '"peak": null' in out  # $/1M requests without requests


PAIR = """
  - name: pair
    peak_rps: 100
    latency_budget_ms: 100
    logic: {resources: {cpu: 1, memory: 1Gi}, capacity: {rps: 25}}
    model: {resources: {cpu: 2, memory: 4Gi, gpu: 1}, capacity: {rps: 100}}"""


def test_gpu_pods_only_on_gpu_nodes_and_cpu_pods_on_their_spare_cpus() -> None:
    p = planned(NODES + "services:" + PAIR + cpu_service(name="side", peak=2))
    split = p.option("split-packed")
    # the model pod on the GPU node, the 4 logic pods and the 2 CPU pods on its spare 6 CPUs: no CPU node opened
    assert pods_on(split.nodes_peak) == [["pair/logic"] * 4 + ["pair/model"] + ["side/pod"] * 2]
    naive = p.option("monolith-per-gpu-node")
    # the monolith holds the model and the 4 logic workers (of 25 req/s) that keep it busy: one, alone on a GPU
    # node, serves the 100 req/s; the CPU service on a CPU node
    assert sorted(n.shape.name for n in expand(naive.nodes_peak)) == ["cpu4", "gpu8"]
    (monolith,) = [d for d in naive.deployments if d.pod.half == "monolith"]
    assert (monolith.pod.cpu, monolith.capacity_rps, monolith.peak) == (2000 + 4 * 1000, 100, 1)
    assert p.option("cpu-only").unavailable == "pair's model needs an accelerator and has no model.on_cpu"


def test_max_pods_and_node_type_restrictions() -> None:
    text = NODES.replace("price_per_hour: 0.2,", "price_per_hour: 0.2, max_pods: 2,") + "services:"
    assert [len(p) for p in pods_on(planned(text + cpu_service(peak=3)).option("split-packed").nodes_peak)] == [2, 1]
    pinned = planned(NODES + "services:" + cpu_service(peak=1, pod=", node_types: [gpu8]")).option("split-packed")
    assert [n.shape.name for n in pinned.nodes_peak] == ["gpu8"]


# --- capacity from a sweep --------------------------------------------------------------------------------


def result(infer_per_s: float, p99_ms: float, errors: int = 0) -> loadgen.Result:
    return loadgen.Result(
        protocol="http", url="http://x", model="m", concurrency=1, request_rate=None, batch_size=1, seconds=1.0,
        requests=int(infer_per_s), throughput=infer_per_s, infer_per_s=infer_per_s,
        latency_ms={"p50": p99_ms / 2, "p90": p99_ms, "p95": p99_ms, "p99": p99_ms, "avg": p99_ms / 2,
                    "min": 0.0, "max": p99_ms},
        errors={"http 503": errors} if errors else {}, windows=1, stable=True,
    )  # fmt: skip


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sweep's results.json as loadtests.sweep writes it (its write_outputs, the plots left out)."""
    out = tmp_path_factory.mktemp("sweep")
    a, b = sweep.Config(1, 8, 0), sweep.Config(2, 8, 500)
    rows = [
        sweep.Row(a, 1, result(400, 5.0)),
        sweep.Row(a, 8, result(900, 30.0)),
        sweep.Row(b, 8, result(1600, 60.0)),
        sweep.Row(b, 16, result(2000, 20.0, errors=3)),
        sweep.Row(b, 32, None, "RuntimeError: modelsvc exited"),
    ]
    plot, sweep.plot_comparison = sweep.plot_comparison, lambda *args: []  # type: ignore[assignment]
    plot_one, loadgen.plot = loadgen.plot, lambda *args, **kw: None  # type: ignore[assignment]
    try:
        repo = tmp_path_factory.mktemp("repo")
        (repo / "m").mkdir()
        (repo / "m" / "config.pbtxt").write_text('name: "m"\nmax_batch_size: 8\n')
        sweep.write_outputs(out, rows, sweep.choose(rows, 50.0), 50.0, repo, "m", "python -m loadtests.sweep")
    finally:
        sweep.plot_comparison, loadgen.plot = plot, plot_one  # type: ignore[assignment]
    return out


def swept(budget: float, sweep_path: str) -> str:
    return (
        NODES
        + f"""services:
  - name: m
    kind: model
    peak_rps: 100
    latency_budget_ms: {budget}
    model:
      resources: {{cpu: 2, memory: 4Gi}}
      inferences_per_request: 2
      capacity: {{sweep: {sweep_path}}}"""
    )


def test_capacity_is_the_best_row_within_the_budget(sweep_dir: Path) -> None:
    p = planned(swept(50, sweep_dir.name), sweep_dir.parent)  # relative to the plan's folder
    cap = p.services[0].halves["model"].capacity
    assert cap.rps == 450  # 900 infer/s within 50 ms (not the errored 2,000), 2 inferences per request
    assert "i1_mbs8_d0 at concurrency 8" in cap.source
    assert planned(swept(100, str(sweep_dir / "results.json"))).services[0].halves["model"].capacity.rps == 800


def test_a_budget_below_the_measured_minimum_names_the_service(sweep_dir: Path) -> None:
    message = fails(swept(2, str(sweep_dir)))
    assert "services[0] (m).model" in message
    assert "below the smallest p99 the sweep measured (5.00 ms" in message
    assert "raise the budget" in message


@pytest.mark.parametrize(
    ("capacity", "expected"),
    [
        ("{}", "model.capacity: missing measurements: measure it with `python -m loadtests.sweep"),
        ("{sweep: nowhere}", "model.sweep: cannot read"),
        ("{sweep: x, rps: 3}", "give `sweep` or `rps`, not both"),
        ("{rps: 3, p99_ms: 500}", "model.capacity.p99_ms: 500 ms is above the service's latency_budget_ms 100"),
    ],
)
def test_missing_or_bad_measurements(capacity: str, expected: str, tmp_path: Path) -> None:
    text = swept(100, "x").replace("{sweep: x}", capacity)
    assert expected in fails(text, tmp_path)


# --- bad input --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (("peak_rps: 100", "peak_rps: 100\n    colour: red"), "services[0] (pair): unknown field `colour`"),
        (("gpu: 1}", "gpu: 1}, node_types: [gpu9]"), "pair).model.node_types: unknown node type 'gpu9'"),
        (("memory: 4Gi", "memory: 4"), "model.resources.memory: a memory quantity has a unit, like '512Mi'"),
        (("peak_rps: 100", "peak_rps: 100\n    average_rps: 200"), "average_rps: 200 is above peak_rps 100"),
        (("kind: cpu", "kind: model"), "(s): kind model needs `model`"),
        (("cpu: 1, memory: 1Gi", "cpu: lots, memory: 1Gi"), "logic.resources.cpu: a CPU quantity is a number"),
        (("name: s", "name: pair"), "service 'pair' is listed twice"),
        (("kind: cpu", "kind: gpu"), "services[1] (s).kind: 'gpu' is not a kind: pair (logic + model), model or cpu"),
        (("vcpus: 4,", "cpus: 4,"), "node_types[0] (cpu4): unknown field `cpus`"),
    ],
)
def test_bad_input_names_the_field(edit: tuple[str, str], expected: str) -> None:
    text = NODES + "services:" + PAIR + cpu_service()
    assert edit[0] in text
    assert expected in fails(text.replace(edit[0], edit[1], 1))


def test_the_cli_exits_2_naming_what_to_change(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "plan.yaml"
    bad.write_text("services: [\n  - a: b\n")
    assert main(["plan", str(bad)]) == 2
    assert "plan.yaml:2:3: invalid YAML" in capsys.readouterr().err
    bad.write_text(NODES + "services:" + cpu_service(name="huge", cpu="9"))
    assert main(["plan", str(bad)]) == 2
    assert "services[0] (huge): huge/pod: a pod requests cpu 9" in capsys.readouterr().err
    assert main(["plan"]) == 2
    assert "logicd plan --example > plan.yaml" in capsys.readouterr().err
    assert main(["plan", str(bad), "--picture", "plan.png"]) == 2
    assert "--picture writes SVG: name a .svg file" in capsys.readouterr().err
    assert main(["plan", "--example", "nope"]) == 2
    assert "--example 'nope': the examples are default, accelerators" in capsys.readouterr().err
    bad.write_text(example_plan())
    values = tmp_path / "values"
    assert main(["plan", str(bad), "--write-values", str(values), "--values-option", "cpu-only"]) == 2
    err = capsys.readouterr().err
    assert (
        "--values-option: 'cpu-only' is not an available split-packed option of this plan; it has split-packed" in err
    )
    assert len(err.strip().splitlines()) == 1
    assert not values.exists()  # refused before anything is written
    bad.write_text(NODES.replace("gpus: 1,", "gpus: 1, accelerators: {aws.amazon.com/neuron: 1},") + "services:"
                   + PAIR.replace("gpu: 1}", "gpu: 1, accelerators: {aws.amazon.com/neuron: 1}}"))  # fmt: skip
    assert main(["plan", str(bad), "--summary", "--write-values", str(values)]) == 2
    err = capsys.readouterr().err
    assert err == "logicd plan: pair: helm/ml-service gives a model pod one kind of accelerator, this one asks for " \
        "aws.amazon.com/neuron, nvidia.com/gpu\n"  # fmt: skip


def test_the_cli_writes_table_json_picture_and_values(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plan = tmp_path / "plan.yaml"
    assert main(["plan", "--example"]) == 0
    plan.write_text(capsys.readouterr().out)
    assert main(["plan", str(plan), "--summary"]) == 0
    table = capsys.readouterr().out
    assert "cheapest at peak: split-packed" in table
    assert "monolith-per-gpu-node" in table
    svg, values = tmp_path / "plan.svg", tmp_path / "values"
    assert main(["plan", str(plan), "--json", "--picture", str(svg), "--write-values", str(values)]) == 0
    out = capsys.readouterr()
    data = json.loads(out.out)
    assert [o["name"] for o in data["options"]] == [
        "cpu-only", "monolith-per-gpu-node", "split-packed", "shared-model-service",
    ]  # fmt: skip
    assert ElementTree.parse(svg).getroot().tag.endswith("svg")
    services = yaml.safe_load(plan.read_text())["services"]
    assert sorted(p.stem for p in values.glob("*.yaml")) == sorted(s["name"] for s in services)
    assert data["sensitivity"]["traffic"]["levels"][0] == "average"
    assert {o["name"]: o["cost_per_hour"]["average"] for o in data["options"] if not o["unavailable"]} == {
        name: pytest.approx(row[0], abs=1e-4) for name, row in data["sensitivity"]["traffic"]["cost_per_hour"].items()
    }  # the table's average column is each option's own average sizing
