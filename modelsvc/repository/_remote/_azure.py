"""Azure Blob Storage, through adlfs (``pip install 'modelsvc[azure]'``).

Locations
    ``az://container/prefix``                the account from ``AZURE_STORAGE_ACCOUNT_NAME``
    ``abfs://container@account.dfs.core.windows.net/prefix`` (``abfss://`` too)
    ``as://account/container/prefix``        Triton's form

Credentials
    ``AZURE_STORAGE_CONNECTION_STRING``, ``AZURE_STORAGE_ACCOUNT_KEY``, ``AZURE_STORAGE_SAS_TOKEN``, a
    service principal (``AZURE_STORAGE_CLIENT_ID``, ``AZURE_STORAGE_CLIENT_SECRET``,
    ``AZURE_STORAGE_TENANT_ID``) or the default Azure credential chain, as adlfs reads them. Triton's
    ``AZURE_STORAGE_ACCOUNT`` and ``AZURE_STORAGE_KEY`` are read too, and handed to adlfs as
    ``account_name`` and ``account_key``, as is the account that an ``as://`` URL names.

Checksum
    A listing carries each blob's ``etag`` and its ``last_modified`` time: a changed ETag or size means a
    changed file.
"""

from __future__ import annotations

import os
from typing import Any

from ._errors import RemoteRepositoryError
from ._provider import Location, Provider, refuse_secrets

__all__ = ["Azure"]


class Azure(Provider):
    kind = "azure"
    schemes = ("az", "abfs", "abfss", "as")
    package = "adlfs"
    extra = "azure"
    credentials_hint = (
        "credentials come from AZURE_STORAGE_CONNECTION_STRING, AZURE_STORAGE_ACCOUNT_KEY, "
        "AZURE_STORAGE_SAS_TOKEN or the default Azure credential chain"
    )
    credential_errors = frozenset({"ClientAuthenticationError"})  # azure-core's

    def parse(self, scheme: str, rest: str) -> Location:
        """``container/path``, ``container@account.host/path``, or Triton's ``as://account/container/path``."""
        refuse_secrets(rest, account_before_at=True)
        options: dict[str, Any] = {}
        env = os.environ
        if scheme == "as":
            account, _, rest = rest.partition("/")
            if not account:
                raise RemoteRepositoryError("the as:// URL names no storage account (as://account/container/path)")
            options["account_name"] = account
            shown, fsspec_scheme = f"as://{account}/", "az://"
        else:
            shown = fsspec_scheme = f"{scheme}://"
            named_in_url = "@" in rest.partition("/")[0]
            if not named_in_url and "AZURE_STORAGE_ACCOUNT_NAME" not in env and "AZURE_STORAGE_ACCOUNT" in env:
                options["account_name"] = env["AZURE_STORAGE_ACCOUNT"]  # Triton's name for it
        if "AZURE_STORAGE_ACCOUNT_KEY" not in env and "AZURE_STORAGE_KEY" in env:  # Triton's name for it
            options["account_key"] = env["AZURE_STORAGE_KEY"]
        path = rest.strip("/")
        if not path:
            raise RemoteRepositoryError("the repository URL names no container", shown)
        account = options.get("account_name") or env.get("AZURE_STORAGE_ACCOUNT_NAME", "")
        key = f"{shown}{path} {account}".rstrip()
        return Location(self, scheme, fsspec_scheme + path, shown + path, key, options)
