"""`python -m services.build`: what is missing gets built (the model exported once, then copied), and a
second run writes nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from services import build
from tests._server import ROOT


def test_missing_files_are_copied_from_the_built_model_without_exporting_again(built, tmp_path):
    # a tree where doc_classifier's model is built and everything else is missing
    source = build.model_file("doc_classifier")
    target = build.model_file("doc_classifier", tmp_path)
    target.parent.mkdir(parents=True)
    os.link(source, target)
    for service in build.SERVICES:
        config = build.model_file(service).parents[1] / "config.pbtxt"
        (build.model_file(service, tmp_path).parents[1]).mkdir(parents=True, exist_ok=True)
        shutil.copy(config, build.model_file(service, tmp_path).parents[1] / "config.pbtxt")
    assert build.model_file("embedder", tmp_path) in build.missing(tmp_path)

    said: list[str] = []
    written = build.build(say=said.append, root=tmp_path)
    assert not any("exporting" in line for line in said), said  # copied, not exported
    assert build.missing(tmp_path) == []
    assert build.model_file("embedder", tmp_path) in written
    assert build.model_file("embedder", tmp_path).read_bytes() == source.read_bytes()
    assert (build.tokenizer_dir("embedder", tmp_path) / "tokenizer.json").is_file()
    assert not list(tmp_path.rglob(".*.partial"))
    assert build.build(say=said.append, root=tmp_path) == []  # nothing left to do


def test_the_command_says_everything_is_built(built):
    done = subprocess.run(
        [sys.executable, "-m", "services.build"], capture_output=True, text=True, cwd=ROOT, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "everything is built" in done.stdout
