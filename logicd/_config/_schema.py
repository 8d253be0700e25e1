"""The typed settings of ``service.yaml``: one msgspec Struct per section, each attribute documented.

The sections are immutable, keyword-only, and unknown keys are errors. Each checks its own rules when built
(``__post_init__``), so a config built in code holds the same invariants as a loaded one; built in code, an
error names the key relative to its section (``stride``). ``example_config()`` returns a sample ``service.yaml``
that shows every key.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import msgspec

from ._errors import FieldError

__all__ = [
    "EMBEDDED",
    "NAME_RULE",
    "AuthConfig",
    "ChunkingConfig",
    "LimitsConfig",
    "ModelRef",
    "ModelServiceConfig",
    "ServerConfig",
    "ServiceConfig",
    "TokenizerConfig",
    "example_config",
    "is_service_name",
]

EMBEDDED = "embedded"
"""The ``model_service.url`` that runs the model service inside the logic server's process."""

_EXAMPLE = """\
# service.yaml: every key, with its default where it has one.
name: sentiment                        # DNS-1123 label: a-z, 0-9, '-'; at most 63 characters
service: sentiment.service:service     # import path of the service object, package.module:attribute
model_service:
  url: grpc://sentiment-model:8001     # http(s)://host:port, grpc://host:port, a list of them, or `embedded`
  discovery: none                      # `dns`: url's host resolves to every replica (headless Service)
  timeout_s: 30                        # per model call
  retries: 2                           # tries after the first, within the client's retry budget
  model_repository: ./model_repository # required when url is `embedded`; relative to this file
models:                                # at least one; a name, or a mapping with name and version
  - encoder
  - name: classifier
    version: 2
tokenizer:
  path: ./tokenizer/tokenizer.json     # relative to this file
chunking:
  max_tokens: 512                      # window size in tokens, at most 512
  stride: 64                           # tokens shared by consecutive windows; smaller than max_tokens
labels:                                # label -> description (zero-shot services)
  positive: The text expresses approval.
  negative: The text expresses disapproval.
limits:
  max_body_bytes: 1048576              # 1 MiB
  max_text_chars: 100000               # per document
  max_documents: 64                    # per request
  max_chunks: 256                      # windows one request may be cut into, across its documents
admission:                             # per route; the rest are refused at once: 503 with Retry-After
  max_in_flight: auto                  # requests in the handler at once; auto: from the model's capacity
  max_waiting: auto                    # requests waiting for a slot; auto: as many as their expected wait allows
  max_wait_s: auto                     # budget of a request without a deadline: its longest expected wait;
                                       # auto: the model's queue timeout, else model_service.timeout_s
  retry_after_s: 1                     # the Retry-After of a refusal
auth:
  mode: api_key                        # none | api_key | bearer; health and metrics stay open
  api_keys_env: [SENTIMENT_API_KEYS]   # variables holding keys (comma-separated in one variable is fine)
  # api_keys: [inline-key]             # or inline, for development
  # with mode: bearer, use tokens: [...] and tokens_env: [...] instead
server:
  host: 0.0.0.0
  port: 8080                           # 0 picks a free port
extra:                                 # service-specific settings, passed through unchecked
  threshold: 0.5
"""


def example_config() -> str:
    """A sample ``service.yaml`` that shows every key with a comment (what ``logicd`` scaffolds from)."""
    return _EXAMPLE


# --- the sections ---------------------------------------------------------------------------------------

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_MODEL_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*")

NAME_RULE = (
    "a DNS-1123 label (lower-case letters, digits and '-', starting and ending with a letter or digit,"
    " at most 63 characters)"
)
"""The rule a service's ``name`` follows, as error messages state it."""


def is_service_name(name: str) -> bool:
    """Whether ``name`` may name a service (:data:`NAME_RULE`): it names the Kubernetes objects that deploy it."""
    return len(name) <= 63 and _DNS1123_LABEL.fullmatch(name) is not None


class _Section(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """Base of the sections: immutable; unknown keys are errors. (Each subclass sets ``kw_only``.)"""


class ModelRef(_Section, frozen=True, kw_only=True):
    """A model the service calls. In YAML either a bare name or a mapping with ``name`` and ``version``."""

    name: str
    """The model's name in the model repository (its folder name, as Triton calls it)."""
    version: Annotated[int, msgspec.Meta(ge=1)] | None = None
    """The version to call; ``None`` lets the model service pick by its version policy (the latest)."""

    def __post_init__(self) -> None:
        if not _MODEL_NAME.fullmatch(self.name):
            raise FieldError("name", f"must be a model folder name (letters, digits, '_', '.', '-'), got {self.name!r}")


class ModelServiceConfig(_Section, frozen=True, kw_only=True):
    """Where the models run: a model service reached over the network (one or several replicas), or
    ``embedded`` in this process."""

    url: str | list[str]
    """``http://host:port``, ``https://…`` or ``grpc://host:port`` of a v2 (Triton-compatible) model
    service, a list of such URLs (replicas of one model service, one scheme), or ``embedded`` to run modelsvc
    in the logic server's process."""
    discovery: Literal["none", "dns"] = "none"
    """``dns``: ``url``'s host name resolves to every replica (a Kubernetes headless Service); it is resolved
    again every few seconds. ``none``: ``url`` names the replicas."""
    timeout_s: Annotated[float, msgspec.Meta(gt=0)] = 30.0
    """Seconds one model call may take, retries included."""
    retries: Annotated[int, msgspec.Meta(ge=0)] = 2
    """Tries after the first when the model service is unreachable or unavailable (the client's
    ``RetryPolicy(attempts=retries + 1)``; its retry budget still caps them)."""
    model_repository: Path | None = None
    """The Triton model repository; required when ``url`` is ``embedded`` (and then must exist). With a
    remote URL it only informs tools that deploy the model half. Relative to ``service.yaml``'s folder."""

    @property
    def embedded(self) -> bool:
        """Whether the models run in this process."""
        return self.url == EMBEDDED

    @property
    def urls(self) -> list[str]:
        """``url`` as a list."""
        return [self.url] if isinstance(self.url, str) else list(self.url)

    def __post_init__(self) -> None:
        if self.embedded:
            if self.model_repository is None:
                raise FieldError("model_repository", "required when url is 'embedded'", ("url",))
            if not self.model_repository.is_dir():
                raise FieldError("model_repository", f"not a directory: {self.model_repository}")
            if self.discovery != "none":
                raise FieldError("discovery", "must be 'none' when url is 'embedded'", ("url",))
            return
        urls = self.urls
        if not urls:
            raise FieldError("url", "an empty list: give at least one model-service URL")
        for url in urls:
            _check_url(url, embedded_ok=isinstance(self.url, str))
        if len(set(urls)) != len(urls):
            raise FieldError("url", f"a URL is listed twice: {urls}")
        if len({u.split("://", 1)[0] for u in urls}) > 1:
            raise FieldError("url", f"the replicas must share one scheme, got {urls}")
        if self.discovery == "dns" and len(urls) != 1:
            raise FieldError("discovery", "'dns' takes one url, whose host name resolves to the replicas", ("url",))


def _check_url(url: str, embedded_ok: bool) -> None:
    try:
        parts = urlsplit(url)
        port_ok = parts.port is not None or parts.scheme != "grpc"
    except ValueError:
        parts, port_ok = None, False
    if parts is None or parts.scheme not in {"http", "https", "grpc"} or not parts.hostname or not port_ok:
        also = " or 'embedded'" if embedded_ok else ""
        raise FieldError("url", f"must be http(s)://host[:port], grpc://host:port{also}, got {url!r}")


class TokenizerConfig(_Section, frozen=True, kw_only=True):
    """The tokenizer the logic server loads."""

    path: Path
    """A ``tokenizer.json`` or a folder holding the tokenizer files; must exist. Relative to
    ``service.yaml``'s folder."""

    def __post_init__(self) -> None:
        if not self.path.exists():
            raise FieldError("path", f"does not exist: {self.path}")


class ChunkingConfig(_Section, frozen=True, kw_only=True):
    """How long documents are cut into windows that fit the model."""

    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=512)] = 512
    """Tokens per window, special tokens included; at most 512 (BERT-style position embeddings)."""
    stride: Annotated[int, msgspec.Meta(ge=0)] = 0
    """Tokens shared by consecutive windows (overlap); smaller than ``max_tokens``."""

    def __post_init__(self) -> None:
        if self.stride >= self.max_tokens:
            raise FieldError(
                "stride",
                f"must be smaller than max_tokens ({self.max_tokens}), got {self.stride}",
                ("max_tokens",),
            )


class LimitsConfig(_Section, frozen=True, kw_only=True):
    """Bounds on one request; larger requests are refused before any work is done."""

    max_body_bytes: Annotated[int, msgspec.Meta(ge=1)] = 1 << 20
    """Largest request body in bytes (1 MiB)."""
    max_text_chars: Annotated[int, msgspec.Meta(ge=1)] = 100_000
    """Longest document in characters."""
    max_documents: Annotated[int, msgspec.Meta(ge=1)] = 64
    """Most documents in one request."""
    max_chunks: Annotated[int, msgspec.Meta(ge=1)] = 256
    """Most windows one request may be cut into (``Context.chunk`` refuses more with 422 before any model
    call): bounds the model time a request can take, so that a request within the limits fits in the model
    call timeout. Characters alone cannot: one character can be one token (CJK) or a quarter of one."""


AuthMode = Literal["none", "api_key", "bearer"]


class AdmissionConfig(_Section, frozen=True, kw_only=True):
    """What each route lets in; the rest is refused at once (503 with Retry-After) rather than queued into a
    timeout. A request finding every slot taken may wait for one when its expected wait (the learnt cost of what
    is ahead of it) fits its budget: its caller's deadline, or ``max_wait_s``; demand past that budget is a storm,
    during which a request may wait only about as long as one request of the route takes. ``auto`` derives
    numbers from the models' capacity as modelsvc reports it (instances, ``max_batch_size``,
    ``max_batch_tokens``, the queue policy's ``max_queue_size`` and ``default_timeout_microseconds``) and from
    what requests of the route cost."""

    max_in_flight: Annotated[int, msgspec.Meta(ge=1)] | Literal["auto"] = "auto"
    """Requests of one route in its handler at once."""
    max_waiting: Annotated[int, msgspec.Meta(ge=0)] | Literal["auto"] = "auto"
    """Most requests of one route waiting for a slot (first come, first served); 0 refuses at once when full.
    ``auto``: no count, only the expected wait (twice ``max_in_flight`` until the route's pace is learnt)."""
    max_wait_s: Annotated[float, msgspec.Meta(gt=0)] | Literal["auto"] = "auto"
    """The budget of a request that sends no deadline: it may wait for a slot when its expected wait is at most
    this, and it waits no longer (503 after). ``auto``: the model's queue timeout, else
    ``model_service.timeout_s``. A request never waits past its caller's deadline."""
    retry_after_s: Annotated[int, msgspec.Meta(ge=0)] = 1
    """The ``Retry-After`` (seconds) of a refusal."""


class AuthConfig(_Section, frozen=True, kw_only=True):
    """Who may call the service's API; health and metrics endpoints stay open whatever the mode.

    After :func:`load_config`, ``api_keys`` and ``tokens`` also hold the secrets read from the variables
    that ``api_keys_env`` and ``tokens_env`` name. ``repr`` hides the secrets.
    """

    mode: AuthMode = "none"
    """``none``; ``api_key`` (an ``X-API-Key`` header); or ``bearer`` (``Authorization: Bearer``)."""
    api_keys: tuple[str, ...] = ()
    """Accepted API keys, inline (keep real ones out of the file: use ``api_keys_env``)."""
    api_keys_env: tuple[str, ...] = ()
    """Environment variables that hold accepted API keys, one or several comma-separated per variable."""
    tokens: tuple[str, ...] = ()
    """Accepted bearer tokens, inline."""
    tokens_env: tuple[str, ...] = ()
    """Environment variables that hold accepted bearer tokens, comma-separated."""

    def __post_init__(self) -> None:
        kinds = {"api_key": ("api_keys", "api_keys_env"), "bearer": ("tokens", "tokens_env")}
        for mode, keys in kinds.items():
            given = [k for k in keys if getattr(self, k)]
            if mode == self.mode and not given:
                raise FieldError(keys[0], f"mode {mode!r} needs {keys[0]} or {keys[1]}", ("mode", *keys))
            if mode != self.mode and given:
                raise FieldError(given[0], f"given, but mode is {self.mode!r}", ("mode",))
        for key in ("api_keys", "tokens"):
            for i, secret in enumerate(getattr(self, key)):
                if not secret.strip():
                    raise FieldError(f"{key}[{i}]", "must not be empty")
        for key in ("api_keys_env", "tokens_env"):
            for i, var in enumerate(getattr(self, key)):
                if not var:
                    raise FieldError(f"{key}[{i}]", "must name an environment variable")

    def with_secrets(self, env: Mapping[str, str]) -> AuthConfig:
        """A copy whose ``api_keys`` / ``tokens`` add the secrets from the ``*_env`` variables in ``env``."""
        found: dict[str, tuple[str, ...]] = {}
        for key, env_key in (("api_keys", "api_keys_env"), ("tokens", "tokens_env")):
            secrets = list(getattr(self, key))
            for i, var in enumerate(getattr(self, env_key)):
                values = [s.strip() for s in env.get(var, "").split(",") if s.strip()]
                if not values:
                    state = "empty" if var in env else "not set"
                    raise FieldError(f"{env_key}[{i}]", f"environment variable {var} is {state}")
                secrets.extend(v for v in values if v not in secrets)
            found[key] = tuple(secrets)
        return msgspec.structs.replace(self, **found)

    def __repr__(self) -> str:
        def hidden(secrets: tuple[str, ...]) -> str:
            return f"<{len(secrets)} hidden>"

        return (
            f"AuthConfig(mode={self.mode!r}, api_keys={hidden(self.api_keys)}, api_keys_env={self.api_keys_env!r},"
            f" tokens={hidden(self.tokens)}, tokens_env={self.tokens_env!r})"
        )


class ServerConfig(_Section, frozen=True, kw_only=True):
    """Where the logic server listens."""

    host: str = "0.0.0.0"
    """Interface to bind; ``0.0.0.0`` for every IPv4 interface (in a container)."""
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = 8080
    """TCP port of the REST API; 0 picks a free one."""


def _valid_import_path(text: str) -> bool:
    module, sep, attribute = text.partition(":")
    names = [*module.split("."), *attribute.split(".")]
    return bool(sep) and all(name.isidentifier() for name in names)


class ServiceConfig(_Section, frozen=True, kw_only=True):
    """One logic service: what it is called, its code, the models it calls and how it serves them."""

    name: str
    """The service's name: a DNS-1123 label (``a-z``, ``0-9``, ``-``; at most 63 characters), since it
    names the Kubernetes objects that deploy it."""
    service: str
    """Import path of the service object, ``package.module:attribute``."""
    model_service: ModelServiceConfig
    """Where the models run."""
    models: tuple[ModelRef, ...]
    """The models the service calls; at least one."""
    tokenizer: TokenizerConfig | None = None
    """The tokenizer, for services that tokenize; ``None`` otherwise."""
    chunking: ChunkingConfig = msgspec.field(default_factory=ChunkingConfig)
    """How long documents are cut into windows."""
    labels: dict[str, str] = msgspec.field(default_factory=dict)
    """Label → description, for zero-shot services; empty otherwise."""
    limits: LimitsConfig = msgspec.field(default_factory=LimitsConfig)
    """Bounds on one request."""
    admission: AdmissionConfig = msgspec.field(default_factory=AdmissionConfig)
    """How many requests each route takes at once (overload is refused, not queued)."""
    auth: AuthConfig = msgspec.field(default_factory=AuthConfig)
    """Who may call the API."""
    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    """Where the logic server listens."""
    extra: dict[str, Any] = msgspec.field(default_factory=dict)
    """Service-specific settings, passed through unchecked for the service object to read."""

    def __post_init__(self) -> None:
        if not is_service_name(self.name):
            raise FieldError("name", f"must be {NAME_RULE}, got {self.name!r}")
        if not _valid_import_path(self.service):
            raise FieldError("service", f"must be an import path 'package.module:attribute', got {self.service!r}")
        if not self.models:
            raise FieldError("models", "at least one model is required")
        seen: set[str] = set()
        for i, model in enumerate(self.models):
            if model.name in seen:  # handlers reach models by name: ctx.model(name)
                raise FieldError(
                    f"models[{i}]", f"{model.name!r} is listed twice; a service uses one version of each model"
                )
            seen.add(model.name)
        for label in self.labels:
            if not label.strip():
                raise FieldError("labels", "label names must not be empty")
