"""``modelsvc compare A B``: two models (ONNX files, TensorRT plans, served models) on the same inputs.

Its imports of numpy, ONNX Runtime and the client happen inside ``run``, so building the parser stays cheap.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ._types import non_negative, tolerance

DEFAULT_ATOL = 1e-5
DEFAULT_RTOL = 1e-3


def add(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    c = commands.add_parser(
        "compare",
        help="run two models (ONNX, TensorRT plan, served model) on the same inputs and compare their outputs",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="""\
Run A and B on the same inputs and print, per output both give, the max absolute difference, the max
relative difference and whether it is within tolerance.

A and B are each one of:
  FILE.onnx                                  ONNX Runtime on the CPU
  FILE.plan, FILE.engine                     TensorRT on GPU 0 (needs pip install 'modelsvc[tensorrt]')
  http://HOST:PORT/v2/models/NAME[/versions/V]   a served model (modelsvc, Triton), over HTTP
  grpc://HOST:PORT/v2/models/NAME[/versions/V]   the same over gRPC

Both must take the same inputs (names and datatypes; INT32 on one side and INT64 on the other are cast,
and said so). Inputs are random and seeded, unless --npz gives them:
  dims: a dim the models fix keeps its size; --shape fixes an input's dims; a free dim of an input that
    no --shape names takes the size at the same position of the first --shape of the same rank, else 2
    for the first (batch) dim and 16 for any other; with a plan on either side and no --shape, the opt
    shapes of the plan's optimization profile 0
  values: floats standard normal; integers 0..99, except inputs named like *mask* (all ones) and
    *token_type* (all zeros); BOOL random (*mask*: all true); BYTES only from --npz

Max rel = max |a-b| / max(|b|, 1e-6). An output is within tolerance when |a-b| <= atol + rtol*|b| at every
element (numpy.allclose; NaN on both sides at one element is equal); outputs whose shapes differ fail.

Exit status: 0 every output within tolerance, 1 an output over it (or of another shape, or the models
take different inputs, or a model failed to run), 2 usage (a bad source, --shape, --npz or --outputs).""",
    )
    c.add_argument("a", metavar="A", help="the first model: a file or a served model's URL")
    c.add_argument("b", metavar="B", help="the second model, the reference of max rel")
    c.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME:AxB",
        help="the dims of input NAME (repeatable, or comma-separated); default: see above",
    )
    c.add_argument("--npz", type=Path, metavar="FILE", help="the inputs from FILE.npz, one array per input name")
    c.add_argument("--seed", type=non_negative, default=0, metavar="N", help="seed of the random inputs (default 0)")
    c.add_argument(
        "--atol",
        type=tolerance,
        default=DEFAULT_ATOL,
        metavar="X",
        help=f"absolute tolerance (default {DEFAULT_ATOL:g})",
    )
    c.add_argument(
        "--rtol",
        type=tolerance,
        default=DEFAULT_RTOL,
        metavar="X",
        help=f"relative tolerance (default {DEFAULT_RTOL:g})",
    )
    c.add_argument(
        "--outputs", nargs="+", default=None, metavar="NAME", help="compare only these outputs (default: all common)"
    )


def _say(line: str) -> None:
    print(f"modelsvc compare: {line}", file=sys.stderr, flush=True)


def run(args: argparse.Namespace) -> int:
    from ..tools.compare import (
        CompareError,
        Runner,
        UsageError,
        common_inputs,
        compare_runners,
        load_npz,
        open_runner,
        parse_shapes,
        random_feeds,
        render_table,
    )

    runners: list[Runner] = []
    try:
        if args.npz is not None and args.shape:
            raise UsageError("--shape and --npz exclude each other: the .npz arrays have their shapes")
        shapes = parse_shapes(args.shape)
        for source in (args.a, args.b):
            runners.append(open_runner(source))
        a, b = runners
        inputs, notes = common_inputs(a.inputs, b.inputs)
        if args.npz is not None:
            feeds, npz_notes = load_npz(args.npz, inputs)
            notes = [*npz_notes, *notes]
        else:
            if not shapes:  # a plan's profile: its opt shapes, which the plan is sure to accept
                for runner in runners:
                    shapes.update(getattr(runner, "opt_shapes", {}))
                if shapes:
                    notes.append("shapes: the opt shapes of the plan's optimization profile (--shape overrides)")
            feeds = random_feeds(inputs, shapes, args.seed)
        for note in notes:
            _say(note)
        described = ", ".join(f"{name} {'x'.join(map(str, v.shape))} {v.dtype}" for name, v in feeds.items())
        origin = f"from {args.npz}" if args.npz is not None else f"random, seed {args.seed}"
        print(f"inputs ({origin}): {described}")
        report = compare_runners(a, b, feeds, args.atol, args.rtol, outputs=args.outputs)
    except CompareError as exc:
        _say(str(exc))
        return exc.exit_status
    finally:
        for runner in runners:
            runner.close()
    print(f"A: {args.a}\nB: {args.b}\natol {args.atol:g}, rtol {args.rtol:g}")
    sys.stdout.write(render_table(report))
    for side, names in (("A", report.only_a), ("B", report.only_b)):
        if names:
            print(f"only {side} gives (not compared): {', '.join(names)}")
    if report.passed:
        print(f"ok: {len(report.outputs)} output(s) within tolerance")
        return 0
    print(f"FAILED: {', '.join(report.failed)} outside tolerance or of another shape")
    return 1
