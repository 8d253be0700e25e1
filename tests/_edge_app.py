"""A logicd app served in this process by uvicorn on a free port (real HTTP, so a caller can disconnect), with
a small word-piece tokenizer: for the tests of logicd's sequences and streams."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import uvicorn
from tokenizers.implementations import BertWordPieceTokenizer

from loadtests.harness._servers import free_port
from logicd import Service, create_app, load_config

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]


def service_yaml(folder: Path, url: str, models: list[str], max_tokens: int = 8) -> Path:
    """A service.yaml in ``folder`` for ``models`` at ``url``, with a tokenizer of ``WORDS``."""
    vocab = folder / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    BertWordPieceTokenizer(str(vocab), lowercase=True).save(str(folder / "tokenizer.json"))
    path = folder / "service.yaml"
    path.write_text(
        f"""name: edge-test
service: unused:service
model_service:
  url: {url}
  timeout_s: 10
  retries: 0
models: [{", ".join(models)}]
tokenizer:
  path: ./tokenizer.json
chunking:
  max_tokens: {max_tokens}
  stride: 0
"""
    )
    return path


@contextmanager
def serve(service: Service, config_path: Path) -> Iterator[str]:
    """The app of ``service`` under ``config_path``, served until the block ends; yields its base URL."""
    port = free_port()
    app = create_app(service, load_config(config_path))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, name="edge-logicd", daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise RuntimeError("the logicd app did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)
