"""Any failure after a budget reservation releases it: a fault injected at every step of
admission and relay, through every surface, and each time the ledger's reserved amount
returns to zero, the client gets an answer (never a hang) and an admitted request gets
exactly one usage record. Before, a failure after the reservation (the spool's write of a
model with a lone surrogate, say) kept it until its window ended: two such requests locked
a subject's token budget for the day."""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_gateway.billing.metering import UsageWriter
from llm_gateway.billing.model import BudgetScope
from llm_gateway.billing.prices import PriceBook
from llm_gateway.engine import Gateway
from llm_gateway.exchange import Exchange
from llm_gateway.relay import Relay
from llm_gateway.routing.client import UpstreamClient
from llm_gateway.telemetry import Telemetry
from llm_gateway.testing.fake_upstream import FakeUpstream
from llm_gateway.testing.records import RecordedUsage
from tests.billing_support import set_budget, set_price
from tests.support import create_key
from tests.surfaces import SURFACES, Surface, local_surface, reserved, wait_until

# Each sets up its own backends: one pass of the suite runs it (.ci/run).
pytestmark = pytest.mark.slow_once

# (where, what, the kinds of request it is on the path of)
STEPS = [
    (Gateway, "_limits", "json stream"),
    (Exchange, "__init__", "json stream"),
    (Exchange, "admission_record", "json stream"),
    (UsageWriter, "admitted", "json stream"),
    (Exchange, "upstream_body", "json stream"),
    (UpstreamClient, "send", "json stream"),
    (Exchange, "on_response_start", "json stream"),
    (Exchange, "complete_body", "json"),
    (Relay, "_count_tokens_used", "json stream"),
    (Exchange, "on_frame", "stream"),
    (Exchange, "observe_body", "json"),
    (Exchange, "_apply_facts", "json stream"),
    (Exchange, "_estimate_usage", "json stream"),
    (PriceBook, "price_at", "json stream"),
    (UsageWriter, "add", "json stream"),
    (Telemetry, "finished", "json stream"),
]
BODY = {"model": "llama-3.3-70b", "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 50}


class Injected(RuntimeError):
    pass


def raising(original: object) -> object:
    if inspect.iscoroutinefunction(original):
        async def fail_async(*args: object, **kwargs: object) -> object:
            raise Injected("a fault injected by the test")
        return fail_async

    def fail(*args: object, **kwargs: object) -> object:
        raise Injected("a fault injected by the test")
    return fail


@pytest.fixture(params=SURFACES)
def on(request: pytest.FixtureRequest, tmp_path: Path, fake_url: str,
       fake: FakeUpstream) -> Iterator[Surface]:
    with local_surface(request.param, tmp_path, fake_url) as it:
        yield it


def test_a_fault_at_any_step_releases_the_reservation(
    on: Surface, fake: FakeUpstream, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    record, key = create_key(on.database_url, rate_limit_requests=10_000)
    set_budget(on.database_url, BudgetScope.KEY, record.id, daily_tokens=10**9,
               daily_usd="1000")
    set_price(on.database_url, "venice", "llama-3.3-70b", "1", "2")
    on.gateway.refresh_from_thread()
    finished = RecordedUsage()
    on.gateway.add_record_sink(finished)
    for owner, name, kinds in STEPS:
        for kind in kinds.split():
            body = {**BODY, "stream": kind == "stream"}
            with monkeypatch.context() as patch:
                patch.setattr(owner, name, raising(getattr(owner, name)))
                answer = on.send("/chat/completions", json.dumps(body).encode(),
                                 {"authorization": f"Bearer {key}"})
            where = f"{owner.__name__}.{name} ({kind})"
            assert answer.status in (200, 500), (where, answer.status, answer.body[:200])
            assert answer.head_problems() == [], where
            wait_until(lambda: reserved(on.gateway) == 0, what=where)
            # Refused at admission (the 500 says nothing was forwarded): no record; else
            # exactly one, under the id the client got.
            request_id = answer.header("x-request-id")
            if b"it was not forwarded" not in answer.body:
                wait_until(lambda request_id=request_id: any(
                    r.request_id == request_id for r in finished.records), what=where)
            assert len([r for r in finished.records if r.request_id == request_id]) == (
                0 if b"it was not forwarded" in answer.body else 1), where
    # And with nothing injected, the same requests are served as ever.
    answer = on.send("/chat/completions", json.dumps(BODY).encode(),
                     {"authorization": f"Bearer {key}"})
    assert answer.status == 200
    wait_until(lambda: reserved(on.gateway) == 0)
