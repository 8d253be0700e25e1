"""The benchmark suite's rows on modelsvc alone: served vs the in-process ONNX Runtime ceiling, and dynamic
batching on vs off, on bench_core's transformer-shaped model; and the model repository they share with the peer
rows (triton, mlserver)."""

from __future__ import annotations

from pathlib import Path

from loadtests import bench_core
from loadtests.harness import _perf, _servers
from loadtests.harness._perf import Input
from loadtests.suite._rows import Row, Settings, median, spread, v2_point

BATCHING_CONCURRENCY = 8
TOK_DYN_CONFIG = "dynamic_batching { }\n"

# ---------------------------------------------------------------------------------------------------------
# the model repository shared by ceiling, batching and triton/mlserver (modelsvc side)


def write_repo(repo: Path) -> None:
    """bench_core's repository (identity, tok_batched, tok_tuned, tok_unbatched) plus ``tok_dyn``: the same model
    with a bare ``dynamic_batching {}``."""
    from modelsvc.tools.onnx_models import token_classifier, write_model

    bench_core.write_modelsvc_repo(repo)
    tok = token_classifier(
        vocab=bench_core.TOK_VOCAB, hidden=bench_core.TOK_HIDDEN, labels=bench_core.TOK_LABELS,
        layers=bench_core.TOK_LAYERS,
    )  # fmt: skip
    config = bench_core.TOK_CONFIG.format(
        name="tok_dyn", max_batch=bench_core.TOK_MAX_BATCH, labels=bench_core.TOK_LABELS, batching=TOK_DYN_CONFIG
    )
    write_model(repo, "tok_dyn", tok, config)


def tok_request(workdir: Path) -> tuple[list[Input], Path]:
    inputs = [Input(k, "INT64", v) for k, v in bench_core.tok_inputs(1).items()]
    return inputs, _perf.write_input_json(workdir / "suite_tok_input.json", inputs, variants=8)


def bench_ceiling(server: _servers.ServerProcess, workdir: Path, settings: Settings) -> Row:
    inputs, data = tok_request(workdir)
    ratios, served_best, ceilings = [], [], []
    for i in range(settings.rounds):
        print(f"  ceiling round {i + 1}/{settings.rounds}", flush=True)
        points = [
            (c, v2_point(server, "tok_tuned", c, inputs, ["logits"], workdir, settings, data))
            for c in settings.served_concurrency
        ]
        best_c, best = max(points, key=lambda p: p[1].infer_per_s)
        batch, rows_per_s, _ = max(bench_core.in_process_ceiling(), key=lambda c: c[1])
        served_best.append((best_c, best.infer_per_s))
        ceilings.append((batch, rows_per_s))
        ratios.append(best.infer_per_s / rows_per_s)
    served = median([s for _, s in served_best]) or 0.0
    ceiling = median([c for _, c in ceilings]) or 0.0
    return Row(
        "served / in-process ceiling",
        f"{served:.0f} infer/s (tok_tuned, c={'/'.join(str(c) for c, _ in served_best)})",
        f"{ceiling:.0f} rows/s (batch {'/'.join(str(b) for b, _ in ceilings)})",
        median(ratios),
        f"token_classifier(hidden={bench_core.TOK_HIDDEN}, layers={bench_core.TOK_LAYERS}) 1x{bench_core.SEQ} int64; "
        f"rounds {spread(ratios)}",
        ratios,
    )


def bench_batching(server: _servers.ServerProcess, workdir: Path, settings: Settings) -> Row:
    inputs, data = tok_request(workdir)
    ratios, on, off = [], [], []
    c = BATCHING_CONCURRENCY
    for i in range(settings.rounds):
        print(f"  batching round {i + 1}/{settings.rounds}", flush=True)
        with_batching = v2_point(server, "tok_dyn", c, inputs, ["logits"], workdir, settings, data)
        without = v2_point(server, "tok_unbatched", c, inputs, ["logits"], workdir, settings, data)
        on.append(with_batching)
        off.append(without)
        ratios.append(with_batching.infer_per_s / without.infer_per_s)
    tool = on[0].tool
    return Row(
        "dynamic batching on / off",
        f"{median([r.infer_per_s for r in on]):.0f} infer/s, p50 {median([r.p50_ms for r in on]):.1f} ms",
        f"{median([r.infer_per_s for r in off]):.0f} infer/s, p50 {median([r.p50_ms for r in off]):.1f} ms",
        median(ratios),
        f"same model, dynamic_batching {{}} vs none, c={c}, {tool}; rounds {spread(ratios)}",
        ratios,
    )

