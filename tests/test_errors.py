"""The error catalogue: the documentation's table (docs/protocols.md) and the code agree,
and every answer is OpenAI-shaped."""

from __future__ import annotations

import json
import re

import pytest

from llm_gateway import errors
from tests.support import REPO


def readme_error_table() -> dict[str, int]:
    """code -> status, from the error table of docs/protocols.md."""
    text = (REPO / "docs" / "protocols.md").read_text()
    table = text.split("Errors are OpenAI-shaped", 1)[1].split("\n\n", 2)[1]
    codes: dict[str, int] = {}
    for row in table.splitlines()[2:]:
        status, _, code_cell = (cell.strip() for cell in row.strip("|").split("|"))
        for code in re.findall(r"`([a-z_]+)`", code_cell):
            codes[code] = int(status)
    return codes


def test_the_readme_table_is_the_catalogue() -> None:
    answered = {code: kind.status for code, kind in errors.CATALOGUE.items()
                if code not in {"method_not_allowed", "not_ready", "conflict",
                                "not_configured"}}  # admin/probe ports only
    assert readme_error_table() == answered


@pytest.mark.parametrize("rejection", [
    errors.invalid_json(), errors.invalid_request_body("bad"), errors.invalid_api_key(),
    errors.model_not_allowed("m"), errors.endpoint_not_allowed("GET", "/x"),
    errors.egress_denied("example.com", 443), errors.not_found("GET", "/x"),
    errors.request_too_large(10), errors.rate_limit_exceeded("slow down", []),
    errors.gateway_error(), errors.key_store_unavailable(), errors.rate_limiter_unavailable(),
], ids=lambda rejection: rejection.code)
def test_every_answer_is_openai_shaped_with_its_catalogued_status(
    rejection: errors.Rejection,
) -> None:
    kind = errors.CATALOGUE[rejection.code]
    body = json.loads(rejection.body)
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "code"}
    assert (rejection.status, body["error"]["type"], body["error"]["code"]) == (
        kind.status, kind.type, kind.code)
    assert body["error"]["message"]
    assert ("content-type", "application/json") in rejection.all_headers()


def test_outages_ask_the_client_to_retry_shortly() -> None:
    for rejection in (errors.key_store_unavailable(), errors.rate_limiter_unavailable()):
        assert ("retry-after", "1") in rejection.headers


def test_an_upstream_failure_carries_its_catalogued_status() -> None:
    failure = errors.UpstreamFailure("upstream_timeout", "too slow", attempts=3)
    assert (failure.status, failure.attempts) == (504, 3)
    assert json.loads(failure.body())["error"] == {
        "message": "too slow", "type": "upstream_error", "code": "upstream_timeout"}
    with pytest.raises(KeyError):
        errors.reject("no_such_code", "an unknown code is a bug, not an answer")
