"""Strings a caller chooses (``model``, ``user``, ``x-llm-gateway-tags``) through every
surface: admitted once before anything is reserved or sent, or refused with a 400 naming
the field; never written into a response header as sent; never growing a label, a log
line or a spool line without bound. Each test here failed on the tree before
``caller_text`` (the security review's findings)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_gateway.billing.model import BudgetScope
from llm_gateway.testing.fake_upstream import FakeUpstream
from tests.billing_support import set_budget
from tests.support import create_key
from tests.surfaces import (
    SURFACES,
    RawAnswer,
    Surface,
    local_surface,
    reserved,
    wait_until,
)

# Each sets up its own backends: one pass of the suite runs it (.ci/run).
pytestmark = pytest.mark.slow_once

SPLITTING = ("evil\r\nSet-Cookie: session=attacker\r\nContent-Length: 0\r\n\r\n"
             "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 5\r\n\r\npwned")
KINDS = {
    "json": ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
    "stream": ("/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                     "stream": True}),
    "embeddings": ("/embeddings", {"input": "hi"}),
}


@pytest.fixture(params=SURFACES)
def on(request: pytest.FixtureRequest, tmp_path: Path, fake_url: str,
       fake: FakeUpstream) -> Iterator[Surface]:
    with local_surface(request.param, tmp_path, fake_url) as it:
        yield it


def budgeted_key(on: Surface) -> str:
    """A key with a token budget: every request it makes reserves on the ledger."""
    record, key = create_key(on.database_url)
    set_budget(on.database_url, BudgetScope.KEY, record.id, daily_tokens=10**9)
    return key


def call(on: Surface, key: str, path: str, body: dict, **headers: str) -> RawAnswer:
    raw = json.dumps(body).encode()
    return on.send(path, raw, {"authorization": f"Bearer {key}", **headers})


def assert_refused(answer: RawAnswer, field: str, code: str = "invalid_request_body") -> None:
    assert answer.status == 400, answer.body[:300]
    error = json.loads(answer.body)["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", code)
    assert f"'{field}" in error["message"]


def assert_clean_head(answer: RawAnswer) -> None:
    assert answer.head_problems() == []
    assert answer.header("set-cookie") is None
    answer.head.decode("ascii")  # every header the gateway writes is ASCII


@pytest.mark.parametrize("kind", KINDS)
def test_a_model_that_would_split_the_response_is_refused_before_anything(
    on: Surface, fake: FakeUpstream, kind: str,
) -> None:
    key = budgeted_key(on)
    path, body = KINDS[kind]
    answer = call(on, key, path, {**body, "model": SPLITTING})
    assert_refused(answer, "model")
    assert_clean_head(answer)
    assert fake.requests == []
    assert reserved(on.gateway) == 0


@pytest.mark.parametrize("model", ["x\u2028y", "x\u202ey", "tab\there", "nul\x00", "del\x7f",
                                   "c1\x85"])
def test_control_format_and_separator_characters_in_a_model_are_refused(
    on: Surface, fake: FakeUpstream, model: str,
) -> None:
    answer = call(on, budgeted_key(on), *KINDS["json"][:1], {**KINDS["json"][1], "model": model})
    assert_refused(answer, "model")
    assert fake.requests == []


def test_a_non_latin1_model_is_served_and_named_escaped_in_the_upstream_header(
    on: Surface, fake: FakeUpstream,
) -> None:
    for kind in KINDS:
        path, body = KINDS[kind]
        answer = call(on, budgeted_key(on), path, {**body, "model": "模型-ü"})
        assert answer.status == 200, answer.body[:300]
        assert_clean_head(answer)
        assert answer.header("x-llm-gateway-upstream") == "venice/%E6%A8%A1%E5%9E%8B-%C3%BC"
    assert reserved(on.gateway) == 0 or wait_until(lambda: reserved(on.gateway) == 0) is None


@pytest.mark.parametrize("where", ["model", "content"])
def test_a_lone_surrogate_is_refused_before_the_budget_is_reserved(
    on: Surface, fake: FakeUpstream, where: str,
) -> None:
    key = budgeted_key(on)
    # json.dumps writes the escape a hostile client would send (\ud800 alone).
    model, content = ("x\ud800", "hi") if where == "model" else ("llama-3.3-70b", "hi\ud800")
    for _ in range(3):  # three would have locked the day's budget for good
        answer = call(on, key, "/chat/completions",
                      {"model": model, "messages": [{"role": "user", "content": content}]})
        assert answer.status == 400, answer.body[:300]
        assert json.loads(answer.body)["error"]["code"] == "invalid_request_body"
    assert fake.requests == []
    assert reserved(on.gateway) == 0


def test_a_huge_model_name_is_refused_and_grows_nothing(
    on: Surface, fake: FakeUpstream,
) -> None:
    answer = call(on, budgeted_key(on), "/chat/completions",
                  {**KINDS["json"][1], "model": "m" * 900_000})
    assert_refused(answer, "model")
    assert "256" in json.loads(answer.body)["error"]["message"]
    assert fake.requests == []


def test_metric_labels_are_bounded_in_length(on: Surface, fake: FakeUpstream) -> None:
    """A name within the model's bound but past the label's (128) is counted as other."""
    long_model = "m" * 200
    answer = call(on, budgeted_key(on), "/chat/completions",
                  {**KINDS["json"][1], "model": long_model})
    assert answer.status == 200
    on.gateway.flush_from_thread()
    body, _ = on.gateway.telemetry.metrics()
    assert long_model.encode() not in body
    assert b'model="other"' in body


@pytest.mark.parametrize("header", [
    "feature", "feature=\x01x", "bad key=1", "=x", f"k={'v' * 300}",
    ",".join(f"k{i}=v" for i in range(17)), "k=caf\u00e9".encode().decode("latin-1") + "\udc80",
])
def test_malformed_tags_are_refused(on: Surface, fake: FakeUpstream, header: str) -> None:
    answer = call(on, budgeted_key(on), *KINDS["json"][:1], {**KINDS["json"][1],
                                                             "model": "llama-3.3-70b"},
                  **{"x-llm-gateway-tags": header})
    if "\x01" in header and answer.status == 400 and b"invalid_request_header" not in answer.body:
        pass  # the HTTP/1.1 parser (serve's, uvicorn's, mitmproxy's) refused it first
    else:
        assert_refused(answer, "x-llm-gateway-tags", "invalid_request_header")
    assert fake.requests == []
    assert reserved(on.gateway) == 0


def test_tags_are_admitted_and_never_forwarded(on: Surface, fake: FakeUpstream) -> None:
    tags = "feature=search, env=prod, who=caf\u00e9".encode().decode("latin-1")
    answer = call(on, budgeted_key(on), *KINDS["json"][:1], {**KINDS["json"][1],
                                                             "model": "llama-3.3-70b"},
                  **{"x-llm-gateway-tags": tags})
    assert answer.status == 200, answer.body[:300]
    [seen] = fake.requests
    assert not any(name.startswith("x-llm-gateway-") for name in seen.headers)


@pytest.mark.parametrize("user", ["a\nb", "u" * 257, 42])
def test_a_bad_user_is_refused(on: Surface, fake: FakeUpstream, user: object) -> None:
    answer = call(on, budgeted_key(on), "/chat/completions",
                  {**KINDS["json"][1], "model": "llama-3.3-70b", "user": user})
    assert_refused(answer, "user")
    assert fake.requests == []
