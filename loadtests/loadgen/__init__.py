"""Load generator for v2 inference endpoints (HTTP, gRPC) and for a service's REST routes.

Command line: ``python -m loadtests.loadgen --help``. Python API::

    from loadtests import loadgen

    target = loadgen.Target("http://127.0.0.1:8000", model="identity")       # or grpc://..., or rest=True
    inputs = loadgen.InputSpec("random", batch_size=1)                          # random | zero | FILE.json
    result = loadgen.run(target, loadgen.Load(concurrency=8, window_s=2.0), inputs)
    results = loadgen.sweep(target, [loadgen.Load(concurrency=c) for c in (1, 4, 16)], inputs)
    result.throughput, result.p(99), result.server.avg_batch, result.as_row(), result.as_dict()
    loadgen.write_csv(results, path); loadgen.write_json(results, path); loadgen.plot(results, path)

How it measures, as perf_analyzer does: after ``warmup_s`` of load, windows of ``window_s`` follow until the
last three have throughput and average latency within ±``stability_pct`` % of their mean (or ``max_windows``
pass, and the result says it is not stable), or exactly ``windows`` of them when that is set (``stable`` is then
None: not checked). The reported figures merge the last three windows (all of them with a fixed count). Closed
loop keeps ``concurrency`` requests outstanding; every request sent ends as a success or a counted error kind
(``client error: <Exception>`` when the generator itself failed); open loop (``request_rate``) sends at
exponential intervals and times each request from its scheduled send, so a generator or server that falls
behind shows in the latency (``late`` counts sends delayed over 1 ms, ``dropped`` those not sent because
``max_inflight`` were outstanding). For modelsvc or Triton targets the model's statistics are read around the
windows for the server-side split (None, with a note in ``Result.notes``, when they could not be read).
"""

from loadtests.loadgen._inputs import InputSpec, LoadgenError, Payloads, Target, parse_shape, prepare
from loadtests.loadgen._report import ProgressLine, format_table, plot, pyplot, write_csv, write_json
from loadtests.loadgen._runner import Load, Progress, Result, run, sweep
from loadtests.loadgen._stats import ServerCounters, ServerSplit, Window, is_stable, percentile

__all__ = [
    "InputSpec",
    "Load",
    "LoadgenError",
    "Payloads",
    "Progress",
    "ProgressLine",
    "Result",
    "ServerCounters",
    "ServerSplit",
    "Target",
    "Window",
    "format_table",
    "is_stable",
    "parse_shape",
    "percentile",
    "plot",
    "prepare",
    "pyplot",
    "run",
    "sweep",
    "write_csv",
    "write_json",
]
