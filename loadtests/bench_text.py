"""Cost of the text toolkit: `python -m loadtests.bench_text` from the repository root.

Chunks 100 documents of ~2,000 words (512-token windows, stride 64) and prints tokens/s for
  - one `Chunker.chunk` call holding all 100 documents (the floor: one batch call of the Rust tokenizer),
  - 10 requests of 10 documents through `tokenize_async` on the thread pool, 2 at a time (concurrency 2),
  - the same through a process pool (texts pickled in, id arrays pickled out): why the toolkit uses threads,
  - the tokenizer's own truncation with overflow (on a private tokenizer instance), for comparison,
and, for the single call run on the event loop vs through the pool, the longest gap a ticker task saw.

Without ``--tokenizer`` a BERT-like WordPiece tokenizer (vocabulary up to 30,522) is trained on synthetic text
first (no downloads; synthetic words are short, so tokens/s runs higher than on English text); pass
``--tokenizer`` a real tokenizer.json or transformers tokenizer folder to measure that one.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors, trainers

from logicd.text import Chunker, Chunks, TokenizerPool, load_tokenizer, tokenize_async

DOCS = 100
WORDS_PER_DOC = 2000
REQUEST_DOCS = 10
CONCURRENCY = 2
MAX_TOKENS = 512
STRIDE = 64
ROUNDS = 3


def _lexicon(rng: np.random.Generator, size: int = 20_000) -> list[str]:
    syllables = [c + v for c in "bcdfghjklmnprstvwz" for v in ("a", "e", "i", "o", "u", "ai", "ou")]
    return ["".join(rng.choice(syllables, size=int(rng.integers(1, 5)))) for _ in range(size)]


def _text(rng: np.random.Generator, lexicon: Sequence[str], words: int) -> str:
    ranks = np.minimum(rng.zipf(1.2, size=words), len(lexicon)) - 1  # Zipf: common words, a long rare tail
    out = []
    for i, rank in enumerate(ranks):
        out.append(lexicon[rank])
        if i % 13 == 12:
            out.append(",."[i % 2])
    return " ".join(out)


def build_tokenizer(folder: Path, rng: np.random.Generator, lexicon: Sequence[str]) -> Path:
    """Train a BERT-like WordPiece tokenizer (lowercase, [CLS] ... [SEP]) on synthetic text."""
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = tokenizers.Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    corpus = [_text(rng, lexicon, 2000) for _ in range(300)]
    tok.train_from_iterator(corpus, trainers.WordPieceTrainer(vocab_size=30_522, special_tokens=specials))
    tok.post_processor = processors.BertProcessing(("[SEP]", tok.token_to_id("[SEP]")), ("[CLS]", 2))
    file = folder / "tokenizer.json"
    tok.save(str(file))
    return file


def _best(run: Callable[[], object]) -> float:
    times = []
    for _ in range(ROUNDS):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return min(times)


async def _with_ticker(work: Callable[[], Awaitable[object]]) -> float:
    """Longest gap (s) between two ticks of a task that only yields, while ``work`` runs."""
    gaps: list[float] = []
    done = asyncio.Event()

    async def ticker() -> None:
        last = time.perf_counter()
        while not done.is_set():
            await asyncio.sleep(0)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    await work()
    done.set()
    await task
    return max(gaps)


def _chunk_in_process(chunker: Chunker, texts: list[str]) -> Chunks:
    return chunker.chunk(texts)


def _overflow_windows(file: Path, texts: list[str]) -> int:
    raw = tokenizers.Tokenizer.from_file(str(file))  # private instance: truncation state must not be shared
    raw.enable_truncation(MAX_TOKENS, stride=STRIDE)
    return sum(1 + len(e.overflowing) for e in raw.encode_batch(texts))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, help="a tokenizer.json or tokenizer folder (default: trained here)")
    args = parser.parse_args(argv)
    rng = np.random.default_rng(0)
    lexicon = _lexicon(rng)
    with tempfile.TemporaryDirectory() as tmp:
        file = args.tokenizer or build_tokenizer(Path(tmp), rng, lexicon)
        tok = load_tokenizer(file)
        chunker = Chunker(tok, MAX_TOKENS, STRIDE)
        docs = [_text(rng, lexicon, WORDS_PER_DOC) for _ in range(DOCS)]
        requests = [docs[i : i + REQUEST_DOCS] for i in range(0, DOCS, REQUEST_DOCS)]
        chunks = chunker.chunk(docs)
        tokens = int(chunks.doc_token_counts.sum())

        print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {sys.version.split()[0]}")
        print(f"tokenizer: {tok.path} (vocab {tok.vocab_size}); tokenizers {tokenizers.__version__}")
        print(
            f"{DOCS} documents x {WORDS_PER_DOC} words = {tokens:,} tokens "
            f"({statistics.mean(chunks.doc_token_counts.tolist()):.0f}/doc) -> {len(chunks)} chunks "
            f"of <= {MAX_TOKENS}, stride {STRIDE}; best of {ROUNDS}\n"
        )
        rows: list[tuple[str, float]] = []
        rows.append(("one chunk() call, 100 docs", _best(lambda: chunker.chunk(docs))))
        rows.append(("encode_batch only (no windows)", _best(lambda: tok.encode_ids(docs))))

        async def concurrent(submit: Callable[[list[str]], Awaitable[Chunks]]) -> None:
            queue = list(requests)

            async def worker() -> None:
                while queue:
                    await submit(queue.pop())

            await asyncio.gather(*(worker() for _ in range(CONCURRENCY)))

        with TokenizerPool() as pool:
            rows.append(
                (
                    f"thread pool ({pool.max_workers}), c={CONCURRENCY}, 10 x 10 docs",
                    _best(lambda: asyncio.run(concurrent(lambda t: tokenize_async(chunker, t, pool=pool)))),
                )
            )
            with ProcessPoolExecutor(CONCURRENCY) as procs:
                procs.submit(_chunk_in_process, chunker, docs[:1]).result()  # start the workers

                async def in_process(texts: list[str]) -> Chunks:
                    loop = asyncio.get_running_loop()
                    return await loop.run_in_executor(procs, _chunk_in_process, chunker, texts)

                rows.append(
                    (
                        f"process pool ({CONCURRENCY}), c={CONCURRENCY}, 10 x 10 docs",
                        _best(lambda: asyncio.run(concurrent(in_process))),
                    )
                )
            rows.append(("truncation + overflow, 100 docs", _best(lambda: _overflow_windows(Path(tok.path), docs))))

            print(f"| {'mode':<40} | {'seconds':>7} | {'tokens/s':>10} |")
            print(f"|{'-' * 42}|{'-' * 9}|{'-' * 12}|")
            for label, seconds in rows:
                print(f"| {label:<40} | {seconds:7.3f} | {tokens / seconds:10,.0f} |")

            async def on_loop() -> None:
                chunker.chunk(docs)

            async def off_loop() -> None:
                await tokenize_async(chunker, docs, pool=pool)

            print("\nlongest event-loop stall while chunking the 100 documents (a ticker task's largest gap):")
            print(f"| {'where':<40} | {'max gap ms':>10} |")
            print(f"|{'-' * 42}|{'-' * 12}|")
            print(f"| {'on the loop (chunker.chunk)':<40} | {asyncio.run(_with_ticker(on_loop)) * 1e3:10.1f} |")
            print(f"| {'tokenize_async (thread pool)':<40} | {asyncio.run(_with_ticker(off_loop)) * 1e3:10.1f} |")


if __name__ == "__main__":
    main()
