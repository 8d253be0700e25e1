"""Google Cloud Storage, through gcsfs (``pip install 'modelsvc[gcs]'``).

Locations
    ``gs://bucket/prefix``, ``gcs://bucket/prefix``

Credentials
    ``GOOGLE_APPLICATION_CREDENTIALS``, gcloud's application default credentials, or the machine's
    service account, as google-auth finds them; gcsfs gets no options from modelsvc.

Checksum
    A listing carries each object's ``md5Hash`` (absent for composite objects), ``crc32c`` and ``etag``,
    and its ``updated`` time and ``generation``: the MD5, else the CRC32C, tells a changed file.
"""

from __future__ import annotations

from ._errors import RemoteRepositoryError
from ._provider import Location, Provider, refuse_secrets

__all__ = ["GCS"]


class GCS(Provider):
    kind = "gcs"
    schemes = ("gs", "gcs")
    package = "gcsfs"
    extra = "gcs"
    credentials_hint = (
        "credentials come from GOOGLE_APPLICATION_CREDENTIALS or gcloud's application default credentials"
    )
    credential_errors = frozenset({"DefaultCredentialsError"})  # google-auth's

    def parse(self, scheme: str, rest: str) -> Location:
        """``bucket/path``."""
        refuse_secrets(rest)
        path = rest.strip("/")
        if not path:
            raise RemoteRepositoryError("the repository URL names no bucket", f"{scheme}://")
        url = f"{scheme}://{path}"
        return Location(self, scheme, url, url, url, {})
