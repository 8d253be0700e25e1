"""Model repositories kept in object storage (S3, Google Cloud Storage, Azure Blob Storage).

``modelsvc serve --model-repository s3://bucket/path`` serves a Triton model repository that lives in a
bucket. modelsvc copies it into a local cache folder and serves the copy. At start-up it copies
everything once; with ``--model-control-mode poll`` it refreshes the copy every
``--repository-poll-secs`` seconds, just before it looks for changed models.

Locations
    ``s3://bucket/prefix``                   Amazon S3, or the S3-compatible server that
                                             ``AWS_ENDPOINT_URL_S3`` or ``AWS_ENDPOINT_URL`` names
    ``s3://host:port/bucket/prefix``         an S3-compatible server (MinIO, Ceph, ...) at
                                             ``http://host:port``; Triton's form
    ``s3://https://host:port/bucket/prefix`` the same over HTTPS
    ``gs://bucket/prefix``, ``gcs://...``    Google Cloud Storage
    ``az://container/prefix``                Azure Blob Storage, the account from
                                             ``AZURE_STORAGE_ACCOUNT_NAME``
    ``abfs://container@account.dfs.core.windows.net/prefix`` (``abfss://`` too)
    ``as://account/container/prefix``        Azure, Triton's form

    Each kind needs its filesystem package: ``pip install 'modelsvc[s3]'`` (s3fs),
    ``'modelsvc[gcs]'`` (gcsfs) or ``'modelsvc[azure]'`` (adlfs).

Credentials
    Never in the URL: a location with ``user:password@`` or with a query string is refused, so no
    secret ends up in a process list, a shell history or a log. They come from where each cloud's own
    tools look; each store's module says where (``_s3``, ``_gcs``, ``_azure``).

The modules: ``_provider`` is the interface every store implements (``_s3``, ``_gcs``, ``_azure``) and
``_locations`` picks the store by URL scheme; ``_mirror`` keeps the local copy (its cache folder and
refresh are described there), on the pure functions of ``_tree`` and the folder swap of ``_swap``.
Errors (``_errors``), each with one clear message::

    RemoteRepositoryError          a location that cannot be used: bad URL, missing package, network
    ├── RemoteNotFoundError        the bucket (or container) or the prefix does not exist
    ├── RemoteAccessError          no credentials found, or they are refused
    └── NoModelsError              the prefix holds files but no model folder
"""

from ._errors import NoModelsError, RemoteAccessError, RemoteNotFoundError, RemoteRepositoryError
from ._locations import default_cache_dir, is_remote
from ._mirror import RemoteRepository, SyncResult

__all__ = [
    "NoModelsError",
    "RemoteAccessError",
    "RemoteNotFoundError",
    "RemoteRepository",
    "RemoteRepositoryError",
    "SyncResult",
    "default_cache_dir",
    "is_remote",
]
