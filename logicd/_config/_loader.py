"""Loading ``service.yaml``: read the file, apply the ``LOGICD_`` environment overrides, validate against the
schema (``_schema``) and say what is wrong in this package's words (:class:`ConfigError`).

Environment overrides: ``LOGICD_<KEY>[__<KEY>...]=<value>``; ``__`` separates the levels and keys are
lower-cased, so ``LOGICD_MODEL_SERVICE__URL=grpc://m:8001`` sets ``model_service.url`` and
``LOGICD_CHUNKING__MAX_TOKENS=256`` sets ``chunking.max_tokens``. Values are read as YAML (``256`` is a
number, ``true`` a bool, ``[a, b]`` a list) except for keys that hold text, which take the value as is.
A variable that names no key is an error. Not overrides: ``LOGICD_CONFIG`` (the CLI's file path) and the
variables that ``auth.api_keys_env`` / ``auth.tokens_env`` name.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Hashable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import msgspec
import yaml

from ._errors import ConfigError, FieldError
from ._schema import ServiceConfig

__all__ = ["CONFIG_ENV", "ENV_PREFIX", "load_config"]

ENV_PREFIX = "LOGICD_"
"""Prefix of the environment variables that override ``service.yaml``."""

CONFIG_ENV = "LOGICD_CONFIG"
"""The variable through which the CLI names the service.yaml to read (not an override)."""

_RESERVED_ENV = frozenset({CONFIG_ENV})
"""``LOGICD_`` variables that are not overrides."""


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
    except FieldError as exc:
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


def _qualified(exc: FieldError, prefix: str, overrides: Mapping[str, str], source: str) -> ConfigError:
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
    if isinstance(exc.__cause__, FieldError):
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
