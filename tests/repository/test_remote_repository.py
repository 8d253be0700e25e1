"""Remote model repositories: a real S3-compatible server (moto's server mode) on 127.0.0.1, synced into a cache.

The store is a real HTTP server in a child process; s3fs and boto3 talk to it over sockets. The one stand-in
is a download that fails half-way (a network fault), to check that it leaves no half-written model behind.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from modelsvc.repository import (
    ModelRepository,
    NoModelsError,
    RemoteAccessError,
    RemoteNotFoundError,
    RemoteRepository,
    RemoteRepositoryError,
    default_cache_dir,
    is_remote,
)
from modelsvc.repository._remote._swap import _renameat2
from modelsvc.tools import onnx_models as om
from tests._server import ROOT, ModelsvcProcess, free_port
from tests.conftest import identity_config

IDENTITY_V2 = identity_config("identity", extra="dynamic_batching { max_queue_delay_microseconds: 100 }")


# --- fixtures ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto's S3 server in a child process on a free port; yields its endpoint URL."""
    port = free_port()
    endpoint = f"http://127.0.0.1:{port}"
    log_path = tmp_path_factory.mktemp("moto") / "moto.log"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_") and k != "INITIAL_NO_AUTH_ACTION_COUNT"}
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=env,
        )
    try:
        deadline = time.monotonic() + 30
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"moto exited with {proc.returncode}:\n{log_path.read_text()}")
            try:
                if httpx.get(f"{endpoint}/moto-api/", timeout=1.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"moto not ready after 30 s:\n{log_path.read_text()}")
            time.sleep(0.05)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(10)


@pytest.fixture(autouse=True)
def aws_env(moto: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials and endpoint for moto in the environment only; no real AWS files or metadata service."""
    for name in list(os.environ):
        if name.startswith(("AWS_", "AZURE_", "GOOGLE_")):
            monkeypatch.delenv(name)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("MODELSVC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")


@pytest.fixture
def s3(moto: str) -> Any:
    return boto3.client("s3", endpoint_url=moto, region_name="us-east-1")


@pytest.fixture
def bucket(s3: Any) -> str:
    name = f"models-{uuid.uuid4().hex[:12]}"
    s3.create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="module")
def local_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """What gets uploaded: two ONNX models and a file at the top level."""
    repo = tmp_path_factory.mktemp("upload")
    om.write_model(repo, "identity", om.identity(), identity_config("identity"))
    om.write_model(repo, "add_sub", om.add_sub(), None, versions=(1, 2))
    (repo / "README.md").write_text("models for the tests\n")
    return repo


def upload(s3: Any, bucket: str, prefix: str, root: Path) -> None:
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        s3.put_object(Bucket=bucket, Key=f"{prefix}/{path.relative_to(root).as_posix()}", Body=path.read_bytes())


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


# --- locations ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("location", "remote"),
    [
        ("s3://bucket/prefix", True),
        ("S3://bucket", True),
        ("s3://127.0.0.1:9000/bucket/prefix", True),
        ("gs://bucket/prefix", True),
        ("gcs://bucket/prefix", True),
        ("az://container/prefix", True),
        ("abfs://container@account.dfs.core.windows.net/p", True),
        ("as://account/container/prefix", True),
        ("/srv/models", False),
        ("models", False),
        ("file:///srv/models", False),
        ("http://example.com/models", False),
    ],
)
def test_is_remote(location: str, remote: bool) -> None:
    assert is_remote(location) is remote


@pytest.mark.parametrize(
    ("url", "secret"),
    [
        ("s3://AKIAEXAMPLE:s3cr3tKey@bucket/prefix", "s3cr3tKey"),
        ("s3://AKIAEXAMPLE@bucket/prefix", "AKIAEXAMPLE"),
        ("s3://minio:s3cr3tKey@127.0.0.1:9000/bucket/prefix", "s3cr3tKey"),
        ("s3://https://minio:s3cr3tKey@minio.local:9000/bucket/prefix", "s3cr3tKey"),
        ("gs://user:s3cr3tKey@bucket/prefix", "s3cr3tKey"),
        ("az://user:s3cr3tKey@container/prefix", "s3cr3tKey"),
        ("s3://bucket/prefix?X-Amz-Credential=s3cr3tKey", "s3cr3tKey"),
        ("az://container/prefix?sig=s3cr3tKey", "s3cr3tKey"),
    ],
)
def test_credentials_in_the_url_are_refused_and_never_shown(
    url: str, secret: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    with pytest.raises(RemoteRepositoryError) as info:
        RemoteRepository(url)
    assert "refused" in str(info.value) or "query string" in str(info.value)
    assert secret not in str(info.value)
    assert secret not in repr(info.value.args)
    assert secret not in caplog.text


def test_missing_filesystem_package_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "gcsfs", None)  # as if not installed
    with pytest.raises(RemoteRepositoryError, match=r"pip install 'modelsvc\[gcs\]' \(or pip install gcsfs\)"):
        RemoteRepository("gs://bucket/models")
    monkeypatch.setitem(sys.modules, "adlfs", None)
    # a container@account authority is Azure's own form, not credentials: it gets as far as the package check
    with pytest.raises(RemoteRepositoryError, match=r"modelsvc\[azure\]"):
        RemoteRepository("abfs://models@account.dfs.core.windows.net/repo")


def test_bad_locations() -> None:
    with pytest.raises(RemoteRepositoryError, match="names no bucket"):
        RemoteRepository("s3://")
    with pytest.raises(RemoteRepositoryError, match="names no bucket"):
        RemoteRepository("s3://127.0.0.1:9000/")
    with pytest.raises(RemoteRepositoryError, match="not a remote repository"):
        RemoteRepository("/srv/models")


def test_errors_read_location_then_message_and_pickle() -> None:
    err = RemoteAccessError("access denied", "s3://bucket/repo")
    assert str(err) == "s3://bucket/repo: access denied"
    copy = pickle.loads(pickle.dumps(err))
    assert (type(copy), copy.location, copy.message) == (RemoteAccessError, "s3://bucket/repo", "access denied")
    assert isinstance(NoModelsError("x"), RemoteRepositoryError)
    assert str(RemoteRepositoryError("no location")) == "no location"


def test_default_cache_dir_per_location(tmp_path: Path, moto: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = tmp_path / "cache" / "repositories"
    a = default_cache_dir("s3://bucket/a")
    assert a.parent == cache
    assert a == default_cache_dir("s3://bucket/a/")
    assert a != default_cache_dir("s3://bucket/b")
    # the same bucket behind another endpoint is another repository
    assert a != default_cache_dir("s3://127.0.0.1:9000/bucket/a")
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:1")
    assert a != default_cache_dir("s3://bucket/a")
    monkeypatch.delenv("MODELSVC_CACHE_DIR")
    assert default_cache_dir("s3://bucket/a").parent == tmp_path / "home" / ".cache" / "modelsvc" / "repositories"
    repo = RemoteRepository("s3://127.0.0.1:9000/bucket/a/")
    assert repo.url == "s3://127.0.0.1:9000/bucket/a"
    assert repo.path == default_cache_dir("s3://127.0.0.1:9000/bucket/a") / "models"


# --- sync -------------------------------------------------------------------------------------------------


def test_sync_mirrors_the_tree_then_downloads_only_what_changed(
    s3: Any, bucket: str, local_repo: Path, tmp_path: Path
) -> None:
    upload(s3, bucket, "prod/models", local_repo)
    repo = RemoteRepository(f"s3://{bucket}/prod/models", tmp_path / "c")
    first = repo.sync()
    assert (first.added, first.changed, first.removed, first.incomplete) == (("add_sub", "identity"), (), (), ())
    assert first.root_changed
    assert first.files_downloaded == 5
    assert tree(repo.path) == tree(local_repo)
    assert ModelRepository(repo.path, gpus=()).model_names() == ["add_sub", "identity"]

    again = RemoteRepository(f"s3://{bucket}/prod/models/", tmp_path / "c").sync()  # a restart: nothing to fetch
    assert (again.models, again.files_downloaded, again.root_changed) == ((), 0, False)

    unchanged = repo.path / "identity" / "1" / "model.onnx"
    inode = unchanged.stat().st_ino
    s3.put_object(Bucket=bucket, Key="prod/models/identity/config.pbtxt", Body=IDENTITY_V2.encode())
    upload(s3, bucket, "prod/models/third", local_repo / "identity")
    s3.put_object(Bucket=bucket, Key="prod/models/third/config.pbtxt", Body=identity_config("third").encode())
    for key in ("add_sub/1/model.onnx", "add_sub/2/model.onnx", "README.md"):
        s3.delete_object(Bucket=bucket, Key=f"prod/models/{key}")
    s3.put_object(Bucket=bucket, Key="prod/models/NOTES", Body=b"new\n")

    result = repo.sync()
    assert (result.added, result.changed, result.removed) == (("third",), ("identity",), ("add_sub",))
    assert result.models == ("add_sub", "identity", "third")
    assert result.files_downloaded == 1 + 2 + 1  # identity's config, third's two files, NOTES
    assert result.files_deleted == 3
    assert result.root_changed
    assert (repo.path / "identity" / "config.pbtxt").read_text() == IDENTITY_V2
    # the unchanged model file was carried over (a hard link), not downloaded again
    assert unchanged.stat().st_ino == inode
    assert sorted(p.name for p in repo.path.iterdir()) == ["NOTES", "identity", "third"]
    assert not list((repo.cache_dir / "staging").iterdir())
    assert ModelRepository(repo.path, gpus=()).load("third").versions == [1]


def test_half_uploaded_model_is_held_back(s3: Any, bucket: str, local_repo: Path, tmp_path: Path) -> None:
    upload(s3, bucket, "repo", local_repo)
    repo = RemoteRepository(f"s3://{bucket}/repo", tmp_path / "c")
    repo.sync()
    # a new model whose config is up but whose version file is not yet; an S3 folder marker for its version
    s3.put_object(Bucket=bucket, Key="repo/late/config.pbtxt", Body=identity_config("late").encode())
    s3.put_object(Bucket=bucket, Key="repo/late/1/", Body=b"")
    result = repo.sync()
    assert (result.added, result.incomplete) == ((), ("late",))
    assert not (repo.path / "late").exists()

    # a re-upload in progress: identity's version file deleted, the new one not there yet -> the old copy stays
    s3.delete_object(Bucket=bucket, Key="repo/identity/1/model.onnx")
    s3.put_object(Bucket=bucket, Key="repo/identity/config.pbtxt", Body=IDENTITY_V2.encode())
    result = repo.sync()
    assert (result.changed, result.removed, result.incomplete) == ((), (), ("identity", "late"))
    assert (repo.path / "identity" / "1" / "model.onnx").read_bytes() == (
        local_repo / "identity" / "1" / "model.onnx"
    ).read_bytes()
    assert (repo.path / "identity" / "config.pbtxt").read_text() == identity_config("identity")

    model_file = (local_repo / "identity" / "1" / "model.onnx").read_bytes()
    s3.put_object(Bucket=bucket, Key="repo/late/1/model.onnx", Body=model_file)
    s3.put_object(Bucket=bucket, Key="repo/identity/1/model.onnx", Body=model_file)
    result = repo.sync()
    assert (result.added, result.changed, result.incomplete) == (("late",), ("identity",), ())
    assert sorted(p.name for p in (repo.path / "late").rglob("*")) == ["1", "config.pbtxt", "model.onnx"]
    assert ModelRepository(repo.path, gpus=()).load("late").name == "late"


def test_interrupted_download_leaves_every_model_whole(
    s3: Any, bucket: str, local_repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    upload(s3, bucket, "repo", local_repo)
    repo = RemoteRepository(f"s3://{bucket}/repo", tmp_path / "c")
    repo.sync()
    before = tree(repo.path)
    new_model = om.identity(dims=["batch", 8])
    s3.put_object(Bucket=bucket, Key="repo/identity/1/model.onnx", Body=new_model.SerializeToString())
    s3.put_object(Bucket=bucket, Key="repo/identity/config.pbtxt", Body=identity_config("identity", dims="8").encode())

    real_get = repo._fs.get_file
    calls: list[str] = []

    def flaky(rpath: str, lpath: str) -> None:
        calls.append(rpath)
        if len(calls) == 2:  # the second file: half of it arrives, then the connection drops
            Path(lpath).write_bytes(b"\x08\x07half")
            raise ConnectionResetError("connection reset by peer")
        real_get(rpath, lpath)

    monkeypatch.setattr(repo._fs, "get_file", flaky)
    with pytest.raises(RemoteRepositoryError, match=r"downloading identity/.*connection reset") as info:
        repo.sync()
    assert type(info.value) is RemoteRepositoryError
    assert tree(repo.path) == before  # the new config did not go in without its model file
    assert not list((repo.cache_dir / "staging").iterdir())

    monkeypatch.undo()
    result = repo.sync()
    assert (result.changed, result.files_downloaded) == (("identity",), 2)
    assert (repo.path / "identity" / "1" / "model.onnx").read_bytes() == new_model.SerializeToString()


_READER = """
import os, sys
config, model, stop = sys.argv[1:]
looks = misses = 0
while not os.path.exists(stop):
    looks += 1
    if not (os.path.isfile(config) and os.path.isfile(model)):
        misses += 1
print(looks, misses)
"""


@pytest.mark.skipif(_renameat2() is None, reason="no atomic directory exchange (renameat2) here")
def test_a_reader_never_sees_a_model_folder_missing_or_partial(
    s3: Any, bucket: str, local_repo: Path, tmp_path: Path
) -> None:
    """While syncs swap a model folder over and over, a reader in another process always finds its files.

    (With two plain renames in place of the exchange, this reader sees the folder missing many times.)
    """
    upload(s3, bucket, "repo", local_repo)
    repo = RemoteRepository(f"s3://{bucket}/repo", tmp_path / "c")
    repo.sync()
    model_dir = repo.path / "identity"
    stop = tmp_path / "stop"
    reader = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _READER,
            str(model_dir / "config.pbtxt"),
            str(model_dir / "1" / "model.onnx"),
            str(stop),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        for i in range(10):
            config = identity_config("identity", extra=f"dynamic_batching {{ max_queue_delay_microseconds: {i} }}")
            s3.put_object(Bucket=bucket, Key="repo/identity/config.pbtxt", Body=config.encode())
            assert repo.sync().changed == ("identity",)
    finally:
        stop.touch()
        out, _ = reader.communicate(timeout=10)
    looks, misses = map(int, out.split())
    assert looks > 0
    assert misses == 0, f"{misses} of {looks} looks found the folder missing or partial"


def test_local_damage_is_repaired(s3: Any, bucket: str, local_repo: Path, tmp_path: Path) -> None:
    upload(s3, bucket, "repo", local_repo)
    repo = RemoteRepository(f"s3://{bucket}/repo", tmp_path / "c")
    repo.sync()
    (repo.path / "add_sub" / "2" / "model.onnx").unlink()
    (repo.path / "stray").mkdir()
    result = repo.sync()
    assert (result.changed, result.removed, result.files_downloaded) == (("add_sub",), ("stray",), 1)
    assert tree(repo.path) == tree(local_repo)


def test_emptied_prefix_is_an_error_at_start_and_unloads_in_a_poll(
    s3: Any, bucket: str, local_repo: Path, tmp_path: Path
) -> None:
    upload(s3, bucket, "repo", local_repo)
    repo = RemoteRepository(f"s3://{bucket}/repo", tmp_path / "c")
    repo.sync()
    before = tree(repo.path)
    for path in local_repo.rglob("*"):
        if path.is_file():
            s3.delete_object(Bucket=bucket, Key=f"repo/{path.relative_to(local_repo).as_posix()}")
    with pytest.raises(RemoteNotFoundError, match="nothing is stored under this prefix"):
        repo.sync()
    assert tree(repo.path) == before  # an error changes nothing
    result = repo.sync(allow_empty=True)
    assert (result.removed, result.files_deleted) == (("add_sub", "identity"), 5)
    assert list(repo.path.iterdir()) == []


def test_triton_endpoint_form(
    s3: Any, bucket: str, local_repo: Path, moto: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``s3://host:port/bucket/path`` names the endpoint itself, as tritonserver takes it."""
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    upload(s3, bucket, "repo", local_repo)
    host_port = moto.removeprefix("http://")
    for url in (f"s3://{host_port}/{bucket}/repo", f"s3://http://{host_port}/{bucket}/repo"):
        repo = RemoteRepository(url)
        assert repo.sync().added == ("add_sub", "identity")
        assert tree(repo.path) == tree(local_repo)


# --- errors -----------------------------------------------------------------------------------------------


def test_missing_bucket_and_prefix(bucket: str, s3: Any, tmp_path: Path) -> None:
    with pytest.raises(RemoteNotFoundError, match=r"^s3://no-such-bucket-here/repo: .*bucket does not exist"):
        RemoteRepository("s3://no-such-bucket-here/repo", tmp_path / "a").sync()
    with pytest.raises(RemoteNotFoundError, match=rf"^s3://{bucket}/nothing-here: nothing is stored"):
        RemoteRepository(f"s3://{bucket}/nothing-here", tmp_path / "b").sync()


def test_no_models_under_the_prefix(bucket: str, s3: Any, tmp_path: Path) -> None:
    s3.put_object(Bucket=bucket, Key="repo/README.md", Body=b"hello")
    s3.put_object(Bucket=bucket, Key="repo/docs/guide.md", Body=b"hello")
    with pytest.raises(NoModelsError, match="no model folders here"):
        RemoteRepository(f"s3://{bucket}/repo", tmp_path / "a").sync()
    s3.put_object(Bucket=bucket, Key="repo/m/config.pbtxt", Body=b'name: "m"')
    with pytest.raises(NoModelsError, match=r"held back until their version files arrive: m\)"):
        RemoteRepository(f"s3://{bucket}/repo", tmp_path / "a").sync()
    assert not (tmp_path / "a" / "models" / "README.md").exists()


def test_unusable_cache_folder(s3: Any, bucket: str, local_repo: Path, tmp_path: Path) -> None:
    upload(s3, bucket, "repo", local_repo)
    (tmp_path / "not-a-folder").write_text("")
    with pytest.raises(RemoteRepositoryError, match=r"cannot update the local copy in .*not-a-folder"):
        RemoteRepository(f"s3://{bucket}/repo", tmp_path / "not-a-folder").sync()


def test_no_credentials(bucket: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    with pytest.raises(RemoteAccessError, match=r"no credentials found .* AWS_ACCESS_KEY_ID"):
        RemoteRepository(f"s3://{bucket}/repo", tmp_path / "a").sync()


def test_credentials_from_a_profile_and_refused_ones(
    s3: Any, bucket: str, local_repo: Path, moto: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """moto checks signatures and IAM policies once its auth is switched on (POST /moto-api/reset-auth)."""
    upload(s3, bucket, "repo", local_repo)
    iam = boto3.client("iam", endpoint_url=moto, region_name="us-east-1")
    reader, nobody = f"reader-{bucket}", f"nobody-{bucket}"
    read = {
        "Version": "2012-10-17",
        "Statement": [{"Effect": "Allow", "Action": ["s3:ListBucket", "s3:GetObject"], "Resource": "*"}],
    }
    keys = {}
    for user in (reader, nobody):
        iam.create_user(UserName=user)
        keys[user] = iam.create_access_key(UserName=user)["AccessKey"]
    iam.put_user_policy(UserName=reader, PolicyName="read", PolicyDocument=json.dumps(read))
    credentials = tmp_path / "home" / ".aws" / "credentials"
    credentials.parent.mkdir()
    credentials.write_text(
        f"[modelsvc]\naws_access_key_id = {keys[reader]['AccessKeyId']}\n"
        f"aws_secret_access_key = {keys[reader]['SecretAccessKey']}\n"
    )
    httpx.post(f"{moto}/moto-api/reset-auth", content=b"0").raise_for_status()
    try:
        with pytest.raises(RemoteAccessError, match=r"access denied .*Access Key Id you provided does not exist"):
            RemoteRepository(f"s3://{bucket}/repo", tmp_path / "a").sync()  # "testing" is no key moto knows

        monkeypatch.setenv("AWS_ACCESS_KEY_ID", keys[nobody]["AccessKeyId"])
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", keys[nobody]["SecretAccessKey"])
        with pytest.raises(RemoteAccessError, match=r"access denied while listing the repository \(Access Denied\)"):
            RemoteRepository(f"s3://{bucket}/repo", tmp_path / "a").sync()

        monkeypatch.delenv("AWS_ACCESS_KEY_ID")
        monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
        monkeypatch.setenv("AWS_PROFILE", "modelsvc")  # ~/.aws/credentials, found through HOME
        repo = RemoteRepository(f"s3://{bucket}/repo", tmp_path / "b")
        assert repo.sync().added == ("add_sub", "identity")
    finally:
        httpx.post(f"{moto}/moto-api/reset-auth", content=b"inf").raise_for_status()
    assert tree(repo.path) == tree(local_repo)


# --- served -----------------------------------------------------------------------------------------------


@pytest.mark.integration
def test_modelsvc_serves_the_synced_repository(s3: Any, bucket: str, local_repo: Path) -> None:
    upload(s3, bucket, "repo", local_repo)
    repo = RemoteRepository(f"s3://{bucket}/repo")
    repo.sync()
    with ModelsvcProcess(repo.path) as server:
        client = httpclient.InferenceServerClient(server.url)
        data = np.arange(16, dtype=np.float32).reshape(1, 16)
        inp = httpclient.InferInput("INPUT0", [1, 16], "FP32")
        inp.set_data_from_numpy(data)
        result = client.infer("identity", [inp])
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
        assert client.is_model_ready("add_sub", "2")
