"""Amazon S3 and S3-compatible servers (MinIO, Ceph, ...), through s3fs (``pip install 'modelsvc[s3]'``).

Locations
    ``s3://bucket/prefix``                   Amazon S3, or the S3-compatible server that
                                             ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` names
    ``s3://host:port/bucket/prefix``         an S3-compatible server at ``http://host:port``; Triton's form
    ``s3://https://host:port/bucket/prefix`` the same over HTTPS

Credentials
    ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY`` and ``AWS_SESSION_TOKEN``; or ``AWS_PROFILE`` with
    ``~/.aws/credentials`` and ``~/.aws/config``; or the machine's role (EC2, ECS, EKS), as botocore finds
    them. ``AWS_DEFAULT_REGION`` or ``AWS_REGION`` picks the region. The endpoint, when the URL names one,
    goes to s3fs as ``client_kwargs={"endpoint_url": ...}``.

Checksum
    A listing carries each object's ``ETag`` (the MD5 of a single-part upload, an opaque tag of a multipart
    one) and its ``LastModified``: a changed ETag or size means a changed file.
"""

from __future__ import annotations

import os
import re
from typing import Any

from ._errors import RemoteRepositoryError
from ._provider import Location, Provider, refuse_secrets

__all__ = ["S3"]


def _env_endpoint() -> str | None:
    """The S3 endpoint that the AWS tools take from the environment, unless told to ignore it."""
    if os.environ.get("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "").strip().lower() == "true":
        return None
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


class S3(Provider):
    kind = "s3"
    schemes = ("s3",)
    package = "s3fs"
    extra = "s3"
    credentials_hint = (
        "credentials come from AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY (and AWS_SESSION_TOKEN), "
        "or AWS_PROFILE with ~/.aws/credentials, or the machine's role"
    )
    credential_errors = frozenset({"NoCredentialsError"})  # botocore's

    def parse(self, scheme: str, rest: str) -> Location:
        """``bucket/path``, or Triton's ``[http[s]://]host:port/bucket/path`` whose first part names the endpoint."""
        endpoint_scheme = ""
        match = re.match(r"^(https?)://", rest, re.IGNORECASE)
        if match:
            endpoint_scheme = match.group(1).lower()
            rest = rest[match.end() :]
        refuse_secrets(rest)
        authority, _, path = rest.partition("/")
        if endpoint_scheme or ":" in authority:
            if not authority:
                raise RemoteRepositoryError(
                    "the S3 URL names an endpoint scheme but no host", f"s3://{endpoint_scheme}://"
                )
            endpoint: str | None = f"{endpoint_scheme or 'http'}://{authority}"
            shown = f"s3://{endpoint_scheme + '://' if endpoint_scheme else ''}{authority}/"
        else:
            endpoint, shown, path = _env_endpoint(), "s3://", rest
        path = path.strip("/")
        if not path:
            raise RemoteRepositoryError("the repository URL names no bucket", shown)
        options: dict[str, Any] = {"client_kwargs": {"endpoint_url": endpoint}} if endpoint else {}
        key = f"{shown}{path} {endpoint or ''}".rstrip()
        return Location(self, scheme, f"s3://{path}", shown + path, key, options)
