"""For arbitrary strings in ``model``, ``user`` and ``x-llm-gateway-tags`` (any code point,
lone surrogates included), every surface answers either a 400 ``invalid_request_error``
or a normal answer; no response head ever holds a CR or LF the gateway did not write (nor
a second response after the first); no budget reservation is left behind."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llm_gateway.billing.model import BudgetScope
from llm_gateway.testing.fake_upstream import FakeUpstream
from tests.billing_support import set_budget
from tests.support import create_key
from tests.surfaces import SURFACES, Surface, local_surface, reserved, wait_until

# Each sets up its own backends: one pass of the suite runs it (.ci/run).
pytestmark = pytest.mark.slow_once

PROPERTY = settings(max_examples=60, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])
# Any code point, lone surrogates included.
ANY_TEXT = st.text(st.characters(codec=None, exclude_categories=()), max_size=300)
# What an HTTP client can put in a header at all (a CR or LF would end it on our side).
HEADER_TEXT = st.text(st.characters(codec=None, exclude_categories=(),
                                    exclude_characters="\r\n"), max_size=80)
# Mostly plausible, so that a good share of the requests is admitted and sent.
MODELS = st.one_of(ANY_TEXT, st.sampled_from(["llama-3.3-70b", "qwen3-4b", "modèle-ü"]))
TAGS = st.one_of(st.none(), HEADER_TEXT,
                 st.builds(lambda k, v: f"{k}={v}", st.from_regex(r"[a-z]{1,8}", fullmatch=True),
                           HEADER_TEXT))


@pytest.fixture(params=SURFACES)
def on(request: pytest.FixtureRequest, tmp_path: Path, fake_url: str,
       fake: FakeUpstream) -> Iterator[Surface]:
    with local_surface(request.param, tmp_path, fake_url) as it:
        yield it


def test_any_caller_string_gets_a_400_or_a_normal_answer(on: Surface) -> None:
    record, key = create_key(on.database_url, rate_limit_requests=100_000)
    set_budget(on.database_url, BudgetScope.KEY, record.id, daily_tokens=10**12)

    @PROPERTY
    @given(model=MODELS, user=st.one_of(st.none(), ANY_TEXT), tags=TAGS,
           stream=st.booleans())
    def check(model: str, user: str | None, tags: str | None, stream: bool) -> None:
        body: dict[str, object] = {"model": model, "stream": stream,
                                   "messages": [{"role": "user", "content": "hi"}]}
        if user is not None:
            body["user"] = user
        headers = {"authorization": f"Bearer {key}"}
        if tags is not None:
            headers["x-llm-gateway-tags"] = tags
        answer = on.send("/chat/completions", json.dumps(body).encode(), headers)
        assert answer.head_problems() == []
        assert answer.header("set-cookie") is None
        assert answer.status in (200, 400), (answer.status, answer.body[:300])
        if answer.status == 400:
            if answer.header("content-type") == "application/json":
                assert json.loads(answer.body)["error"]["type"] == "invalid_request_error"
            else:  # uvicorn's own answer to a header it cannot parse (the middleware)
                assert on.name == "middleware"
        wait_until(lambda: reserved(on.gateway) == 0)

    check()
