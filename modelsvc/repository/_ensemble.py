"""An ensemble's configuration read as a graph of steps, and the checks that need nothing but the config.

An ensemble (``platform: "ensemble"``) has no model file and no instances: its ``ensemble_scheduling``
lists steps, each naming a composing model, which of the model's inputs read which ensemble tensors
(``input_map``: model input -> ensemble tensor) and which ensemble tensors its outputs become
(``output_map``: model output -> ensemble tensor). Ensemble tensors are the ensemble's own inputs and
whatever the steps produce; the ensemble's outputs are ensemble tensors too.

:func:`plan_ensemble` checks what the config alone can tell (every step reads tensors that exist,
every ensemble output is produced, each tensor is produced once, no step waits on itself through a
cycle) and gives the steps in an order that runs every producer before its readers. What needs the
composing models themselves (their inputs, outputs, datatypes, dims, batching) is checked when the
ensemble loads, after them.
"""

from __future__ import annotations

from dataclasses import dataclass

from modelsvc.backends import ModelConfig, backend_name

from ._locate import Locator

ENSEMBLE_PLATFORM = "ensemble"


def is_ensemble(config: ModelConfig) -> bool:
    """Whether ``config`` describes an ensemble (``platform: "ensemble"``)."""
    return backend_name(config) == ENSEMBLE_PLATFORM


class EnsembleConfigError(ValueError):
    """An ensemble configuration that cannot run; ``step`` (an index) and ``field`` say where, when known."""

    def __init__(self, message: str, *, step: int | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.step = step
        self.field = field


@dataclass(frozen=True, slots=True)
class EnsembleStep:
    """One step: the model it runs and how its tensors connect to the ensemble's."""

    index: int
    """Position in ``ensemble_scheduling.step`` (0-based), as error messages name it."""
    model_name: str
    model_version: int
    """-1: the newest loaded version at the time of the request."""
    inputs: tuple[tuple[str, str], ...]
    """(model input, ensemble tensor) pairs, in the config's order."""
    outputs: tuple[tuple[str, str], ...]
    """(model output, ensemble tensor) pairs, in the config's order."""

    @property
    def label(self) -> str:
        return f"step {self.index} (model '{self.model_name}')"

    @property
    def version_text(self) -> str | None:
        """The version as the data plane takes it: None for the newest."""
        return None if self.model_version == -1 else str(self.model_version)


@dataclass(frozen=True, slots=True)
class EnsemblePlan:
    """The checked graph of an ensemble."""

    name: str
    steps: tuple[EnsembleStep, ...]
    """In an order where every step comes after the steps it reads from."""
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    producer: dict[str, int]
    """Ensemble tensor -> index (into ``steps``) of the step that produces it; ensemble inputs are absent."""

    def steps_for(self, wanted: tuple[str, ...] | list[str]) -> tuple[EnsembleStep, ...]:
        """The steps that the outputs ``wanted`` depend on, in run order."""
        needed: set[int] = set()
        todo = [self.producer[name] for name in wanted if name in self.producer]
        while todo:
            position = todo.pop()
            if position in needed:
                continue
            needed.add(position)
            todo.extend(self.producer[t] for _, t in self.steps[position].inputs if t in self.producer)
        return tuple(step for position, step in enumerate(self.steps) if position in needed)


def plan_ensemble(config: ModelConfig) -> EnsemblePlan:
    """Read and check the step graph of an ensemble config; EnsembleConfigError says what is wrong."""
    name = str(config.name)
    if not config.HasField("ensemble_scheduling") or len(config.ensemble_scheduling.step) == 0:
        raise EnsembleConfigError(
            "an ensemble needs ensemble_scheduling with at least one step", field="ensemble_scheduling"
        )
    for kind in ("input", "output"):
        if len(getattr(config, kind)) == 0:
            raise EnsembleConfigError(f"an ensemble must list its {kind}s (they cannot be auto-completed)")
    inputs = tuple(str(t.name) for t in config.input)
    outputs = tuple(str(t.name) for t in config.output)
    steps: list[EnsembleStep] = []
    made_by: dict[str, int] = {}
    for index, raw in enumerate(config.ensemble_scheduling.step):
        step = _read_step(index, raw)
        for _, tensor in step.outputs:
            if tensor in inputs:
                raise EnsembleConfigError(
                    f"{step.label} writes ensemble tensor '{tensor}', which is an input of the ensemble",
                    step=index,
                    field="output_map",
                )
            if tensor in made_by:
                raise EnsembleConfigError(
                    f"ensemble tensor '{tensor}' is produced by step {made_by[tensor]} and by {step.label}; "
                    "each ensemble tensor has one producer",
                    step=index,
                    field="output_map",
                )
            made_by[tensor] = index
        steps.append(step)
    for step in steps:
        for model_input, tensor in step.inputs:
            if tensor not in made_by and tensor not in inputs:
                raise EnsembleConfigError(
                    f"{step.label} reads ensemble tensor '{tensor}' into input '{model_input}', but no step "
                    f"produces it and the ensemble has no such input (inputs: {', '.join(inputs)})",
                    step=step.index,
                    field="input_map",
                )
    for output in outputs:
        if output not in made_by:
            raise EnsembleConfigError(f"ensemble output '{output}' is not produced by any step's output_map")
    ordered = _run_order(steps, made_by)
    position = {step.index: i for i, step in enumerate(ordered)}
    producer = {tensor: position[index] for tensor, index in made_by.items()}
    return EnsemblePlan(name, tuple(ordered), inputs, outputs, producer)


def _read_step(index: int, raw: object) -> EnsembleStep:
    model_name = str(getattr(raw, "model_name", ""))
    if not model_name:
        raise EnsembleConfigError(f"step {index} names no model_name", step=index, field="model_name")
    version = int(getattr(raw, "model_version", -1))
    if version < -1:
        raise EnsembleConfigError(
            f"step {index} (model '{model_name}') has model_version {version}; use -1 (newest) or a version number",
            step=index,
            field="model_version",
        )
    input_map = dict(getattr(raw, "input_map", {}))
    output_map = dict(getattr(raw, "output_map", {}))
    if not input_map:
        raise EnsembleConfigError(f"step {index} (model '{model_name}') has no input_map", step=index)
    if not output_map:
        raise EnsembleConfigError(f"step {index} (model '{model_name}') has no output_map", step=index)
    return EnsembleStep(
        index,
        model_name,
        version,
        tuple((str(k), str(v)) for k, v in input_map.items()),
        tuple((str(k), str(v)) for k, v in output_map.items()),
    )


def _run_order(steps: list[EnsembleStep], made_by: dict[str, int]) -> list[EnsembleStep]:
    """Steps ordered so that producers come first (Kahn's algorithm); a cycle is an error naming its steps."""
    waits_on: dict[int, set[int]] = {step.index: {made_by[t] for _, t in step.inputs if t in made_by} for step in steps}
    for step in steps:
        if step.index in waits_on[step.index]:
            raise EnsembleConfigError(f"{step.label} reads a tensor that it produces itself", step=step.index)
    done: set[int] = set()
    ordered: list[EnsembleStep] = []
    while len(ordered) < len(steps):
        ready = [s for s in steps if s.index not in done and waits_on[s.index] <= done]
        if not ready:
            stuck = [s.label for s in steps if s.index not in done]
            raise EnsembleConfigError(
                "the ensemble's steps form a cycle (each waits for a tensor another one produces): " + ", ".join(stuck)
            )
        for step in ready:
            done.add(step.index)
            ordered.append(step)
    return ordered


def check_ensemble(config: ModelConfig, loc: Locator) -> EnsemblePlan:
    """:func:`plan_ensemble`, with its errors as ConfigErrors pointing at the step (or field) concerned."""
    try:
        return plan_ensemble(config)
    except EnsembleConfigError as exc:
        raise loc.error(exc.message, _offset(loc, exc)) from exc


def _offset(loc: Locator, exc: EnsembleConfigError) -> int | None:
    if exc.step is None:
        return loc.field(exc.field, top=True) if exc.field else None
    scheduling = loc.items("ensemble_scheduling")
    if not scheduling:
        return None
    start, end = scheduling[0]
    steps = loc.items("step", start + 1, end)
    if exc.step >= len(steps):
        return None
    step_start, step_end = steps[exc.step]
    if exc.field:
        found = loc.field(exc.field, step_start + 1, step_end, top=True)
        if found is not None:
            return found
    return step_start
