"""logicd against a model that pads (``pad_inputs`` in its config.pbtxt): each window of a document goes out as
its own request at its own length, and the server batches them; against a model that does not, the windows
go out padded to the longest of a batch, in batches of max_batch_size, as before. A real modelsvc process
serves both models (python backend), its statistics count the requests, and an output that carries the token
axis shows the length each request had."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pytest
from litestar.testing import TestClient
from tokenizers.implementations import BertWordPieceTokenizer

from logicd import Context, Service, create_app, load_config
from logicd._infer import Padding, infer_chunks
from logicd.text import Chunker, load_tokenizer
from modelsvc.client import ModelMetadata, TensorSpec
from tests._server import ModelsvcProcess

pytestmark = pytest.mark.integration

WORDS = [f"w{i}" for i in range(300)]
MAX_TOKENS = 32  # windows of at most 30 document tokens plus [CLS] and [SEP]
STRIDE = 4

# total: the sum of the unpadded ids of each row (the same whatever padding the row got); width: the length of
# the rows the model computed; positions: 1, 2, ... along the token axis (zero never), an output the server
# cuts back to each request's own length when it pads
MODEL_PY = """\
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            ids = pb_utils.get_input_tensor_by_name(request, "input_ids").as_numpy()
            mask = pb_utils.get_input_tensor_by_name(request, "attention_mask").as_numpy()
            total = (ids * mask).sum(axis=1, keepdims=True).astype(np.float32)
            positions = np.tile(np.arange(1, ids.shape[1] + 1, dtype=np.float32), (ids.shape[0], 1))
            width = np.full((ids.shape[0], 1), ids.shape[1], dtype=np.float32)
            outputs = [pb_utils.Tensor(n, v) for n, v in (("total", total), ("width", width), ("positions", positions))]
            responses.append(pb_utils.InferenceResponse(output_tensors=outputs))
        return responses
"""

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 4
input [
  {{ name: "input_ids" data_type: TYPE_INT64 dims: [ -1 ] }},
  {{ name: "attention_mask" data_type: TYPE_INT64 dims: [ -1 ] }},
  {{ name: "token_type_ids" data_type: TYPE_INT64 dims: [ -1 ] }}
]
output [
  {{ name: "total" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "width" data_type: TYPE_FP32 dims: [ 1 ] }},
  {{ name: "positions" data_type: TYPE_FP32 dims: [ -1 ] }}
]
dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
{extra}"""

PADDING = """parameters {
  key: "pad_inputs" value { string_value: "input_ids:0=0,attention_mask:0=0,token_type_ids:0=0" }
}
parameters { key: "pad_outputs" value { string_value: "positions:0" } }
"""


class DocsIn(msgspec.Struct):
    texts: list[str]
    model: str
    output: str


class WindowsOut(msgspec.Struct):
    lengths: list[int]
    doc_index: list[int]
    totals: list[float]
    expected_totals: list[float]
    lengths_seen: list[int]
    """Per window: ``width``, or the nonzero entries of its ``positions`` row."""


service = Service()


@service.post("/v1/windows")
async def windows(request: DocsIn, ctx: Context) -> WindowsOut:
    chunks = await ctx.chunk(request.texts)
    totals = await ctx.infer_chunks(request.model, chunks, "total")
    seen = await ctx.infer_chunks(request.model, chunks, request.output)
    return WindowsOut(
        lengths=chunks.lengths.tolist(),
        doc_index=chunks.doc_index.tolist(),
        totals=totals[:, 0].tolist(),
        expected_totals=[float(ids.sum()) for ids in chunks.input_ids],
        lengths_seen=(seen[:, 0] if request.output == "width" else np.count_nonzero(seen, axis=1)).tolist(),
    )


def write_model(repo: Path, name: str, extra: str) -> None:
    folder = repo / name
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.py").write_text(MODEL_PY)
    (folder / "config.pbtxt").write_text(CONFIG.format(name=name, extra=extra))


@pytest.fixture(scope="module")
def service_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("padding")
    write_model(folder / "model_repository", "pads", PADDING)
    write_model(folder / "model_repository", "plain", "")
    tok = folder / "tokenizer"
    tok.mkdir()
    vocab = tok / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    BertWordPieceTokenizer(str(vocab), lowercase=True).save(str(tok / "tokenizer.json"))
    (folder / "service.yaml").write_text(f"""name: padding-svc
service: unused:service
model_service:
  url: http://127.0.0.1:1
  timeout_s: 30
  retries: 0
models: [pads, plain]
tokenizer:
  path: ./tokenizer/tokenizer.json
chunking:
  max_tokens: {MAX_TOKENS}
  stride: {STRIDE}
""")
    return folder


@pytest.fixture(scope="module")
def modelsvc(service_dir: Path) -> Iterator[ModelsvcProcess]:
    server = ModelsvcProcess(service_dir / "model_repository").start()
    try:
        yield server.wait_ready(60)
    finally:
        server.terminate()


@pytest.fixture(scope="module")
def client(service_dir: Path, modelsvc: ModelsvcProcess) -> Iterator[TestClient[Any]]:
    config = load_config(service_dir / "service.yaml", {"LOGICD_MODEL_SERVICE__URL": modelsvc.base})
    with TestClient(create_app(service, config), timeout=60) as test_client:
        yield test_client


# one long document cut into windows of 32, 32, 32 and 24 tokens, and a short one of 7
LONG = " ".join(WORDS[i % 300] for i in range(100))
SHORT = "w1 w2 w3 w4 w5"


def counts(server: ModelsvcProcess, model: str) -> tuple[int, int]:
    """(requests answered, rows computed) of ``model`` so far."""
    stats = server.model_stats(model)
    return int(stats["inference_stats"]["success"]["count"]), int(stats["inference_count"])


def call(client: TestClient[Any], model: str, output: str) -> dict[str, Any]:
    response = client.post("/v1/windows", json={"texts": [LONG, SHORT], "model": model, "output": output})
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    assert body["lengths"] == [32, 32, 32, 24, 7]
    assert body["doc_index"] == [0, 0, 0, 0, 1]
    assert body["totals"] == body["expected_totals"]  # the same answers either way
    return body


def test_a_padding_model_gets_each_window_as_its_own_request_at_its_own_length(client, modelsvc):
    before = counts(modelsvc, "pads")
    body = call(client, "pads", "positions")
    # two outputs asked for, each in one request per window: 5 windows, 10 requests of one row
    assert counts(modelsvc, "pads") == (before[0] + 10, before[1] + 10)
    # each request was as long as its window (padded by logicd, all five would be 32 long)
    assert body["lengths_seen"] == body["lengths"]


def test_a_model_that_does_not_pad_gets_padded_batches_of_max_batch_size(client, modelsvc):
    before = counts(modelsvc, "plain")
    body = call(client, "plain", "width")
    # max_batch_size 4: the 5 windows (longest first) go in 2 requests per output, each padded to its longest
    assert counts(modelsvc, "plain") == (before[0] + 4, before[1] + 10)
    assert body["lengths_seen"] == [32, 32, 32, 32, 7]


def test_the_served_config_is_read_at_start_up(client):
    runtime = client.app.state["logicd"]
    assert runtime.padding["plain"] is None
    assert runtime.padding["pads"] == Padding({"input_ids": 0, "attention_mask": 0, "token_type_ids": 0})


# -- the pieces, without a server --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "inputs"),
    [
        (
            "input_ids:0=0,attention_mask:0=0,token_type_ids:0=0",
            {"input_ids": 0, "attention_mask": 0, "token_type_ids": 0},
        ),
        (" input_ids:0 , attention_mask:0=1 ,", {"input_ids": 0, "attention_mask": 0}),
        ("input_ids:1=0", {"input_ids": 1}),
    ],
)
def test_pad_inputs_is_read_from_the_config_json(text, inputs):
    config = {"parameters": {"pad_inputs": {"string_value": text}}}
    assert Padding.from_config("m", config) == Padding(inputs)


@pytest.mark.parametrize(
    "config",
    [
        None,
        {},
        {"parameters": {}},
        {"parameters": {"pad_inputs": {"string_value": " "}}},
        {"parameters": {"pad_inputs": {"string_value": "input_ids=0"}}},
        {"parameters": {"pad_inputs": {"string_value": "input_ids:x"}}},
    ],
)
def test_a_model_without_readable_pad_inputs_does_not_pad(config):
    assert Padding.from_config("m", config) is None


def test_windows_go_one_by_one_only_when_every_window_input_is_padded_on_its_token_axis():
    names = {"input_ids": "INT64", "attention_mask": "INT64", "token_type_ids": "INT64"}
    assert Padding({"input_ids": 0, "attention_mask": 0, "token_type_ids": 0}).pads(names)
    assert not Padding({"input_ids": 0, "attention_mask": 0}).pads(names)  # token_type_ids would differ in length
    assert Padding({"input_ids": 0, "attention_mask": 0}).pads({"input_ids": "INT32", "attention_mask": "INT32"})
    assert not Padding({"input_ids": 1, "attention_mask": 0}).pads({"input_ids": "INT64", "attention_mask": "INT64"})
    assert not Padding({"x": 0}).pads({"x": "FP32"})


class _Recorder:
    """Stands in for an AsyncModel: records each call's shapes and how many were in flight at once."""

    def __init__(self, max_batch_size: int, datatype: str = "INT64") -> None:
        specs = tuple(TensorSpec(n, datatype, (-1, -1)) for n in ("input_ids", "attention_mask"))
        self.metadata = ModelMetadata("m", ("1",), "", specs, (), max_batch_size)
        self.inputs = {s.name: s.datatype for s in specs}
        self.shapes: list[tuple[int, ...]] = []
        self.dtypes: set[Any] = set()
        self.running = 0
        self.most = 0

    async def infer(self, inputs: dict[str, Any], *, outputs: list[str]) -> dict[str, Any]:
        self.running += 1
        self.most = max(self.most, self.running)
        try:
            await asyncio.sleep(0.01)
            ids = inputs["input_ids"]
            self.shapes.append(ids.shape)
            self.dtypes |= {v.dtype for v in inputs.values()}
            if outputs[0] == "pooled":  # [rows, 2]
                return {"pooled": np.stack([ids.sum(axis=1), (ids > 0).sum(axis=1)], axis=1).astype(np.float32)}
            return {outputs[0]: np.repeat(ids[:, :, None], 2, axis=2).astype(np.float32)}  # [rows, length, 2]
        finally:
            self.running -= 1


@pytest.fixture(scope="module")
def chunker(service_dir: Path) -> Chunker:
    return Chunker(load_tokenizer(service_dir / "tokenizer" / "tokenizer.json"), max_tokens=MAX_TOKENS, stride=STRIDE)


def test_windows_in_flight_are_bounded_by_twice_max_batch_size_and_keep_their_lengths(chunker):
    chunks = chunker.chunk([LONG * 3, SHORT])  # 12 + 1 windows
    model = _Recorder(max_batch_size=2, datatype="INT32")
    padding = Padding({"input_ids": 0, "attention_mask": 0})
    hidden = asyncio.run(infer_chunks(model, chunks, "h", max_batch_size=None, padding=padding))  # type: ignore[arg-type]
    assert len(model.shapes) == len(chunks) == 13
    assert model.most == 4
    assert sorted(model.shapes) == sorted((1, int(n)) for n in chunks.lengths)
    assert model.dtypes == {np.dtype(np.int32)}  # the model's datatype, as in padded batches
    # stacked zero-filled to the longest window, each row its own window's ids in chunk order
    assert hidden.shape == (13, MAX_TOKENS, 2)
    for i, ids in enumerate(chunks.input_ids):
        assert (hidden[i, : len(ids), 0] == ids).all()
        assert not hidden[i, len(ids) :].any()


def test_without_padding_the_windows_go_in_padded_batches_as_before(chunker):
    chunks = chunker.chunk([LONG, SHORT])
    model = _Recorder(max_batch_size=4)
    pooled = asyncio.run(infer_chunks(model, chunks, "pooled", max_batch_size=None, padding=None))  # type: ignore[arg-type]
    assert sorted(model.shapes) == [(1, 7), (4, 32)]
    assert model.dtypes == {np.dtype(np.int64)}
    assert pooled.tolist() == [[float(ids.sum()), float(len(ids))] for ids in chunks.input_ids]


def test_a_failed_window_cancels_the_others_and_is_raised(chunker):
    class Failing(_Recorder):
        async def infer(self, inputs: dict[str, Any], *, outputs: list[str]) -> dict[str, Any]:
            if inputs["input_ids"].shape[1] == 7:
                raise RuntimeError("refused")
            return await super().infer(inputs, outputs=outputs)

    chunks = chunker.chunk([SHORT, LONG * 3])
    model = Failing(max_batch_size=8)
    padding = Padding({"input_ids": 0, "attention_mask": 0})
    with pytest.raises(RuntimeError, match="refused"):
        asyncio.run(infer_chunks(model, chunks, "h", max_batch_size=None, padding=padding))  # type: ignore[arg-type]
    assert model.running == 0
    assert not model.shapes  # the others were cancelled mid-call
