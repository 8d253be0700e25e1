"""logicd.text: offline tokenizer loading, chunking, batching, aggregation and tokenization off the event loop.

A small real WordPiece tokenizer is built in the test (no downloads): 300 words ``w0``..``w299``, one token each.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tokenizers
from tokenizers.implementations import BertWordPieceTokenizer

import logicd.text
from logicd.text import (
    Chunker,
    Chunks,
    LabelScore,
    Tokenizer,
    TokenizerLoadError,
    TokenizerPool,
    batches,
    l2_normalize,
    load_tokenizer,
    max_pool,
    mean_pool,
    softmax,
    tokenize_async,
    top_k,
    unbatch,
)

WORDS = [f"w{i}" for i in range(300)]
PAD, UNK, CLS, SEP = 0, 1, 2, 3


def words(n: int, offset: int = 0) -> str:
    return " ".join(WORDS[(offset + i) % len(WORDS)] for i in range(n))


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A transformers-style fast tokenizer folder: tokenizer.json + tokenizer_config.json + special_tokens_map.json."""
    folder = tmp_path_factory.mktemp("bert-tiny")
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", ".", ",", *WORDS]) + "\n")
    BertWordPieceTokenizer(str(vocab), lowercase=True).save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"model_max_length": 512, "pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]"})
    )
    (folder / "special_tokens_map.json").write_text(
        json.dumps({"pad_token": "[PAD]", "cls_token": "[CLS]", "sep_token": "[SEP]", "unk_token": "[UNK]"})
    )
    return folder


@pytest.fixture(scope="module")
def tok(tokenizer_dir: Path) -> Tokenizer:
    return load_tokenizer(tokenizer_dir)


def test_exports_are_sorted_and_complete() -> None:
    names = logicd.text.__all__
    assert names == sorted(names, key=lambda n: (not n.isupper(), not n[0].isupper(), n))
    for name in names:
        assert hasattr(logicd.text, name)
    assert {"Chunker", "batches", "load_tokenizer", "mean_pool", "tokenize_async"} <= set(names)


def test_importing_the_toolkit_imports_neither_transformers_nor_torch() -> None:
    code = "import sys, logicd.text; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --- loading ------------------------------------------------------------------------------------------------


def test_load_from_folder_reads_specials_pad_and_max_length(tok: Tokenizer, tokenizer_dir: Path) -> None:
    assert tok.path == tokenizer_dir / "tokenizer.json"
    assert (tok.prefix_ids, tok.suffix_ids, tok.pad_id) == ((CLS,), (SEP,), PAD)
    assert tok.num_special_tokens == 2
    assert tok.model_max_length == 512
    assert tok.vocab_size == 307
    assert tok.encode_ids(["w5 W6, w7"]) == [[5 + 7, 6 + 7, 6, 7 + 7]]


def test_load_from_a_bare_tokenizer_json(tokenizer_dir: Path, tmp_path: Path) -> None:
    file = tmp_path / "tokenizer.json"
    file.write_bytes((tokenizer_dir / "tokenizer.json").read_bytes())
    tok = load_tokenizer(str(file))
    assert (tok.prefix_ids, tok.suffix_ids, tok.pad_id, tok.model_max_length) == ((CLS,), (SEP,), PAD, None)


def test_truncation_saved_in_tokenizer_json_is_switched_off(tokenizer_dir: Path, tmp_path: Path) -> None:
    raw = tokenizers.Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    raw.enable_truncation(16)
    raw.enable_padding(length=16)
    raw.save(str(tmp_path / "tokenizer.json"))
    tok = load_tokenizer(tmp_path / "tokenizer.json")
    assert len(tok.encode_ids([words(100)])[0]) == 100
    assert sum(Chunker(tok, 32).chunk([words(100)]).token_counts) == 100


@pytest.mark.parametrize(
    ("name", "content", "message"),
    [
        ("missing", None, "no such file or folder"),
        ("empty-folder", "", "folder has no tokenizer.json"),
        ("tokenizer.json", "not json at all", "not a tokenizer.json"),
        ("other.json", '{"hello": 1}', "not a tokenizer.json"),
    ],
)
def test_loading_errors_name_the_path(tmp_path: Path, name: str, content: str | None, message: str) -> None:
    path = tmp_path / name
    if content == "":
        path.mkdir()
    elif content is not None:
        path.write_text(content)
    with pytest.raises(TokenizerLoadError, match=message) as info:
        load_tokenizer(path)
    assert str(path) in str(info.value)
    assert info.value.path in (path, path / "tokenizer.json")


def test_loading_error_names_a_bad_tokenizer_config(tokenizer_dir: Path, tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_bytes((tokenizer_dir / "tokenizer.json").read_bytes())
    (tmp_path / "tokenizer_config.json").write_text("{broken")
    with pytest.raises(TokenizerLoadError, match="unreadable JSON") as info:
        load_tokenizer(tmp_path)
    assert str(tmp_path / "tokenizer_config.json") in str(info.value)


# --- chunking -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("stride", [0, 1, 32, 125])
def test_long_document_windows_overlap_by_stride_and_reassemble(tok: Tokenizer, stride: int) -> None:
    text = words(3000)
    doc = tok.encode_ids([text])[0]
    assert len(doc) == 3000
    chunks = Chunker(tok, max_tokens=128, stride=stride).chunk([text])
    window, step = 126, 126 - stride
    assert len(chunks) == 1 + -(-(3000 - window) // step)
    rebuilt: list[int] = []
    for i, ids in enumerate(chunks.input_ids):
        assert ids.dtype == np.int64
        assert len(ids) <= 128
        assert (ids[0], ids[-1]) == (CLS, SEP)
        inner = ids[1:-1].tolist()
        assert CLS not in inner
        assert SEP not in inner
        assert inner == doc[chunks.starts[i] : chunks.starts[i] + len(inner)]
        assert chunks.token_counts[i] == len(inner)
        if i:
            previous = chunks.input_ids[i - 1][1:-1].tolist()
            assert previous[len(previous) - stride :] == inner[:stride]
        rebuilt.extend(inner if i == 0 else inner[stride:])
    assert rebuilt == doc
    assert chunks.lengths[:-1].tolist() == [128] * (len(chunks) - 1)


@pytest.mark.parametrize("stride", [0, 7, 50])
def test_windows_match_the_tokenizers_own_overflow(tok: Tokenizer, tokenizer_dir: Path, stride: int) -> None:
    raw = tokenizers.Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))  # its own instance: we set truncation
    raw.enable_truncation(64, stride=stride)
    text = words(1000, offset=17)
    first = raw.encode(text)
    expected = [e.ids for e in (first, *first.overflowing)]
    assert [ids.tolist() for ids in Chunker(tok, 64, stride).chunk([text]).input_ids] == expected


def test_short_document_is_framed_like_the_tokenizer_frames_it(tok: Tokenizer, tokenizer_dir: Path) -> None:
    raw = tokenizers.Tokenizer.from_file(str(tokenizer_dir / "tokenizer.json"))
    text = "W1 w2, w3. unknownword"
    chunks = Chunker(tok).chunk([text])
    assert len(chunks) == 1
    assert chunks.input_ids[0].tolist() == raw.encode(text).ids
    assert [m.tolist() for m in chunks.attention_mask] == [[1] * len(raw.encode(text).ids)]


def test_window_boundaries(tok: Tokenizer) -> None:
    chunker = Chunker(tok, max_tokens=12, stride=0)  # 10 document tokens per window
    chunks = chunker.chunk([words(10), words(11), words(20), words(21)])
    assert [len(span) for span in chunks.spans] == [1, 2, 2, 3]
    assert chunks.token_counts.tolist() == [10, 10, 1, 10, 10, 10, 10, 1]


def test_many_documents_map_chunks_to_documents(tok: Tokenizer) -> None:
    lengths = [5, 300, 0, 64, 1000, 63, 1]
    texts = [words(n, offset=d) for d, n in enumerate(lengths)]
    chunks = Chunker(tok, max_tokens=64, stride=8).chunk(texts)
    assert chunks.num_docs == len(texts)
    assert chunks.doc_token_counts.tolist() == lengths
    assert chunks.doc_index.tolist() == [d for d, span in enumerate(chunks.spans) for _ in span]
    assert chunks.spans[0].start == 0
    assert chunks.spans[-1].stop == len(chunks)
    for d, span in enumerate(chunks.spans):
        assert span.stop > span.start
        assert all(chunks.doc_index[i] == d for i in span)
        assert chunks.starts[span.start] == 0
        doc = tok.encode_ids([texts[d]])[0]
        last = span.stop - 1
        assert chunks.starts[last] + chunks.token_counts[last] == len(doc)
    assert max(chunks.lengths) <= 64


@pytest.mark.parametrize("text", ["", "   ", "\n\t "])
def test_empty_and_whitespace_text_give_one_chunk_of_specials(tok: Tokenizer, text: str) -> None:
    chunks = Chunker(tok).chunk([text, "w1"])
    assert [ids.tolist() for ids in chunks.input_ids] == [[CLS, SEP], [CLS, 8, SEP]]
    assert chunks.token_counts.tolist() == [0, 1]
    assert chunks.doc_token_counts.tolist() == [0, 1]


def test_no_texts_give_no_chunks(tok: Tokenizer) -> None:
    chunks = Chunker(tok).chunk([])
    assert (len(chunks), chunks.num_docs) == (0, 0)
    assert batches(chunks, 8) == []


@pytest.mark.parametrize(
    ("max_tokens", "stride", "message"),
    [
        (2, 0, "no room"),
        (1, 0, "no room"),
        (513, 0, "maximum length 512"),
        (128, -1, "0 <= stride < 126"),
        (128, 126, "0 <= stride < 126"),
    ],
)
def test_chunker_validates_its_settings(tok: Tokenizer, max_tokens: int, stride: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Chunker(tok, max_tokens=max_tokens, stride=stride)


def test_chunk_refuses_a_single_string(tok: Tokenizer) -> None:
    with pytest.raises(TypeError, match="sequence of texts"):
        Chunker(tok).chunk("w1 w2")


def test_one_chunker_is_safe_to_share_between_threads(tok: Tokenizer) -> None:
    chunker = Chunker(tok, max_tokens=100, stride=10)
    requests = [[words(50 * (r + 1) + d, offset=r) for d in range(6)] for r in range(16)]
    expected = [[ids.tolist() for ids in chunker.chunk(texts).input_ids] for texts in requests]
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(chunker.chunk, requests))
    assert [[ids.tolist() for ids in chunks.input_ids] for chunks in results] == expected


# --- batching -----------------------------------------------------------------------------------------------


@pytest.fixture
def chunks(tok: Tokenizer) -> Chunks:
    return Chunker(tok, max_tokens=32, stride=4).chunk([words(100), words(3), words(40), "", words(29)])


@pytest.mark.parametrize("sort_by_length", [True, False])
@pytest.mark.parametrize("max_batch_size", [1, 3, 4, 100])
def test_batches_pad_mask_and_cover_every_chunk_once(chunks: Chunks, max_batch_size: int, sort_by_length: bool) -> None:
    result = batches(chunks, max_batch_size, sort_by_length=sort_by_length)
    assert len(result) == -(-len(chunks) // max_batch_size)
    seen = np.concatenate([b.indices for b in result])
    assert sorted(seen.tolist()) == list(range(len(chunks)))
    if not sort_by_length:
        assert seen.tolist() == list(range(len(chunks)))
    for batch in result:
        assert 1 <= len(batch) <= max_batch_size
        assert batch.input_ids.dtype == batch.attention_mask.dtype == np.int64
        assert batch.input_ids.shape == batch.attention_mask.shape == batch.token_type_ids.shape
        assert batch.input_ids.shape[1] == max(len(chunks.input_ids[i]) for i in batch.indices)
        for row, i in enumerate(batch.indices):
            n = len(chunks.input_ids[i])
            assert batch.input_ids[row, :n].tolist() == chunks.input_ids[i].tolist()
            assert (batch.input_ids[row, n:] == PAD).all()
            assert batch.attention_mask[row].tolist() == [1] * n + [0] * (batch.input_ids.shape[1] - n)


def test_sorting_by_length_reduces_padding(chunks: Chunks) -> None:
    def padded(result: list[logicd.text.Batch]) -> int:
        return sum(b.input_ids.size for b in result)

    assert padded(batches(chunks, 2)) < padded(batches(chunks, 2, sort_by_length=False))


def test_a_model_that_does_not_batch_gets_one_chunk_per_call(chunks: Chunks) -> None:
    result = batches(chunks, 0)
    assert len(result) == len(chunks)
    assert all(b.input_ids.shape == (1, len(chunks.input_ids[b.indices[0]])) for b in result)
    assert all(b.attention_mask.all() for b in result)
    with pytest.raises(ValueError, match=">= 0"):
        batches(chunks, -1)


def test_unbatch_returns_one_output_per_chunk_in_chunk_order(chunks: Chunks) -> None:
    result = batches(chunks, 3)
    outputs = [np.stack([b.input_ids.sum(axis=1), b.attention_mask.sum(axis=1)], axis=1) for b in result]
    merged = unbatch(result, outputs)
    assert merged.shape == (len(chunks), 2)
    assert merged[:, 0].tolist() == [int(ids.sum()) for ids in chunks.input_ids]
    assert merged[:, 1].tolist() == chunks.lengths.tolist()
    with pytest.raises(ValueError, match="outputs for"):
        unbatch(result, outputs[:-1])
    with pytest.raises(ValueError, match="for a batch of"):
        unbatch(result, [o[:1] for o in outputs])


# --- aggregation --------------------------------------------------------------------------------------------


def test_mean_pool_weighted_by_token_counts_equals_manual() -> None:
    rng = np.random.default_rng(0)
    values = rng.normal(size=(6, 4)).astype(np.float32)
    doc_index = np.array([0, 0, 1, 2, 2, 2])
    counts = np.array([126, 30, 7, 126, 126, 1])
    pooled = mean_pool(values, doc_index, counts)
    assert pooled.dtype == np.float32
    assert pooled.shape == (3, 4)
    for d in range(3):
        rows = doc_index == d
        manual = (values[rows] * counts[rows, None]).sum(axis=0) / counts[rows].sum()
        np.testing.assert_allclose(pooled[d], manual, rtol=1e-6)
    np.testing.assert_allclose(mean_pool(values, doc_index)[2], values[3:].mean(axis=0), rtol=1e-6)


def test_mean_pool_handles_unsorted_docs_zero_weights_and_missing_docs() -> None:
    values = np.array([1.0, 10.0, 3.0, 5.0])
    assert mean_pool(values, [1, 0, 1, 2], [1, 2, 3, 0]).tolist() == [10.0, 2.5, 5.0]
    assert mean_pool(values, [0, 0, 1, 1], [0, 0, 1, 3]).tolist() == [5.5, 4.5]  # all-zero weights: plain mean
    assert mean_pool(np.arange(4), [0, 0, 1, 1]).dtype == np.float64
    with pytest.raises(ValueError, match=r"documents without chunks: \[1\]"):
        mean_pool(values, [0, 0, 2, 2])
    with pytest.raises(ValueError, match="without chunks"):
        mean_pool(values, [0, 0, 1, 1], num_docs=3)
    with pytest.raises(ValueError, match="do not match"):
        mean_pool(values, [0, 0, 1])
    with pytest.raises(ValueError, match=">= 0"):
        mean_pool(values, [0, 0, 1, 1], [1, -1, 1, 1])


def test_max_pool_takes_the_element_wise_maximum_per_document() -> None:
    values = np.array([[1, 9], [5, 2], [-3, -4], [7, 0]], dtype=np.int32)
    pooled = max_pool(values, [0, 0, 1, 0])
    assert pooled.dtype == np.int32
    assert pooled.tolist() == [[7, 9], [-3, -4]]


def test_softmax_sums_to_one_and_is_stable_for_large_logits() -> None:
    logits = np.array([[1000.0, 1001.0, 999.0], [-1000.0, 0.0, 1000.0], [0.0, 0.0, 0.0]])
    probs = softmax(logits)
    assert np.isfinite(probs).all()
    np.testing.assert_allclose(probs.sum(axis=-1), 1.0)
    np.testing.assert_allclose(probs[0], softmax(np.array([1.0, 2.0, 0.0])))
    np.testing.assert_allclose(probs[2], [1 / 3] * 3)
    np.testing.assert_allclose(softmax(logits, axis=0).sum(axis=0), 1.0)
    assert softmax(np.array([1, 2], dtype=np.int64)).dtype == np.float64
    assert softmax(np.array([1, 2], dtype=np.float32)).dtype == np.float32


def test_top_k_orders_by_score_with_labels() -> None:
    labels = ["neg", "neu", "pos", "mixed"]
    scores = np.array([0.1, 0.3, 0.5, 0.3])
    assert top_k(scores, labels, 3) == [LabelScore("pos", 0.5), LabelScore("neu", 0.3), LabelScore("mixed", 0.3)]
    assert top_k(scores, labels, 10)[-1] == ("neg", 0.1)
    assert top_k(scores, labels, 0) == []
    assert isinstance(top_k(scores, labels, 1)[0].score, float)
    with pytest.raises(ValueError, match="labels"):
        top_k(scores, labels[:3], 1)
    with pytest.raises(ValueError, match="k must be"):
        top_k(scores, labels, -1)


def test_l2_normalize() -> None:
    vectors = np.array([[3.0, 4.0], [0.0, 0.0]], dtype=np.float32)
    normed = l2_normalize(vectors)
    assert normed.dtype == np.float32
    np.testing.assert_allclose(normed, [[0.6, 0.8], [0.0, 0.0]])


# --- off the event loop -------------------------------------------------------------------------------------


async def test_tokenize_async_keeps_the_event_loop_responsive(tok: Tokenizer) -> None:
    chunker = Chunker(tok, max_tokens=512, stride=32)
    texts = [words(20_000, offset=d) for d in range(20)]
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    before = ticks
    chunks = await tokenize_async(chunker, texts)
    during = ticks - before
    stop.set()
    await task
    # Had the tokenization run on the loop thread, the ticker could not have run until it finished.
    assert during > 0
    assert chunks.doc_token_counts.tolist() == [20_000] * 20


async def test_tokenizer_pool_runs_on_its_own_threads(tok: Tokenizer) -> None:
    threads: list[str] = []

    class Spy(Chunker):
        def chunk(self, texts: object) -> Chunks:  # type: ignore[override]
            threads.append(threading.current_thread().name)
            return super().chunk(texts)  # type: ignore[arg-type]

    async with TokenizerPool(max_workers=2) as pool:
        assert pool.max_workers == 2
        results = await asyncio.gather(*(tokenize_async(Spy(tok), [words(n)], pool=pool) for n in (10, 600, 2000)))
    assert [r.doc_token_counts.tolist() for r in results] == [[10], [600], [2000]]
    assert all(name.startswith("logicd-tokenize") for name in threads)
    with pytest.raises(TypeError, match="sequence of texts"):
        await tokenize_async(Chunker(tok), "w1")
    with pytest.raises(ValueError, match="max_workers"):
        TokenizerPool(max_workers=0)
