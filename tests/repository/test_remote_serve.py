"""``modelsvc serve --model-repository s3://...`` against moto's S3 server: served from the bucket, and following it
in poll mode (the copy is refreshed before each poll) and on load requests in explicit mode."""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from modelsvc.tools import onnx_models as om
from tests._server import ModelsvcProcess, wait_for
from tests.conftest import identity_config
from tests.repository.test_remote_repository import aws_env, bucket, moto, s3, upload  # noqa: F401 (fixtures)

pytestmark = pytest.mark.integration

WAIT = 30.0
ROW = np.arange(16, dtype=np.float32).reshape(1, 16)
T = TypeVar("T")


def infer(client: httpclient.InferenceServerClient, model: str) -> Any:
    inp = httpclient.InferInput("INPUT0", [1, 16], "FP32")
    inp.set_data_from_numpy(ROW)
    return client.infer(model, [inp]).as_numpy("OUTPUT0")


def model_folder(tmp_path: Path, name: str) -> Path:
    root = tmp_path / f"upload-{name}"
    om.write_model(root, name, om.identity(), identity_config(name))
    return root


def test_poll_mode_follows_the_bucket(s3: Any, bucket: str, tmp_path: Path) -> None:  # noqa: F811
    upload(s3, bucket, "repo", model_folder(tmp_path, "identity"))
    flags = ("--model-control-mode", "poll", "--repository-poll-secs", "1")
    with ModelsvcProcess(f"s3://{bucket}/repo", *flags) as proc:
        client = httpclient.InferenceServerClient(proc.url)
        np.testing.assert_array_equal(infer(client, "identity"), ROW)

        upload(s3, bucket, "repo", model_folder(tmp_path, "added"))
        wait_for(lambda: client.is_model_ready("added"), "the uploaded model to load")
        np.testing.assert_array_equal(infer(client, "added"), ROW)

        for key in [o["Key"] for o in s3.list_objects_v2(Bucket=bucket, Prefix="repo/identity/")["Contents"]]:
            s3.delete_object(Bucket=bucket, Key=key)

        def listed() -> set[str]:
            return {r["name"] for r in httpx.post(f"{proc.base}/v2/repository/index").json()}

        wait_for(lambda: "identity" not in listed(), "the deleted model to unload")
        assert not client.is_model_ready("identity")
        assert client.is_server_ready()
        client.close()


def test_explicit_load_refreshes_the_copy_first(s3: Any, bucket: str, tmp_path: Path) -> None:  # noqa: F811
    upload(s3, bucket, "repo", model_folder(tmp_path, "identity"))
    flags = ("--model-control-mode", "explicit")
    with ModelsvcProcess(f"s3://{bucket}/repo", *flags) as proc:
        client = httpclient.InferenceServerClient(proc.url)
        assert not client.is_model_ready("identity")
        upload(s3, bucket, "repo", model_folder(tmp_path, "later"))
        client.load_model("later")  # uploaded after the start: the load request brings it over
        np.testing.assert_array_equal(infer(client, "later"), ROW)
        client.close()


def test_an_unusable_bucket_stops_the_server(bucket: str, tmp_path: Path) -> None:  # noqa: F811
    proc = ModelsvcProcess(f"s3://{bucket}/nothing-here")
    assert proc.start().wait_exit() == 1
    assert "nothing is stored under this prefix" in proc.log()
