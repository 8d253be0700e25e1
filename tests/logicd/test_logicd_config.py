"""logicd configuration: service.yaml, LOGICD_ environment overrides, and errors that name the key."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from logicd._config import (
    AuthConfig,
    ChunkingConfig,
    ConfigError,
    ModelRef,
    ModelServiceConfig,
    ServiceConfig,
    example_config,
    load_config,
)

MINIMAL = """\
name: echo
service: echo.service:service
model_service:
  url: http://models:8000
models: [encoder]
"""


def write(tmp_path: Path, text: str, name: str = "service.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def load_error(tmp_path: Path, text: str, env: dict[str, str] | None = None) -> ConfigError:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        load_config(path, env or {})
    return info.value


def with_section(section: str) -> str:
    return MINIMAL + section + "\n"


# --- valid configs --------------------------------------------------------------------------------------


def test_minimal_config_takes_the_defaults(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL), env={})
    assert config.name == "echo"
    assert config.service == "echo.service:service"
    assert config.model_service.url == "http://models:8000"
    assert not config.model_service.embedded
    assert config.model_service.timeout_s == 30.0
    assert config.model_service.retries == 2
    assert config.models == (ModelRef(name="encoder"),)
    assert config.tokenizer is None
    assert (config.chunking.max_tokens, config.chunking.stride) == (512, 0)
    assert config.labels == {}
    assert config.limits.max_body_bytes == 1 << 20
    assert config.auth.mode == "none"
    assert (config.server.host, config.server.port) == ("0.0.0.0", 8080)
    assert config.extra == {}


def test_example_config_loads_with_every_key(tmp_path: Path) -> None:
    (tmp_path / "tokenizer").mkdir()
    (tmp_path / "tokenizer" / "tokenizer.json").write_text("{}")
    config = load_config(write(tmp_path, example_config()), env={"SENTIMENT_API_KEYS": "k1, k2"})
    assert config.name == "sentiment"
    assert config.model_service.url == "grpc://sentiment-model:8001"
    assert config.models == (ModelRef(name="encoder"), ModelRef(name="classifier", version=2))
    assert config.tokenizer is not None
    assert config.tokenizer.path == tmp_path / "tokenizer" / "tokenizer.json"
    assert config.chunking == ChunkingConfig(max_tokens=512, stride=64)
    assert set(config.labels) == {"positive", "negative"}
    assert config.limits.max_documents == 64
    assert config.auth.mode == "api_key"
    assert config.auth.api_keys == ("k1", "k2")
    assert config.extra == {"threshold": 0.5}
    # every section of ServiceConfig appears in the example
    for field in msgspec.structs.fields(ServiceConfig):
        assert f"\n{field.name}:" in "\n" + example_config()


def test_config_is_frozen(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL), env={})
    with pytest.raises(AttributeError):
        config.name = "other"  # type: ignore[misc]


def test_relative_paths_resolve_against_the_yaml_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    service_dir = tmp_path / "svc"
    (service_dir / "model_repository").mkdir(parents=True)
    (service_dir / "tok.json").write_text("{}")
    write(
        service_dir,
        "name: echo\nservice: m:o\nmodels: [encoder]\n"
        "model_service: {url: embedded, model_repository: model_repository}\ntokenizer: {path: ./tok.json}\n",
    )
    monkeypatch.chdir(tmp_path)  # a relative file path, and a working directory that is not the file's
    config = load_config("svc/service.yaml", env={})
    assert config.model_service.embedded
    assert config.model_service.model_repository == tmp_path / "svc" / "model_repository"
    assert config.tokenizer is not None
    assert config.tokenizer.path == tmp_path / "svc" / "tok.json"


def test_absolute_path_is_kept(tmp_path: Path) -> None:
    tokenizer = tmp_path / "elsewhere.json"
    tokenizer.write_text("{}")
    config = load_config(write(tmp_path, with_section(f"tokenizer: {{path: '{tokenizer}'}}")), env={})
    assert config.tokenizer is not None
    assert config.tokenizer.path == tokenizer


def test_models_take_names_or_mappings(tmp_path: Path) -> None:
    text = MINIMAL.replace("models: [encoder]", "models: [a, {name: b, version: 3}]")
    config = load_config(write(tmp_path, text), env={})
    assert config.models == (ModelRef(name="a"), ModelRef(name="b", version=3))


def test_one_version_of_each_model(tmp_path: Path) -> None:
    """Handlers reach models by name (ctx.model(name)): two versions of one model would hide one."""
    text = MINIMAL.replace("models: [encoder]", "models: [a, {name: b, version: 3}, {name: b, version: 4}]")
    with pytest.raises(ConfigError, match=r"models\[2\]: 'b' is listed twice; a service uses one version"):
        load_config(write(tmp_path, text), env={})


def test_os_environ_is_the_default_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOGICD_SERVER__PORT", "9100")
    assert load_config(write(tmp_path, MINIMAL)).server.port == 9100


# --- environment overrides ------------------------------------------------------------------------------


def test_env_overrides_nested_keys_with_typed_values(tmp_path: Path) -> None:
    env = {
        "LOGICD_MODEL_SERVICE__URL": "grpc://m:8001",
        "LOGICD_MODEL_SERVICE__TIMEOUT_S": "2.5",
        "LOGICD_CHUNKING__MAX_TOKENS": "256",
        "LOGICD_SERVER__PORT": "9000",
        "LOGICD_EXTRA__DEBUG": "true",
        "LOGICD_EXTRA__NESTED__LEVEL": "3",
        "LOGICD_LABELS__YES": "yes",  # text keys take the value as is, not YAML's bool
        "LOGICD_NAME": "renamed",
        "LOGICD_MODELS": "[a, {name: b, version: 2}]",
        "OTHER_VARIABLE": "ignored",
    }
    config = load_config(write(tmp_path, MINIMAL), env=env)
    assert config.model_service.url == "grpc://m:8001"
    assert config.model_service.timeout_s == 2.5
    assert config.chunking.max_tokens == 256
    assert config.server.port == 9000
    assert config.extra == {"debug": True, "nested": {"level": 3}}
    assert config.labels == {"yes": "yes"}
    assert config.name == "renamed"
    assert config.models == (ModelRef(name="a"), ModelRef(name="b", version=2))


def test_env_override_creates_a_missing_section(tmp_path: Path) -> None:
    config = load_config(write(tmp_path, MINIMAL), env={"LOGICD_AUTH__MODE": "bearer", "LOGICD_AUTH__TOKENS": "[t]"})
    assert config.auth.mode == "bearer"
    assert config.auth.tokens == ("t",)


def test_env_override_of_an_unknown_key_names_the_variable(tmp_path: Path) -> None:
    err = load_error(tmp_path, MINIMAL, {"LOGICD_CHUNKING__STRIDES": "5"})
    assert "LOGICD_CHUNKING__STRIDES" in str(err)
    assert "chunking.strides" in str(err)
    assert "did you mean LOGICD_CHUNKING__STRIDE?" in str(err)
    assert err.env_vars == ("LOGICD_CHUNKING__STRIDES",)


@pytest.mark.parametrize(
    ("var", "expected"),
    [
        ("LOGICD_NOPE", "unknown key, nope"),
        ("LOGICD_NAME__X", "name holds no nested keys"),
        ("LOGICD_LABELS__A__B", "labels.a holds no nested keys"),
        ("LOGICD_CHUNKING____STRIDE", "malformed name"),
    ],
)
def test_env_override_errors(tmp_path: Path, var: str, expected: str) -> None:
    err = load_error(tmp_path, MINIMAL, {var: "1"})
    assert var in str(err)
    assert expected in str(err)


def test_env_override_into_a_scalar_section_is_an_error(tmp_path: Path) -> None:
    err = load_error(tmp_path, with_section("chunking: 5"), {"LOGICD_CHUNKING__STRIDE": "1"})
    assert "LOGICD_CHUNKING__STRIDE cannot set chunking.stride: chunking is a number" in str(err)


def test_invalid_value_from_env_names_the_variable(tmp_path: Path) -> None:
    err = load_error(tmp_path, MINIMAL, {"LOGICD_SERVER__PORT": "http"})
    where = tmp_path / "service.yaml"
    assert str(err) == f"{where}: server.port: expected int, got str (from environment variable LOGICD_SERVER__PORT)"
    assert err.key == "server.port"


def test_rule_broken_by_env_names_the_variable(tmp_path: Path) -> None:
    err = load_error(tmp_path, with_section("chunking: {stride: 300}"), {"LOGICD_CHUNKING__MAX_TOKENS": "256"})
    assert err.key == "chunking.stride"
    assert "must be smaller than chunking.max_tokens (256), got 300" in str(err)
    assert err.env_vars == ("LOGICD_CHUNKING__MAX_TOKENS",)
    assert str(err).endswith("(from environment variable LOGICD_CHUNKING__MAX_TOKENS)")


def test_reserved_and_secret_variables_are_not_overrides(tmp_path: Path) -> None:
    text = with_section("auth: {mode: api_key, api_keys_env: [LOGICD_KEYS]}")
    config = load_config(write(tmp_path, text), env={"LOGICD_CONFIG": "x.yaml", "LOGICD_KEYS": "secret"})
    assert config.auth.api_keys == ("secret",)


# --- validation rules, each naming its key --------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "key", "reason"),
    [
        ("chunking: {stride: 600}", "chunking.stride", "must be smaller than chunking.max_tokens (512), got 600"),
        ("chunking: {max_tokens: 128, stride: 128}", "chunking.stride", "must be smaller than chunking.max_tokens"),
        ("chunking: {max_tokens: 600}", "chunking.max_tokens", "expected int <= 512, got 600"),
        ("chunking: {max_tokens: 0}", "chunking.max_tokens", "expected int >= 1, got 0"),
        ("chunking: {stride: -1}", "chunking.stride", "expected int >= 0, got -1"),
        ("chunking: {max_tokens: many}", "chunking.max_tokens", "expected int, got str"),
        ("chunking: {max_tokens: true}", "chunking.max_tokens", "expected int, got bool"),
        ("chunking: [1]", "chunking", "expected mapping, got list"),
        ("limits: {max_body_bytes: 0}", "limits.max_body_bytes", "expected int >= 1, got 0"),
        ("limits: {max_text_chars: -5}", "limits.max_text_chars", "expected int >= 1"),
        ("limits: {max_documents: 0}", "limits.max_documents", "expected int >= 1"),
        ("server: {port: 70000}", "server.port", "expected int <= 65535, got 70000"),
        ("auth: {mode: oauth}", "auth.mode", "must be one of 'api_key', 'bearer', 'none', got 'oauth'"),
        ("auth: {mode: api_key}", "auth.api_keys", "auth.mode 'api_key' needs auth.api_keys or auth.api_keys_env"),
        ("auth: {mode: bearer}", "auth.tokens", "auth.mode 'bearer' needs auth.tokens or auth.tokens_env"),
        ("auth: {api_keys: [k]}", "auth.api_keys", "given, but auth.mode is 'none'"),
        ("auth: {mode: bearer, tokens: [t], api_keys_env: [K]}", "auth.api_keys_env", "given, but auth.mode"),
        ("auth: {mode: api_key, api_keys: ['  ']}", "auth.api_keys[0]", "must not be empty"),
        ("labels: {a: 1}", "labels", "a value: expected str, got int"),
        ("labels: [a, b]", "labels", "expected mapping, got list"),
        ("tokenizer: {path: missing.json}", "tokenizer.path", "does not exist"),
        ("tokenizer: {path: 3}", "tokenizer.path", "expected a path, got a number"),
        ("tokenizer: {}", "tokenizer.path", "required key is missing"),
        ("extra: [1]", "extra", "expected mapping, got list"),
    ],
)
def test_section_rules_name_the_key(tmp_path: Path, section: str, key: str, reason: str) -> None:
    err = load_error(tmp_path, with_section(section))
    assert err.key == key
    assert reason in err.reason
    assert str(err).startswith(f"{tmp_path / 'service.yaml'}: {key}: ")
    assert err.env_vars == ()


@pytest.mark.parametrize(
    ("old", "new", "key", "reason"),
    [
        ("name: echo", "name: Echo", "name", "must be a DNS-1123 label"),
        ("name: echo", "name: echo_svc", "name", "must be a DNS-1123 label"),
        ("name: echo", "name: -echo", "name", "must be a DNS-1123 label"),
        ("name: echo", f"name: {'a' * 64}", "name", "at most 63 characters"),
        ("name: echo", "name: 12", "name", "expected str, got int"),
        ("name: echo\n", "", "name", "required key is missing"),
        ("echo.service:service", "echo.service", "service", "must be an import path"),
        ("echo.service:service", "echo-x.service:obj", "service", "must be an import path"),
        ("echo.service:service", "'echo.service:'", "service", "must be an import path"),
        ("http://models:8000", "ftp://models", "model_service.url", "must be http(s)://host[:port]"),
        ("http://models:8000", "grpc://models", "model_service.url", "grpc://host:port"),
        ("http://models:8000", "models:8000", "model_service.url", "must be http(s)://host[:port]"),
        ("http://models:8000", "http://models:99999", "model_service.url", "must be http(s)://host[:port]"),
        ("url: http://models:8000", "url: embedded", "model_service.model_repository", "required when"),
        (
            "url: http://models:8000",
            "url: 'grpc://m:1'\n  timeout_s: 0",
            "model_service.timeout_s",
            "expected float > 0",
        ),
        ("url: http://models:8000", "url: 'grpc://m:1'\n  retries: -1", "model_service.retries", "expected int >= 0"),
        ("models: [encoder]", "models: []", "models", "at least one model is required"),
        ("models: [encoder]", "models: [a, a]", "models[1]", "'a' is listed twice"),
        ("models: [encoder]", "models: [{name: a, version: 0}]", "models[0].version", "expected int >= 1, got 0"),
        ("models: [encoder]", "models: [{version: 1}]", "models[0].name", "required key is missing"),
        ("models: [encoder]", "models: ['a/b']", "models[0].name", "must be a model folder name"),
        ("models: [encoder]", "models: encoder", "models", "expected list, got str"),
    ],
)
def test_top_level_rules_name_the_key(tmp_path: Path, old: str, new: str, key: str, reason: str) -> None:
    assert old in MINIMAL
    err = load_error(tmp_path, MINIMAL.replace(old, new))
    assert err.key == key
    assert reason in err.reason
    assert f": {key}: " in str(err)


def test_embedded_requires_an_existing_model_repository(tmp_path: Path) -> None:
    text = MINIMAL.replace("url: http://models:8000", "url: embedded\n  model_repository: repo")
    err = load_error(tmp_path, text)
    assert err.key == "model_service.model_repository"
    assert f"not a directory: {tmp_path / 'repo'}" in err.reason
    (tmp_path / "repo").mkdir()
    assert load_config(tmp_path / "service.yaml", env={}).model_service.model_repository == tmp_path / "repo"


def test_embedded_message_names_the_url_key(tmp_path: Path) -> None:
    err = load_error(tmp_path, MINIMAL.replace("url: http://models:8000", "url: embedded"))
    assert err.reason == "required when model_service.url is 'embedded'"


def test_remote_url_does_not_need_the_model_repository_to_exist(tmp_path: Path) -> None:
    text = MINIMAL.replace("url: http://models:8000", "url: http://models:8000\n  model_repository: absent")
    assert load_config(write(tmp_path, text), env={}).model_service.model_repository == tmp_path / "absent"


# --- file and YAML errors -------------------------------------------------------------------------------


def test_yaml_syntax_error_has_line_and_column(tmp_path: Path) -> None:
    err = load_error(tmp_path, "name: echo\nservice: [a, b\nmodels: x\n")
    assert err.line is not None
    assert err.column is not None
    assert str(err).startswith(f"{tmp_path / 'service.yaml'}:{err.line}:{err.column}: invalid YAML: ")


def test_yaml_error_points_at_the_bad_line(tmp_path: Path) -> None:
    err = load_error(tmp_path, "name: echo\nservice: x\n  bad: value\n")
    assert (err.line, err.column) == (3, 6)
    assert "mapping values are not allowed here" in str(err)


def test_duplicate_key_is_an_error_with_its_line(tmp_path: Path) -> None:
    err = load_error(tmp_path, MINIMAL + "name: again\n")
    assert err.line == 6
    assert "duplicate key 'name' (first at line 1)" in str(err)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"nope\.yaml: cannot read the file: No such file"):
        load_config(tmp_path / "nope.yaml", env={})


@pytest.mark.parametrize(("text", "got"), [("- a\n- b\n", "a list"), ("just text\n", "text")])
def test_top_level_must_be_a_mapping(tmp_path: Path, text: str, got: str) -> None:
    assert f"expected a mapping of settings, got {got}" in str(load_error(tmp_path, text))


def test_empty_file_reports_the_first_missing_key(tmp_path: Path) -> None:
    err = load_error(tmp_path, "")
    assert err.key is not None
    assert err.reason == "required key is missing"


# --- unknown keys ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("section", "key", "suggestion"),
    [
        ("chunking: {strid: 5}", "chunking.strid", "chunking.stride"),
        ("servr: {port: 1}", "servr", "server"),
        ("model_service: {url: 'grpc://m:1', timeout: 3}", "model_service.timeout", "model_service.timeout_s"),
        ("auth: {mode: api_key, api_key: [k]}", "auth.api_key", "auth.api_keys"),
    ],
)
def test_unknown_key_suggests_the_close_one(tmp_path: Path, section: str, key: str, suggestion: str) -> None:
    text = with_section(section)
    if section.startswith("model_service"):
        text = MINIMAL.replace("model_service:\n  url: http://models:8000\n", "") + section + "\n"
    err = load_error(tmp_path, text)
    assert err.key == key
    assert err.reason == f"unknown key; did you mean {suggestion!r}?"


def test_unknown_key_without_a_close_match(tmp_path: Path) -> None:
    err = load_error(tmp_path, with_section("zzzzzz: 1"))
    assert (err.key, err.reason) == ("zzzzzz", "unknown key")


# --- auth secrets ---------------------------------------------------------------------------------------


def test_auth_secrets_come_from_named_variables(tmp_path: Path) -> None:
    text = with_section("auth: {mode: api_key, api_keys: [inline], api_keys_env: [KEYS_A, KEYS_B]}")
    config = load_config(write(tmp_path, text), env={"KEYS_A": "a1,a2", "KEYS_B": " b1 , inline "})
    assert config.auth.api_keys == ("inline", "a1", "a2", "b1")
    assert config.auth.api_keys_env == ("KEYS_A", "KEYS_B")
    assert "a1" not in repr(config)
    assert "api_keys=<4 hidden>" in repr(config.auth)


def test_bearer_tokens_from_a_variable(tmp_path: Path) -> None:
    text = with_section("auth: {mode: bearer, tokens_env: [TOKENS]}")
    assert load_config(write(tmp_path, text), env={"TOKENS": "t1"}).auth.tokens == ("t1",)


@pytest.mark.parametrize(("env", "state"), [({}, "not set"), ({"KEYS": " , "}, "empty")])
def test_auth_secret_variable_missing_or_empty(tmp_path: Path, env: dict[str, str], state: str) -> None:
    err = load_error(
        tmp_path, with_section("auth: {mode: api_key, api_keys_env: [OTHER, KEYS]}"), {"OTHER": "x", **env}
    )
    assert err.key == "auth.api_keys_env[1]"
    assert err.reason == f"environment variable KEYS is {state}"


# --- built in code --------------------------------------------------------------------------------------


def test_sections_built_in_code_check_their_rules() -> None:
    with pytest.raises(ConfigError, match=r"^stride: must be smaller than max_tokens \(128\), got 200$"):
        ChunkingConfig(max_tokens=128, stride=200)
    with pytest.raises(ConfigError, match="needs api_keys or api_keys_env"):
        AuthConfig(mode="api_key")
    with pytest.raises(ConfigError, match=r"^name: must be a DNS-1123 label"):
        ServiceConfig(
            name="Bad",
            service="a:b",
            model_service=ModelServiceConfig(url="http://m:8000"),
            models=(ModelRef(name="m"),),
        )
