"""Both example services fuzzed from their OpenAPI documents (schemathesis), against real ``logicd serve`` processes
with the model service embedded, one per service for the module; and bad bodies the schema cannot describe (JSON
nested 100,000 deep, bytes that are not UTF-8). What must hold is in loadtests/fuzz/_services.py: no 5xx, 2xx as
the schema says, every 4xx problem+json with its status and a detail. ``python -m loadtests.fuzz --service all``
runs the same with many more examples."""

from __future__ import annotations

import os
from collections.abc import Iterator

import httpx
import pytest
from hypothesis import HealthCheck, given, settings

from loadtests.fuzz import _services as fuzz
from loadtests.fuzz._protocol import Target
from services import build

FUZZ = settings(
    max_examples=int(os.environ.get("LOGICD_FUZZ_EXAMPLES", "12")),
    deadline=None,
    derandomize=bool(os.environ.get("CI")),
    database=None,
    suppress_health_check=list(HealthCheck),
)


@pytest.fixture(scope="module")
def built() -> None:
    """The example services' model, exported once if a previous run has not (services/conftest.py's fixture; here,
    since services import no loadtests)."""
    build.build()
    assert not build.missing(), build.missing()


@pytest.fixture(scope="module", params=fuzz.SERVICES)
def service(request: pytest.FixtureRequest, built: None) -> Iterator[tuple[str, str]]:
    """(service name, base URL) of ``logicd serve`` with the model service embedded."""
    with fuzz.embedded_service(request.param) as base_url:
        yield request.param, base_url


def test_schema_fuzzing(service: tuple[str, str]) -> None:
    name, base_url = service
    targets = fuzz.targets(name, base_url)
    assert len(targets) == 2, [t.name for t in targets]  # one route: positive and negative bodies
    for target in targets:
        _fuzz(target)


def _fuzz(target: Target) -> None:
    @FUZZ
    @given(target.strategy)
    def run(call: fuzz.Call) -> None:
        target.check(call)

    run()


def _post(base_url: str, name: str, body: bytes) -> httpx.Response:
    headers = {"content-type": "application/json"}
    return httpx.post(f"{base_url}{fuzz.ROUTE[name]}", content=body, headers=headers, timeout=60)


@pytest.mark.parametrize("depth", [70, 100_000])
def test_deeply_nested_body_is_a_400_naming_it(service: tuple[str, str], depth: int) -> None:
    name, base_url = service
    response = _post(base_url, name, fuzz.deep_body(name, depth))
    fuzz.problem_json(response.status_code, response.headers["content-type"], response.content)
    assert response.status_code == 400
    if depth > 1_000:  # past msgspec's own depth guard: the RecursionError that _on_error names
        assert response.json()["detail"] == "the request body nests too deeply"
    ok = _post(base_url, name, b'{"%s": "still serving"}' % fuzz.TEXT_FIELD[name].encode())
    assert ok.status_code == 200, ok.text


@pytest.mark.parametrize("body", [b'{"%s": "\xc0"}', b"\xff\xfe", b'{"%s": ["a", "\xed\xa0\x80"]}'])
def test_body_not_utf8_is_a_400_naming_it(service: tuple[str, str], body: bytes) -> None:
    name, base_url = service
    response = _post(base_url, name, body.replace(b"%s", fuzz.TEXT_FIELD[name].encode()))
    fuzz.problem_json(response.status_code, response.headers["content-type"], response.content)
    assert response.status_code == 400
