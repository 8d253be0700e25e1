"""A service's configuration: ``service.yaml``, overridden by ``LOGICD_`` environment variables.

``load_config(path)`` reads the file, applies the environment overrides, checks every value and
returns a frozen :class:`ServiceConfig`; anything wrong raises :class:`ConfigError`, whose message names
the file, the key (``chunking.stride``), the environment variable when an override caused it, and the
line and column of a YAML syntax error. ``example_config()`` returns a sample that shows every key.

Environment overrides: ``LOGICD_<KEY>[__<KEY>...]=<value>``; ``__`` separates the levels and keys are
lower-cased, so ``LOGICD_MODEL_SERVICE__URL=grpc://m:8001`` sets ``model_service.url`` and
``LOGICD_CHUNKING__MAX_TOKENS=256`` sets ``chunking.max_tokens``. Values are read as YAML (``256`` is a
number, ``true`` a bool, ``[a, b]`` a list) except for keys that hold text, which take the value as is.
A variable that names no key is an error. Not overrides: ``LOGICD_CONFIG`` (the CLI's file path) and the
variables that ``auth.api_keys_env`` / ``auth.tokens_env`` name.

The sections are msgspec Structs: immutable, keyword-only, and unknown keys are errors. Each checks its
own rules when built (``__post_init__``), so a config built in code holds the same invariants as a loaded
one; built in code, an error names the key relative to its section (``stride``).
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Hashable, Iterator, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal, cast
from urllib.parse import urlsplit

import msgspec
import yaml

__all__ = [
    "EMBEDDED",
    "ENV_PREFIX",
    "AuthConfig",
    "ChunkingConfig",
    "ConfigError",
    "LimitsConfig",
    "ModelRef",
    "ModelServiceConfig",
    "ServerConfig",
    "ServiceConfig",
    "TokenizerConfig",
    "example_config",
    "load_config",
]

ENV_PREFIX = "LOGICD_"
"""Prefix of the environment variables that override ``service.yaml``."""

_RESERVED_ENV = frozenset({"LOGICD_CONFIG"})
"""``LOGICD_`` variables that are not overrides."""

EMBEDDED = "embedded"
"""The ``model_service.url`` that runs the model service inside the logic server's process."""

_EXAMPLE = """\
# service.yaml: every key, with its default where it has one.
name: sentiment                        # DNS-1123 label: a-z, 0-9, '-'; at most 63 characters
service: sentiment.service:service     # import path of the service object, package.module:attribute
model_service:
  url: grpc://sentiment-model:8001     # http(s)://host:port, grpc://host:port, or `embedded`
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


class ConfigError(ValueError):
    """The configuration is invalid; the message names the file, the key and the cause.

    ``str(error)`` reads ``service.yaml: chunking.stride: must be smaller than chunking.max_tokens (512),
    got 600``, with ``:line:column`` after the file for YAML syntax errors and ``(from environment
    variable LOGICD_...)`` when an override was involved.
    """

    def __init__(
        self,
        reason: str,
        *,
        source: str | None = None,
        key: str | None = None,
        env_vars: tuple[str, ...] = (),
        line: int | None = None,
        column: int | None = None,
    ) -> None:
        self.reason = reason
        """What is wrong, without the location."""
        self.source = source
        """The file as given to :func:`load_config`; ``None`` for a config built in code."""
        self.key = key
        """Dotted key path (``models[0].name``); ``None`` when the error is not about one key."""
        self.env_vars = env_vars
        """Environment variables whose overrides are involved."""
        self.line = line
        """1-based line of a YAML error."""
        self.column = column
        """1-based column of a YAML error."""
        super().__init__(self._render())

    def _render(self) -> str:
        parts = []
        if self.source is not None:
            where = self.source
            if self.line is not None:
                where += f":{self.line}" + (f":{self.column}" if self.column is not None else "")
            parts.append(where)
        if self.key:
            parts.append(self.key)
        parts.append(self.reason)
        text = ": ".join(parts)
        unnamed = [var for var in self.env_vars if var not in self.reason]
        if unnamed:
            noun = "variable" if len(unnamed) == 1 else "variables"
            text += f" (from environment {noun} {', '.join(unnamed)})"
        return text


class _FieldError(ConfigError):
    """Raised by a section's checks: ``key`` is relative to the section; ``related`` are sibling keys the
    reason mentions, so the loader can qualify them (``max_tokens`` → ``chunking.max_tokens``)."""

    def __init__(self, key: str, reason: str, related: tuple[str, ...] = ()) -> None:
        self.related = related
        super().__init__(reason, key=key)


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
            raise _FieldError(
                "name", f"must be a model folder name (letters, digits, '_', '.', '-'), got {self.name!r}"
            )


class ModelServiceConfig(_Section, frozen=True, kw_only=True):
    """Where the models run: a model service reached over the network, or ``embedded`` in this process."""

    url: str
    """``http://host:port``, ``https://…`` or ``grpc://host:port`` of a v2 (Triton-compatible) model
    service, or ``embedded`` to run modelsvc in the logic server's process."""
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

    def __post_init__(self) -> None:
        if self.embedded:
            if self.model_repository is None:
                raise _FieldError("model_repository", "required when url is 'embedded'", ("url",))
            if not self.model_repository.is_dir():
                raise _FieldError("model_repository", f"not a directory: {self.model_repository}")
            return
        try:
            parts = urlsplit(self.url)
            port_ok = parts.port is not None or parts.scheme != "grpc"
        except ValueError:
            parts, port_ok = None, False
        if parts is None or parts.scheme not in {"http", "https", "grpc"} or not parts.hostname or not port_ok:
            raise _FieldError("url", f"must be http(s)://host[:port], grpc://host:port or 'embedded', got {self.url!r}")


class TokenizerConfig(_Section, frozen=True, kw_only=True):
    """The tokenizer the logic server loads."""

    path: Path
    """A ``tokenizer.json`` or a folder holding the tokenizer files; must exist. Relative to
    ``service.yaml``'s folder."""

    def __post_init__(self) -> None:
        if not self.path.exists():
            raise _FieldError("path", f"does not exist: {self.path}")


class ChunkingConfig(_Section, frozen=True, kw_only=True):
    """How long documents are cut into windows that fit the model."""

    max_tokens: Annotated[int, msgspec.Meta(ge=1, le=512)] = 512
    """Tokens per window, special tokens included; at most 512 (BERT-style position embeddings)."""
    stride: Annotated[int, msgspec.Meta(ge=0)] = 0
    """Tokens shared by consecutive windows (overlap); smaller than ``max_tokens``."""

    def __post_init__(self) -> None:
        if self.stride >= self.max_tokens:
            raise _FieldError(
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
                raise _FieldError(keys[0], f"mode {mode!r} needs {keys[0]} or {keys[1]}", ("mode", *keys))
            if mode != self.mode and given:
                raise _FieldError(given[0], f"given, but mode is {self.mode!r}", ("mode",))
        for key in ("api_keys", "tokens"):
            for i, secret in enumerate(getattr(self, key)):
                if not secret.strip():
                    raise _FieldError(f"{key}[{i}]", "must not be empty")
        for key in ("api_keys_env", "tokens_env"):
            for i, var in enumerate(getattr(self, key)):
                if not var:
                    raise _FieldError(f"{key}[{i}]", "must name an environment variable")

    def with_secrets(self, env: Mapping[str, str]) -> AuthConfig:
        """A copy whose ``api_keys`` / ``tokens`` add the secrets from the ``*_env`` variables in ``env``."""
        found: dict[str, tuple[str, ...]] = {}
        for key, env_key in (("api_keys", "api_keys_env"), ("tokens", "tokens_env")):
            secrets = list(getattr(self, key))
            for i, var in enumerate(getattr(self, env_key)):
                values = [s.strip() for s in env.get(var, "").split(",") if s.strip()]
                if not values:
                    state = "empty" if var in env else "not set"
                    raise _FieldError(f"{env_key}[{i}]", f"environment variable {var} is {state}")
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
    auth: AuthConfig = msgspec.field(default_factory=AuthConfig)
    """Who may call the API."""
    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    """Where the logic server listens."""
    extra: dict[str, Any] = msgspec.field(default_factory=dict)
    """Service-specific settings, passed through unchecked for the service object to read."""

    def __post_init__(self) -> None:
        if not is_service_name(self.name):
            raise _FieldError("name", f"must be {NAME_RULE}, got {self.name!r}")
        if not _valid_import_path(self.service):
            raise _FieldError("service", f"must be an import path 'package.module:attribute', got {self.service!r}")
        if not self.models:
            raise _FieldError("models", "at least one model is required")
        seen: set[str] = set()
        for i, model in enumerate(self.models):
            if model.name in seen:  # handlers reach models by name: ctx.model(name)
                raise _FieldError(
                    f"models[{i}]", f"{model.name!r} is listed twice; a service uses one version of each model"
                )
            seen.add(model.name)
        for label in self.labels:
            if not label.strip():
                raise _FieldError("labels", "label names must not be empty")


# --- loading --------------------------------------------------------------------------------------------


class _Loader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses duplicate keys (the later one would silently win)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":
                continue
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, Hashable) and key in seen:
                first = seen[key].start_mark.line + 1
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first at line {first})", key_node.start_mark
                )
            if isinstance(key, Hashable):
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


def load_config(path: Path | str, env: Mapping[str, str] | None = None) -> ServiceConfig:
    """Read ``service.yaml`` at ``path``, apply ``LOGICD_`` overrides from ``env`` (default ``os.environ``),
    validate, and read the auth secrets that ``auth.*_env`` name from ``env``.

    Relative paths in the file resolve against the file's folder. Raises :class:`ConfigError`.
    """
    path = Path(path)
    source = str(path)
    env = os.environ if env is None else env
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(f"cannot read the file: {reason}", source=source) from exc
    try:
        data = yaml.load(text, Loader=_Loader)  # _Loader is a SafeLoader
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        reason = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        raise ConfigError(
            f"invalid YAML: {reason}",
            source=source,
            line=None if mark is None else mark.line + 1,
            column=None if mark is None else mark.column + 1,
        ) from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"invalid YAML: {exc}", source=source) from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"expected a mapping of settings, got {_kind(data)}", source=source)

    secret_vars = _secret_vars(data)
    overrides = _apply_overrides(data, env, secret_vars, source)
    if isinstance(data.get("models"), list):
        data["models"] = [{"name": m} if isinstance(m, str) else m for m in data["models"]]

    base = path.absolute().parent
    try:
        config = msgspec.convert(data, ServiceConfig, dec_hook=lambda t, v: _decode(t, v, base))
    except msgspec.ValidationError as exc:
        raise _translate(exc, data, overrides, source) from exc
    try:
        auth = config.auth.with_secrets(env)
    except _FieldError as exc:
        raise _qualified(exc, "auth", overrides, source) from exc
    return msgspec.structs.replace(config, auth=auth)


def _decode(type_: type, value: Any, base: Path) -> Any:
    if type_ is Path:
        if not isinstance(value, str) or not value:
            raise TypeError(f"Expected a path, got {_kind(value)}")
        path = Path(value).expanduser()
        return path if path.is_absolute() else base / path
    raise TypeError(f"Unsupported type {type_!r}")  # pragma: no cover - only Path is declared


def _kind(value: Any) -> str:
    names = {dict: "a mapping", list: "a list", str: "text", bool: "a bool", int: "a number", float: "a number"}
    return "nothing" if value is None else names.get(type(value), type(value).__name__)


def _secret_vars(data: dict[str, Any]) -> set[str]:
    auth = data.get("auth")
    names: set[str] = set()
    if isinstance(auth, dict):
        for key in ("api_keys_env", "tokens_env"):
            value = auth.get(key)
            if isinstance(value, list):
                names.update(v for v in value if isinstance(v, str))
    return names


# --- environment overrides ------------------------------------------------------------------------------

_SCHEMA = cast(msgspec.inspect.StructType, msgspec.inspect.type_info(ServiceConfig))


def _struct_of(t: msgspec.inspect.Type) -> msgspec.inspect.StructType | None:
    """The struct a field holds, looking through ``X | None``."""
    if isinstance(t, msgspec.inspect.UnionType):
        structs = [s for s in t.types if isinstance(s, msgspec.inspect.StructType)]
        return structs[0] if structs else None
    return t if isinstance(t, msgspec.inspect.StructType) else None


def _takes_text(t: msgspec.inspect.Type) -> bool:
    """Whether an override of a field of this type is taken as the raw string (not parsed as YAML)."""
    if isinstance(t, msgspec.inspect.UnionType):
        return all(_takes_text(s) for s in t.types if not isinstance(s, msgspec.inspect.NoneType))
    if isinstance(t, msgspec.inspect.LiteralType):
        return all(isinstance(v, str) for v in t.values)
    if isinstance(t, msgspec.inspect.CustomType):
        return t.cls is Path
    return isinstance(t, msgspec.inspect.StrType)


def _suggest(word: str, choices: list[str]) -> str | None:
    close = difflib.get_close_matches(word, choices, n=1, cutoff=0.6)
    return close[0] if close else None


def _apply_overrides(data: dict[str, Any], env: Mapping[str, str], skip: set[str], source: str) -> dict[str, str]:
    """Set each ``LOGICD_`` variable's value in ``data``; return {key path: variable}."""
    found = [v for v in env if v.startswith(ENV_PREFIX) and v not in _RESERVED_ENV and v not in skip]
    found.sort(key=lambda v: (v.count("__"), v))  # a whole section before the keys inside it
    applied: dict[str, str] = {}
    for var in found:
        segments = var[len(ENV_PREFIX) :].lower().split("__")
        if not all(segments):
            raise ConfigError(
                f"environment variable {var}: malformed name; use {ENV_PREFIX}SECTION__KEY",
                source=source,
                env_vars=(var,),
            )
        target = _override_target(var, segments, source)
        raw = env[var]
        if _takes_text(target):
            value: Any = raw
        else:
            try:
                value = yaml.safe_load(raw)
            except yaml.YAMLError as exc:
                raise ConfigError(
                    f"environment variable {var}: not a YAML value: {raw!r}", source=source, env_vars=(var,)
                ) from exc
        node = data
        for depth, segment in enumerate(segments[:-1]):
            child = node.get(segment)
            if child is None:
                child = node[segment] = {}
            elif not isinstance(child, dict):
                key = ".".join(segments[: depth + 1])
                raise ConfigError(
                    f"environment variable {var} cannot set {'.'.join(segments)}: {key} is {_kind(child)}",
                    source=source,
                    env_vars=(var,),
                )
            node = child
        node[segments[-1]] = value
        applied[".".join(segments)] = var
    return applied


def _override_target(var: str, segments: list[str], source: str) -> msgspec.inspect.Type:
    """The type of the key an override sets; unknown keys raise, with a suggestion."""
    struct: msgspec.inspect.StructType | None = _SCHEMA
    t: msgspec.inspect.Type = _SCHEMA
    for depth, segment in enumerate(segments):
        if struct is None:  # inside a free mapping (labels, extra): any key, any depth
            if isinstance(t, msgspec.inspect.DictType) and depth == len(segments) - 1:
                return t.value_type
            if isinstance(t, msgspec.inspect.DictType) and isinstance(t.value_type, msgspec.inspect.AnyType):
                continue
            key = ".".join(segments[: depth + 1 if isinstance(t, msgspec.inspect.DictType) else depth])
            raise ConfigError(f"environment variable {var}: {key} holds no nested keys", source=source, env_vars=(var,))
        fields = {f.name: f.type for f in struct.fields}
        if segment not in fields:
            key = ".".join(segments[: depth + 1])
            close = _suggest(segment, list(fields))
            hint = ""
            if close is not None:
                hint = f"; did you mean {ENV_PREFIX}{'__'.join([*segments[:depth], close]).upper()}?"
            raise ConfigError(
                f"environment variable {var} sets an unknown key, {key}{hint}", source=source, env_vars=(var,)
            )
        t = fields[segment]
        struct = _struct_of(t)
        if isinstance(t, msgspec.inspect.DictType):
            struct = None
    return t


# --- errors ---------------------------------------------------------------------------------------------

_AT = re.compile(r"^(?P<reason>.*?)(?: - at (?P<dictkey>`key` in )?`\$(?P<path>[^`]*)`)?$", re.DOTALL)
_SEGMENT = re.compile(r"\.([^.\[]+)|\[(\d+|\.\.\.)\]")
_JSON_WORDS = {"object": "mapping", "array": "list", "null": "nothing"}


def _segments(key: str) -> Iterator[str | int]:
    for match in _SEGMENT.finditer("." + key if key and not key.startswith("[") else key):
        name, index = match.groups()
        if name is not None:
            yield name
        elif index != "...":
            yield int(index)
        else:
            return


def _value_at(data: Any, key: str) -> tuple[bool, Any]:
    if "[...]" in key:
        return False, None
    for segment in _segments(key):
        try:
            data = data[segment]
        except (KeyError, IndexError, TypeError):
            return False, None
    return True, data


def _struct_at(key: str) -> msgspec.inspect.StructType | None:
    t: msgspec.inspect.Type = _SCHEMA
    for segment in _segments(key):
        if isinstance(segment, int):
            if not isinstance(t, msgspec.inspect.VarTupleType | msgspec.inspect.ListType):
                return None
            t = t.item_type
            continue
        struct = _struct_of(t)
        fields = {} if struct is None else {f.name: f.type for f in struct.fields}
        if segment not in fields:
            return None
        t = fields[segment]
    return _struct_of(t)


def _env_for(keys: list[str], overrides: Mapping[str, str]) -> tuple[str, ...]:
    """The variables whose overrides set any of ``keys``, something inside them, or a section around them."""
    found = []
    for set_key, var in overrides.items():
        for key in keys:
            if any(a == b or a.startswith((b + ".", b + "[")) for a, b in ((key, set_key), (set_key, key))):
                found.append(var)
                break
    return tuple(sorted(found))


def _join(prefix: str, key: str) -> str:
    if not prefix:
        return key
    return prefix + key if key.startswith("[") else f"{prefix}.{key}"


def _qualified(exc: _FieldError, prefix: str, overrides: Mapping[str, str], source: str) -> ConfigError:
    """A section's error with its keys named from the root of the file."""
    key = _join(prefix, exc.key or "")
    reason = exc.reason
    related = [_join(prefix, r) for r in exc.related]
    for name in exc.related:
        reason = re.sub(rf"(?<![\w.]){re.escape(name)}\b", _join(prefix, name), reason)
    return ConfigError(reason, source=source, key=key, env_vars=_env_for([key, *related], overrides))


def _translate(
    exc: msgspec.ValidationError, data: dict[str, Any], overrides: Mapping[str, str], source: str
) -> ConfigError:
    """msgspec's ``Expected `int`, got `str` - at `$.chunking.max_tokens``` in this module's words."""
    match = _AT.match(str(exc))
    assert match is not None  # the pattern matches any text
    reason, path = match["reason"], (match["path"] or "").lstrip(".")
    if isinstance(exc.__cause__, _FieldError):
        return _qualified(exc.__cause__, path, overrides, source)
    field_problem = re.fullmatch(r"Object (contains unknown|missing required) field `(.*)`", reason)
    if field_problem:
        key = _join(path, field_problem[2])
        if field_problem[1] == "missing required":
            reason = "required key is missing"
        else:
            struct = _struct_at(path)
            close = _suggest(field_problem[2], [f.name for f in struct.fields]) if struct else None
            reason = "unknown key" + (f"; did you mean {_join(path, close)!r}?" if close else "")
        return ConfigError(reason, source=source, key=key, env_vars=_env_for([key], overrides))
    found, value = _value_at(data, path)
    if reason.startswith("Invalid enum value"):
        allowed = _allowed(path)
        reason = f"must be one of {allowed}" if allowed else "invalid value"
    else:
        reason = re.sub(r"`(\w+)`", lambda m: _JSON_WORDS.get(m[1], m[1]), reason)
        reason = reason[:1].lower() + reason[1:]
    if found and "got" not in reason:
        reason += f", got {value!r}"
    if match["dictkey"]:
        reason = f"a key: {reason}"
    elif path.endswith("[...]"):  # a value in a mapping (labels, extra); msgspec does not say which
        path, reason = path[: -len("[...]")], f"a value: {reason}"
    return ConfigError(reason, source=source, key=path or None, env_vars=_env_for([path], overrides))


def _allowed(key: str) -> str | None:
    parent, _, field = key.rpartition(".")
    struct = _struct_at(parent)
    types = {f.name: f.type for f in struct.fields} if struct else {}
    t = types.get(field)
    if isinstance(t, msgspec.inspect.LiteralType):
        return ", ".join(repr(v) for v in t.values)
    return None
