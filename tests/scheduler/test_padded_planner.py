"""Padding-aware batching, pure: its config (PadSpec), the pad and cut steps, and the planner's own rules."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2

from modelsvc.backends import ModelLoadError
from modelsvc.protocol import InternalError, InvalidArgument
from modelsvc.scheduler import PaddedPolicy, PadInput, PadSpec, Plan, SchedulerConfig, planner_for

MS = 1_000_000

TENSORS = """
input [
  { name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] },
  { name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] },
  { name: "scale" data_type: TYPE_FP32 dims: [ -1 ] },
  { name: "fixed" data_type: TYPE_INT32 dims: [ 8 ] }
]
output [
  { name: "last_hidden_state" data_type: TYPE_FP32 dims: [ -1, 4 ] },
  { name: "sentence_embedding" data_type: TYPE_FP32 dims: [ 4 ] }
]
"""
GOOD = {
    "pad_inputs": "input_ids:0=0, attention_mask:0, scale:0=-1.5",
    "pad_outputs": "last_hidden_state:0",
    "pad_buckets": "16,32,64",
    "max_batch_tokens": "256",
}


def config(
    params: dict[str, str], head: str = "max_batch_size: 8\ndynamic_batching { }"
) -> model_config_pb2.ModelConfig:
    text = f'name: "enc"\n{head}\n{TENSORS}' + "".join(
        f'parameters {{ key: "{k}" value {{ string_value: "{v}" }} }}\n' for k, v in params.items()
    )
    return text_format.Parse(text, model_config_pb2.ModelConfig())


# -- the config ---------------------------------------------------------------------------------------------
def test_a_good_config_is_read_and_chooses_the_padding_planner() -> None:
    cfg = config(
        GOOD, "max_batch_size: 8\ndynamic_batching { preferred_batch_size: [ 4 ] max_queue_delay_microseconds: 700 }"
    )
    spec = PadSpec.from_model_config(cfg)
    assert spec is not None
    assert [(p.name, p.axis) for p in spec.inputs] == [("input_ids", 1), ("attention_mask", 1), ("scale", 1)]
    assert [type(p.value) for p in spec.inputs] == [np.int64, np.int64, np.float32]
    assert spec.inputs[2].value == np.float32(-1.5)
    assert dict(spec.outputs) == {"last_hidden_state": 1}
    assert spec.buckets == (16, 32, 64)
    assert spec.max_batch_tokens == 256
    planner = planner_for(cfg)
    assert isinstance(planner, PaddedPolicy)
    assert (planner.max_batch_size, planner.preferred_batch_sizes, planner.max_queue_delay_ns) == (8, (4,), 700_000)
    assert SchedulerConfig.from_model_config(cfg).padding == spec


def test_a_config_without_pad_inputs_keeps_the_dynamic_batcher() -> None:
    cfg = config({})
    assert PadSpec.from_model_config(cfg) is None
    assert not isinstance(planner_for(cfg), PaddedPolicy)
    assert SchedulerConfig.from_model_config(cfg).padding is None


BAD = [
    ({"pad_inputs": "tokens:0"}, None, "parameter 'pad_inputs': no input 'tokens' in the config"),
    ({"pad_inputs": "input_ids:1"}, None, r"input 'input_ids': axis 1 is out of range for dims \[-1\]"),
    ({"pad_inputs": "input_ids"}, None, "entry 'input_ids' is not NAME:AXIS"),
    ({"pad_inputs": "input_ids:x"}, None, "input 'input_ids': axis 'x' is not an integer"),
    ({"pad_inputs": "fixed:0"}, None, "input 'fixed': dim 0 is 8, a padded axis must be -1"),
    ({"pad_inputs": "input_ids:0=abc"}, None, "input 'input_ids': pad value 'abc' is not a INT64"),
    ({"pad_inputs": "input_ids:0=1.5"}, None, "input 'input_ids': pad value '1.5' is not a INT64"),
    ({"pad_inputs": "scale:0=zero"}, None, "input 'scale': pad value 'zero' is not a FP32"),
    ({"pad_inputs": "input_ids:0,input_ids:0"}, None, "input 'input_ids' is listed twice"),
    ({"pad_inputs": "input_ids:0,"}, None, "parameter 'pad_inputs' has an empty entry"),
    ({"pad_inputs": "input_ids:0"}, None, "'pad_outputs' does not list output 'last_hidden_state'"),
    ({**GOOD, "pad_outputs": "sentence_embedding:0"}, None, "output 'sentence_embedding': dim 0 is 4"),
    ({**GOOD, "pad_outputs": "logits:0"}, None, "parameter 'pad_outputs': no output 'logits'"),
    ({**GOOD, "pad_buckets": "64,32"}, None, "parameter 'pad_buckets' must be ascending, got '64,32'"),
    ({**GOOD, "pad_buckets": "0,32"}, None, "parameter 'pad_buckets': '0' is not a positive integer"),
    ({**GOOD, "pad_buckets": "16,big"}, None, "parameter 'pad_buckets': 'big' is not a positive integer"),
    ({**GOOD, "max_batch_tokens": "32"}, None, r"'max_batch_tokens' \(32\) is below one row of the largest"),
    ({**GOOD, "max_batch_tokens": "-5"}, None, "parameter 'max_batch_tokens': '-5' is not a positive integer"),
    ({"pad_outputs": "last_hidden_state:0"}, None, "parameter 'pad_outputs' needs 'pad_inputs'"),
    (GOOD, "max_batch_size: 0", "parameter 'pad_inputs' needs max_batch_size > 0"),
    (GOOD, "max_batch_size: 8", "parameter 'pad_inputs' needs dynamic_batching"),
]


@pytest.mark.parametrize(("params", "head", "message"), BAD, ids=[m[:40] for _, _, m in BAD])
def test_a_bad_config_fails_the_load_naming_the_key_and_the_tensor(
    params: dict[str, str], head: str | None, message: str
) -> None:
    cfg = config(params) if head is None else config(params, head)
    with pytest.raises(ModelLoadError, match=message) as caught:
        SchedulerConfig.from_model_config(cfg)
    assert str(caught.value).startswith("model 'enc': ")


# -- requests, pad and cut ----------------------------------------------------------------------------------
SPEC = PadSpec(
    (
        PadInput("input_ids", 1, np.int64(0)),
        PadInput("attention_mask", 1, np.int64(0)),
        PadInput("x", 2, np.float32(-1)),
    ),
    {"last_hidden_state": 1},
    buckets=(4, 8),
)


def ids(rows: int, length: int) -> np.ndarray:
    return np.arange(1, rows * length + 1, dtype=np.int64).reshape(rows, length)


def test_a_requests_length_is_its_padded_inputs_length() -> None:
    assert SPEC.length_of({"input_ids": ids(2, 5), "attention_mask": ids(2, 5)}) == 5
    assert SPEC.length_of({"other": ids(1, 3)}) == 0


def test_padded_inputs_of_different_lengths_are_a_400_naming_them() -> None:
    with pytest.raises(InvalidArgument, match="same length, got 'input_ids' 5, 'attention_mask' 4"):
        SPEC.length_of({"input_ids": ids(1, 5), "attention_mask": ids(1, 4)})


def test_a_request_longer_than_the_largest_bucket_is_a_400_naming_the_tensor_and_the_limit() -> None:
    with pytest.raises(
        InvalidArgument, match=r"input 'input_ids' has length 9, longer than the largest of pad_buckets \(8\)"
    ):
        SPEC.length_of({"input_ids": ids(1, 9)})


def test_the_shape_key_leaves_the_padded_axis_out() -> None:
    a = SPEC.shape_key({"input_ids": ids(1, 3), "x": np.zeros((1, 2, 3), np.float32)})
    b = SPEC.shape_key({"input_ids": ids(2, 7), "x": np.zeros((2, 2, 7), np.float32)})
    c = SPEC.shape_key({"input_ids": ids(1, 3), "x": np.zeros((1, 5, 3), np.float32)})
    assert a == b != c


def test_pad_extends_each_padded_input_with_its_value() -> None:
    inputs = {"input_ids": ids(1, 2), "x": np.ones((1, 2, 2), np.float32), "other": np.ones((1, 3), np.float32)}
    padded = SPEC.pad(inputs, 4)
    assert padded["input_ids"].tolist() == [[1, 2, 0, 0]]
    assert padded["x"].tolist() == [[[1, 1, -1, -1], [1, 1, -1, -1]]]
    assert padded["other"] is inputs["other"]
    assert SPEC.pad(inputs, 2)["input_ids"] is inputs["input_ids"]


def test_cut_takes_padded_outputs_back_to_the_requests_length() -> None:
    outputs = {"last_hidden_state": np.arange(2 * 4 * 3).reshape(2, 4, 3), "pooled": np.ones((2, 3))}
    cut = SPEC.cut(outputs, 3, 4)
    assert cut["last_hidden_state"].tolist() == outputs["last_hidden_state"][:, :3].tolist()
    assert cut["pooled"] is outputs["pooled"]


def test_a_padded_output_without_the_padded_length_is_an_internal_error_naming_it() -> None:
    with pytest.raises(InternalError, match=r"output 'last_hidden_state' has shape \[2, 5, 3\]"):
        SPEC.cut({"last_hidden_state": np.zeros((2, 5, 3))}, 3, 4)


def test_buckets_choose_the_padded_length() -> None:
    assert [SPEC.padded_length(n) for n in (0, 1, 4, 5, 8)] == [0, 4, 4, 8, 8]
    assert PadSpec((), {}).padded_length(13) == 13


# -- the planner's rules ------------------------------------------------------------------------------------
@dataclass
class Req:
    length: int
    batch_size: int = 1
    level: int = 1
    shape_key: object = "a"
    enqueued_ns: int = 0


def policy(
    max_batch_size: int = 8,
    buckets: tuple[int, ...] = (),
    tokens: int = 0,
    delay_ns: int = 0,
    preferred: tuple[int, ...] = (),
    call_cost: int = 96,
) -> PaddedPolicy:
    spec = PadSpec((PadInput("input_ids", 1, np.int64(0)),), {}, buckets, tokens, call_cost)
    return PaddedPolicy(max_batch_size, spec, preferred, delay_ns)


def test_requests_of_similar_length_are_grouped_and_padded_to_the_longest() -> None:
    q = [Req(10), Req(100), Req(12), Req(95), Req(11)]
    assert policy().plan(q, 0) == Plan.of([0, 2, 4], pad_to=12)
    assert policy().plan([Req(100), Req(95)], 0) == Plan.of([0, 1], pad_to=100)


def test_a_request_joins_when_its_padding_costs_less_than_the_call_it_would_need() -> None:
    # 100 and 20: together 200 tokens + 1 call, apart 120 + 2 calls: together when a call costs 80 or more
    assert policy(call_cost=96).plan([Req(100), Req(20)], 0) == Plan.of([0, 1], pad_to=100)
    assert policy(call_cost=80).plan([Req(100), Req(20)], 0) == Plan.of([0, 1], pad_to=100)  # a tie: together
    assert policy(call_cost=79).plan([Req(100), Req(20)], 0) == Plan.of([0], pad_to=100)
    assert policy(call_cost=0).plan([Req(100), Req(99)], 0) == Plan.of([0], pad_to=100)  # free calls: no padding,
    assert policy(call_cost=0).plan([Req(100), Req(100)], 0) == Plan.of([0, 1], pad_to=100)  # but equal ones share


def test_the_queue_is_split_where_padding_would_cost_most() -> None:
    """The cheapest split of 10, 12, 14 | 90, 100 (call 50): 3 x 14 + 2 x 100 + 2 calls = 342; all in one
    batch 500 + 50; each apart 326 + 250. The anchor's group goes, and at once: the split left requests out."""
    q = [Req(100), Req(10), Req(90), Req(14), Req(12)]
    assert policy(call_cost=50, delay_ns=100 * MS).plan(q, 0) == Plan.of([0, 2], pad_to=100)
    short_first = [Req(12), Req(10), Req(90), Req(14), Req(100)]
    assert policy(call_cost=50, delay_ns=100 * MS).plan(short_first, 0) == Plan.of([0, 1, 3], pad_to=14)
    # a call as dear as 500 padded tokens: one batch of all five
    assert policy(call_cost=500).plan(q, 0) == Plan.of([0, 2, 3, 4, 1], pad_to=100)


def test_the_default_call_cost_is_read_and_a_bad_one_fails_the_load_naming_the_key() -> None:
    base = {"pad_inputs": "input_ids:0", "pad_outputs": "last_hidden_state:0"}
    spec = PadSpec.from_model_config(config(base))
    assert spec is not None
    assert spec.call_cost_tokens == 96
    spec = PadSpec.from_model_config(config({**base, "pad_call_cost_tokens": "500"}))
    assert spec is not None
    assert spec.call_cost_tokens == 500
    for bad in ("-1", "1.5", "five"):
        with pytest.raises(ModelLoadError, match=f"pad_call_cost_tokens.*'{bad}'"):
            PadSpec.from_model_config(config({**base, "pad_call_cost_tokens": bad}))


def test_buckets_count_in_the_cost() -> None:
    # the anchor pads to 16 anyway: a 14 joins at no cost; a 2 alone pads to 4, with them to 16 (12 more)
    assert policy(buckets=(4, 16, 32), call_cost=0).plan([Req(10), Req(2), Req(14)], 0) == Plan.of([0, 2], pad_to=16)


def test_the_batch_goes_at_once_when_the_token_budget_is_reached() -> None:
    q = [Req(20), Req(20), Req(20), Req(20)]
    assert policy(tokens=64, delay_ns=100 * MS).plan(q, 0) == Plan.of([0, 1, 2], pad_to=20)


def test_a_request_at_or_over_the_token_budget_runs_alone() -> None:
    assert policy(tokens=64, delay_ns=100 * MS).plan([Req(20, batch_size=4), Req(20)], 0) == Plan.of([0], 20)
    assert policy(max_batch_size=4, delay_ns=100 * MS).plan([Req(5, batch_size=4), Req(5)], 0) == Plan.of([0], 5)


def test_the_oldest_request_goes_in_the_next_batch_whatever_its_length() -> None:
    """The age bound: the head of the queue is never passed over for requests that batch better."""
    q = [Req(200, enqueued_ns=0)] + [Req(8, enqueued_ns=MS) for _ in range(7)]
    # the 8s are split off (7 x 192 padded tokens cost more than a call): the 200 goes alone, at once
    assert policy(delay_ns=5 * MS).plan(q, 2 * MS) == Plan.of([0], pad_to=200)
    # alone in the queue it waits for similar lengths until its delay is over
    assert policy(delay_ns=5 * MS).plan(q[:1], 2 * MS) == Plan(0, 3 * MS)
    assert policy(delay_ns=5 * MS).plan(q[:1], 5 * MS) == Plan.of([0], pad_to=200)


def test_a_full_batch_goes_at_once_and_waits_otherwise() -> None:
    q = [Req(10) for _ in range(8)]
    assert policy(delay_ns=100 * MS).plan(q, 0) == Plan.of(range(8), pad_to=10)
    assert policy(delay_ns=100 * MS).plan(q[:3], 0) == Plan(0, 100 * MS)
    assert policy(delay_ns=100 * MS).plan(q[:3], 100 * MS) == Plan.of(range(3), pad_to=10)


def test_a_preferred_size_reached_goes_at_once_cut_back_to_the_nearest_lengths() -> None:
    q = [Req(10), Req(30), Req(11), Req(12)]
    # 11 and 12 join the anchor (30 costs 3 x 18 padded tokens more, a call 16); 2 is the largest preferred size
    assert policy(preferred=(2, 4), delay_ns=100 * MS, call_cost=16).plan(q, 0) == Plan.of([0, 2], pad_to=11)
    assert policy(preferred=(2,), delay_ns=100 * MS).plan([Req(10) for _ in range(5)], 0) == Plan.of([0, 1], 10)


def test_a_higher_priority_request_is_never_passed_over_for_a_lower_one() -> None:
    q = [Req(10, level=1), Req(10, level=2), Req(9, level=1)]
    assert policy(max_batch_size=2).plan(q, 0) == Plan.of([0, 2], pad_to=10)


def test_requests_of_other_shapes_wait_for_their_own_batch() -> None:
    q = [Req(10), Req(10, shape_key="b"), Req(10)]
    assert policy().plan(q, 0) == Plan.of([0, 2], pad_to=10)
    assert policy(delay_ns=MS).plan(q, 0) == Plan(0, MS)


def test_an_empty_queue_waits_for_arrivals() -> None:
    assert policy().plan([], 0) == Plan(0, None)
