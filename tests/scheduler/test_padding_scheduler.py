"""Padding-aware batching through the scheduler: the queue taking a planner's picks, and real models padded."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from google.protobuf import text_format
from onnx import TensorProto, helper, numpy_helper
from tritonclient.grpc import model_config_pb2

from modelsvc.backends import Arrays, BatchRequest, ModelInstance, get_backend
from modelsvc.protocol import InternalError, InvalidArgument
from modelsvc.scheduler import (
    DynamicScheduler,
    ModelStats,
    PaddedPolicy,
    PadInput,
    PadSpec,
    QueuePolicy,
    SchedulerConfig,
    WorkItem,
)
from modelsvc.scheduler._dynamic import BatchPolicy
from modelsvc.scheduler._queue import RequestQueue
from modelsvc.tools import onnx_models


async def test_the_queue_takes_any_positions_of_the_dispatch_order() -> None:
    levels = 2
    config = SchedulerConfig(True, True, BatchPolicy(8), priority_levels=levels, policies=(QueuePolicy(),) * levels)
    queue = RequestQueue(config, "m", lambda: None)
    queue.start(asyncio.get_running_loop())
    items = [
        WorkItem({"IN": np.full((1, 1), v, np.float32)}, ["OUT"], priority)
        for v, priority in [(0, 1), (1, 1), (2, 1), (3, 2), (4, 2), (5, 2)]
    ]
    for item in items:
        queue.add(item)
    assert list(queue.in_order()) == items
    assert queue.take([1, 3, 5]) == [items[1], items[3], items[5]]
    assert list(queue.in_order()) == [items[0], items[2], items[4]]
    assert queue.count == 3
    assert queue.take([0, 1]) == [items[0], items[2]]
    items[4].future.cancel()  # its caller left: taken out of the queue but not batched
    assert queue.take([0]) == []
    assert queue.count == 0
    assert all(item.queue is None for item in items)


# -- real ONNX models through the scheduler -----------------------------------------------------------------
HIDDEN = 8


def masked_encoder(vocab: int = 50, seed: int = 0) -> onnx.ModelProto:
    """A tiny BERT-shaped encoder: embeddings, one masked self-attention, masked mean pooling.

    input_ids, attention_mask [batch, seq] (INT64) -> last_hidden_state [batch, seq, HIDDEN] and
    sentence_embedding [batch, HIDDEN]. Padded positions get -1e9 before the softmax, so padding is exact."""
    rng = np.random.default_rng(seed)
    init = [
        numpy_helper.from_array(rng.standard_normal((vocab, HIDDEN)).astype(np.float32), "emb"),
        numpy_helper.from_array(np.array([1], np.int64), "axis1"),
        numpy_helper.from_array(np.array([-1], np.int64), "axis_last"),
        numpy_helper.from_array(np.array(1.0, np.float32), "one"),
        numpy_helper.from_array(np.array(1e9, np.float32), "big"),
        numpy_helper.from_array(np.array(HIDDEN**-0.5, np.float32), "scale"),
    ]
    nodes = [
        helper.make_node("Gather", ["emb", "input_ids"], ["h"]),  # [b, s, d]
        helper.make_node("Transpose", ["h"], ["hT"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["h", "hT"], ["raw"]),  # [b, s, s]
        helper.make_node("Mul", ["raw", "scale"], ["scores"]),
        helper.make_node("Cast", ["attention_mask"], ["mask"], to=TensorProto.FLOAT),  # [b, s]
        helper.make_node("Sub", ["mask", "one"], ["off"]),  # 0 for tokens, -1 for padding
        helper.make_node("Mul", ["off", "big"], ["bias2"]),
        helper.make_node("Unsqueeze", ["bias2", "axis1"], ["bias"]),  # [b, 1, s]
        helper.make_node("Add", ["scores", "bias"], ["biased"]),
        helper.make_node("Softmax", ["biased"], ["attn"], axis=-1),
        helper.make_node("MatMul", ["attn", "h"], ["last_hidden_state"]),
        helper.make_node("Unsqueeze", ["mask", "axis_last"], ["mask3"]),  # [b, s, 1]
        helper.make_node("Mul", ["last_hidden_state", "mask3"], ["kept"]),
        helper.make_node("ReduceSum", ["kept", "axis1"], ["summed"], keepdims=0),
        helper.make_node("ReduceSum", ["mask3", "axis1"], ["count"], keepdims=0),
        helper.make_node("Div", ["summed", "count"], ["sentence_embedding"]),
    ]
    i64, f32 = TensorProto.INT64, TensorProto.FLOAT
    graph = helper.make_graph(
        nodes,
        "masked_encoder",
        [
            helper.make_tensor_value_info("input_ids", i64, ["batch", "seq"]),
            helper.make_tensor_value_info("attention_mask", i64, ["batch", "seq"]),
        ],
        [
            helper.make_tensor_value_info("last_hidden_state", f32, ["batch", "seq", HIDDEN]),
            helper.make_tensor_value_info("sentence_embedding", f32, ["batch", HIDDEN]),
        ],
        initializer=init,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", onnx_models.OPSET)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


ENCODER_OUTPUTS = f"""
output [
  {{ name: "last_hidden_state" data_type: TYPE_FP32 dims: [ -1, {HIDDEN} ] }},
  {{ name: "sentence_embedding" data_type: TYPE_FP32 dims: [ {HIDDEN} ] }}
]
parameters {{ key: "pad_outputs" value {{ string_value: "last_hidden_state:0" }} }}
"""
CLASSIFIER_OUTPUTS = 'output [ { name: "logits" data_type: TYPE_FP32 dims: [ 4 ] } ]'


def load(
    tmp_path: Path, model: onnx.ModelProto, outputs: str, max_batch_size: int, buckets: str = ""
) -> tuple[model_config_pb2.ModelConfig, list[ModelInstance]]:
    """The model's config and its ONNX Runtime instances, as the server loads them."""
    text = f"""
name: "m"
backend: "onnxruntime"
max_batch_size: {max_batch_size}
dynamic_batching {{ max_queue_delay_microseconds: 500000 }}
input [
  {{ name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] }},
  {{ name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }}
]
{outputs}
parameters {{ key: "pad_inputs" value {{ string_value: "input_ids:0=0,attention_mask:0=0" }} }}
"""
    if buckets:
        text += f'parameters {{ key: "pad_buckets" value {{ string_value: "{buckets}" }} }}\n'
    cfg = text_format.Parse(text, model_config_pb2.ModelConfig())
    onnx_models.write_model(tmp_path, "m", model, None)
    artifact = tmp_path / "m" / "1" / "model.onnx"
    backend = get_backend(cfg)
    backend.autocomplete(cfg, artifact)
    return cfg, backend.create_instances(cfg, artifact, 1)


def tokens(length: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "input_ids": rng.integers(1, 50, (1, length), dtype=np.int64),
        "attention_mask": np.ones((1, length), np.int64),
    }


@pytest.mark.parametrize(
    ("model", "outputs"),
    [(masked_encoder(), ENCODER_OUTPUTS), (onnx_models.token_classifier(vocab=50, layers=2), CLASSIFIER_OUTPUTS)],
    ids=["masked_encoder", "token_classifier"],
)
async def test_requests_of_different_lengths_share_a_batch_and_get_their_answers_alone(
    tmp_path: Path, model: onnx.ModelProto, outputs: str
) -> None:
    lengths = [6, 7, 8, 8, 7, 6]
    cfg, instances = load(tmp_path, model, outputs, max_batch_size=len(lengths))
    names = [o.name for o in cfg.output]
    requests = [tokens(n, seed) for seed, n in enumerate(lengths)]
    alone = [instances[0].execute(r, names) for r in requests]  # each request on its own, unpadded
    stats = ModelStats("m", "1")
    s = DynamicScheduler(SchedulerConfig.from_model_config(cfg), instances, stats)
    s.start()
    answers = await asyncio.gather(*(s.enqueue(WorkItem(r, names)) for r in requests))
    await s.close()
    assert stats.execution_count == 1, "the six requests did not share one batch"
    assert (stats.tokens_computed, stats.tokens_useful) == (6 * 8, sum(lengths))
    assert stats.batch_fill.count == 1
    assert stats.batch_fill.sum == pytest.approx(sum(lengths) / 48)
    for n, got, want in zip(lengths, answers, alone, strict=True):
        assert set(got) == set(names)
        for name in names:
            assert got[name].shape == want[name].shape, (name, n)
            np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-5)
    if "last_hidden_state" in names:
        assert [a["last_hidden_state"].shape for a in answers] == [(1, n, HIDDEN) for n in lengths]


async def test_a_batch_is_padded_to_its_bucket_and_counted(tmp_path: Path) -> None:
    cfg, instances = load(tmp_path, masked_encoder(), ENCODER_OUTPUTS, max_batch_size=2, buckets="8,16")
    names = [o.name for o in cfg.output]
    requests = [tokens(3, 0), tokens(5, 1)]
    alone = [instances[0].execute(r, names) for r in requests]
    stats = ModelStats("m", "1")
    s = DynamicScheduler(SchedulerConfig.from_model_config(cfg), instances, stats)
    s.start()
    answers = await asyncio.gather(*(s.enqueue(WorkItem(r, names)) for r in requests))
    with pytest.raises(InvalidArgument, match="longer than the largest of pad_buckets"):
        await s.enqueue(WorkItem(tokens(17, 2), names))
    await s.close()
    assert stats.execution_count == 1
    assert (stats.tokens_computed, stats.tokens_useful) == (2 * 8, 8)
    for got, want in zip(answers, alone, strict=True):
        for name in names:
            np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-5)


# -- per-request instances and the batch facts ----------------------------------------------------------------
class PerRequest:
    """Takes a batch's requests one by one (as python models do): answers hidden = ids as floats [rows, seq, 1],
    or, for a request whose first id is 99, an output one step too long. Records the lengths it saw."""

    def __init__(self) -> None:
        self.name = "per_request"
        self.device = "cpu"
        self.providers = ["test"]
        self.seen: list[list[int]] = []

    def execute(self, inputs: Arrays, output_names: Sequence[str]) -> Arrays:
        raise AssertionError("the scheduler must hand this instance lists of requests")

    def execute_requests(self, batch: Sequence[BatchRequest]) -> list[Arrays | BaseException]:
        self.seen.append([r.inputs["ids"].shape[1] for r in batch])
        out: list[Arrays | BaseException] = []
        for r in batch:
            ids = r.inputs["ids"]
            if ids[0, 0] == 99:
                ids = np.concatenate([ids, ids[:, :1]], axis=1)
            out.append({"hidden": ids.astype(np.float32)[:, :, None], "pooled": ids.sum(axis=1, keepdims=True)})
        return out

    def close(self) -> None:
        pass


class Traced:
    """A traced request that records what the scheduler tells tracing about its batch."""

    def __init__(self) -> None:
        self.started: list[tuple[int, int | None]] = []

    def batch_started(self, batch: Sequence[Any], rows: int, padded_length: int | None = None) -> Traced:
        self.started.append((rows, padded_length))
        return self

    def finished(self, error: BaseException | None, timings: tuple[int, int, int] | None) -> None:
        pass


def padded_config(max_batch_size: int) -> SchedulerConfig:
    spec = PadSpec((PadInput("ids", 1, np.int64(7)),), {"hidden": 1})
    policy = PaddedPolicy(max_batch_size, spec, max_queue_delay_ns=500_000_000)
    return SchedulerConfig(batching=True, dynamic=True, batch=policy, padding=spec)


async def test_per_request_instances_get_each_request_padded_and_answer_at_its_own_length() -> None:
    inst = PerRequest()
    stats = ModelStats("m", "1")
    s = DynamicScheduler(padded_config(3), [inst], stats)
    s.start()
    trace = Traced()
    rows = [np.array([[1, 2, 3]]), np.array([[4, 5, 6, 7]]), np.array([[8, 9, 10, 11]])]
    answers = await asyncio.gather(
        s.enqueue(WorkItem({"ids": rows[0]}, ["hidden", "pooled"], trace=trace)),
        *(s.enqueue(WorkItem({"ids": r}, ["hidden", "pooled"])) for r in rows[1:]),
    )
    assert inst.seen == [[4, 4, 4]]
    assert trace.started == [(3, 4)]
    for r, answer in zip(rows, answers, strict=True):
        assert answer["hidden"][:, :, 0].tolist() == r.tolist()  # cut back to its own length
    assert answers[0]["pooled"].tolist() == [[1 + 2 + 3 + 7]]  # unlisted outputs come back as computed
    assert (stats.tokens_computed, stats.tokens_useful) == (12, 11)
    await s.close()


async def test_a_padded_output_of_another_length_fails_its_request_alone() -> None:
    inst = PerRequest()
    s = DynamicScheduler(padded_config(2), [inst], ModelStats("m", "1"))
    s.start()
    good, bad = await asyncio.gather(
        s.enqueue(WorkItem({"ids": np.array([[1, 2]])}, ["hidden"])),
        s.enqueue(WorkItem({"ids": np.array([[99, 2, 3]])}, ["hidden"])),
        return_exceptions=True,
    )
    await s.close()
    assert isinstance(good, dict)
    assert good["hidden"].shape == (1, 2, 1)
    assert isinstance(bad, InternalError)
    assert "output 'hidden' has shape [1, 4, 1]" in str(bad)


async def test_unequal_padded_inputs_are_refused_before_they_queue() -> None:
    spec = PadSpec((PadInput("ids", 1, np.int64(0)), PadInput("mask", 1, np.int64(0))), {})
    config = SchedulerConfig(True, True, PaddedPolicy(4, spec), padding=spec)
    s = DynamicScheduler(config, [PerRequest()], ModelStats("m", "1"))
    s.start()
    with pytest.raises(InvalidArgument, match="got 'ids' 3, 'mask' 2"):
        await s.enqueue(WorkItem({"ids": np.zeros((1, 3), np.int64), "mask": np.zeros((1, 2), np.int64)}, ["hidden"]))
    assert s.pending_count == 0
    await s.close()
