"""Schema-driven fuzzing of the example services' REST APIs (schemathesis), against a real ``logicd serve``.

Each operation of the service's OpenAPI document (``/schema/openapi.json``) is fuzzed twice: with bodies the schema
allows (positive) and with bodies it does not (negative: wrong types, missing fields, bytes that are not JSON). What
every answer must hold:
- no 5xx (schemathesis' ``not_a_server_error``), and the answer is on time;
- a 2xx conforms to the schema: its content type, headers and body (``content_type_conformance``,
  ``response_headers_conformance``, ``response_schema_conformance``); a negative body is never accepted
  (``negative_data_rejection``);
- every 4xx is ``application/problem+json`` whose ``status`` is the HTTP status and whose ``detail`` says what is
  wrong (``problem_json`` here).

- every status is one the document lists for the route, with its content type (``status_code_conformance``,
  ``content_type_conformance``): logicd documents 400, 404, 413, 422, 429, 503 and 504 as problem+json, and
  ``additionalProperties: false`` on request types that refuse unknown fields.

Left out: ``positive_data_acceptance``, which fails on every schema-valid body the service refuses on its content
(an empty text, a ``model`` it does not serve).

Positive bodies are kept small (texts of at most 300 characters, at most 4 of them), so an example costs
milliseconds of model time on 2 cores, not seconds.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import schemathesis
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS
from schemathesis.core.result import Ok

from loadtests.fuzz._protocol import Target
from loadtests.harness._servers import ROOT, ServerProcess, free_port

SERVICES = ("doc_classifier", "embedder")
SCHEMA_PATH = "/schema/openapi.json"
TIMEOUT_S = 60.0
MAX_TEXT = 300
MAX_TEXTS = 4

_CHECK_NAMES = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_headers_conformance",
    "response_schema_conformance",
    "negative_data_rejection",
)


def _checks(*names: str) -> list[Any]:
    known = {check.__name__: check for check in CHECKS.get_all()}
    return [known[name] for name in names]


@contextmanager
def embedded_service(service: str) -> Iterator[str]:
    """``logicd serve services/<service>`` with the model service embedded (one process); yields its base URL."""
    http = free_port()
    argv = [
        sys.executable, "-m", "logicd", "serve", str(ROOT / "services" / service),
        "--host", "127.0.0.1", "--port", str(http), "--model-url", "embedded",
    ]  # fmt: skip
    env = dict(os.environ, LOGICD_MODEL_SERVICE__MODEL_REPOSITORY="./model_repository", PYTHONUNBUFFERED="1")
    with ServerProcess(
        f"logicd {service}", argv, http, env, ready_path="/health/ready", ready_timeout_s=120, cwd=ROOT
    ) as server:
        yield server.base_url


def problem_json(status: int, content_type: str, body: bytes) -> None:
    """A 4xx is RFC 9457 problem+json: its ``status`` the HTTP status, its ``detail`` a non-empty text."""
    if not 400 <= status < 500:
        return
    assert content_type.split(";")[0].strip() == "application/problem+json", f"{status} as {content_type!r}"
    problem = json.loads(body)
    assert problem.get("status") == status, f"problem status {problem.get('status')} in a {status}"
    detail = problem.get("detail")
    assert isinstance(detail, str), f"no detail in {problem}"
    assert detail.strip(), f"no detail in {problem}"


def _small(value: Any) -> Any:
    """A positive body's texts cut to MAX_TEXT characters and its lists to MAX_TEXTS items (model time)."""
    if isinstance(value, str):
        return value[:MAX_TEXT]
    if isinstance(value, list):
        return [_small(v) for v in value[:MAX_TEXTS]]
    if isinstance(value, dict):
        return {k: _small(v) for k, v in value.items()}
    return value


@dataclass
class Call:
    """A generated case, ready to send."""

    case: Any
    mode: str
    headers: dict[str, str]
    """Deadline headers sent with it (logicd's Request-Timeout and grpc-timeout), valid or not."""

    def __repr__(self) -> str:
        return f"{self.mode} {self.case.method} {self.case.path} headers={self.headers} body={self.case.body!r:.300}"


_HEADER_TEXT = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0xFF, exclude_characters="\x7f"), max_size=12
).map(str.strip)  # requests refuses a value that starts with a space
_VALID_DEADLINES = {  # long enough not to be a 504
    "Request-Timeout": st.sampled_from(["30", "60.5", "100000", "45.000000001"]),
    "grpc-timeout": st.sampled_from(["600S", "99999999H", "1M", "30000m"]),
}
_BAD_DEADLINES = st.one_of(
    st.sampled_from(["0", "-1", "1e3", "nan", "inf", "1.", ".5", "1_0", "\xb2", "0S", "1s", "123456789S", ""]),
    _HEADER_TEXT,
)


@st.composite
def _calls(draw: st.DrawFn, operation: Any, mode: GenerationMode, served: dict[str, Any]) -> Call:
    case = draw(operation.as_strategy(generation_mode=mode))
    if mode is GenerationMode.POSITIVE and isinstance(case.body, dict):
        case.body = _small(case.body)
        for key, value in served.items():  # a schema-valid body the service also takes, half of the time
            if key in case.body and draw(st.booleans()):
                case.body[key] = value
    headers: dict[str, str] = {}
    for name, valid in _VALID_DEADLINES.items():
        if draw(st.integers(0, 3)) == 3:  # (hypothesis draws 0 most: the usual case)
            headers[name] = draw(_BAD_DEADLINES if draw(st.integers(0, 3)) == 3 else valid)  # a bad one: a 400
    return Call(case, mode.value, headers)


_SERVED: dict[str, Any] = {"model": None, "dimensions": None, "top_k": None}
"""Values the services take for fields whose random values they refuse on their content (404, 422)."""


def targets(service: str, base_url: str) -> list[Target]:
    """A target per operation of the service's schema and generation mode, against the service at ``base_url``."""
    schema = schemathesis.openapi.from_url(f"{base_url}{SCHEMA_PATH}", timeout=10)
    checks = _checks(*_CHECK_NAMES)

    def check(call: Call) -> str:
        response = call.case.call(base_url=base_url, headers=call.headers, timeout=TIMEOUT_S)
        call.case.validate_response(response, checks=checks)
        problem_json(response.status_code, (response.headers.get("content-type") or [""])[0], response.content)
        return str(response.status_code)

    found = []
    for result in schema.get_all_operations():
        if not isinstance(result, Ok):
            raise RuntimeError(f"{service}: an operation of its OpenAPI document is not valid: {result.err()}")
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            name = f"{service} {operation.method.upper()} {operation.path} ({mode.value})"
            found.append(Target(name, _calls(operation, mode, _SERVED), check))
    return found


TEXT_FIELD = {"doc_classifier": "documents", "embedder": "input"}
ROUTE = {"doc_classifier": "/v1/classify", "embedder": "/v1/embeddings"}


def deep_body(service: str, depth: int = 100_000) -> bytes:
    """A body for the service's route whose texts are an array nested ``depth`` deep."""
    return b'{"' + TEXT_FIELD[service].encode() + b'": ' + b"[" * depth + b"]" * depth + b"}"
