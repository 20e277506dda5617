"""The public API's bodies fuzzed, every endpoint of every caller protocol: chat completions
and embeddings (OpenAI), Messages and its token count (Anthropic), Responses with its
token count and compaction (OpenAI's Responses). No caller speaks Gemini to the gateway
(``protocols/gemini.py``: a target's protocol only), so it has no endpoint here.

Bodies are generated from each endpoint's request shape (the fields its protocol module
reads, with plausible values, a model routed to either protocol's upstream so that both
the native and the translated paths run) and then mutated: a field dropped, retyped or
duplicated, integers past 64 bits, a lone surrogate or invalid UTF-8 in a string, nesting
thousands deep, a string near the body limit, unknown fields, truncated JSON, a JSON body
that is no object. Sometimes the upstream is told to fail (an error status, a stream cut
or with an in-band error).

Every answer is a well-formed one in the caller's protocol: an error is OpenAI's
``{"error": {...}}`` or Anthropic's ``{"type": "error", "error": {...}}`` (in a stream, the
protocol's error event), a success parses as what the endpoint returns; the status is
never a 5xx but for a 502, 503 or 504 when the upstream was told to fail; nothing is
logged as an error (no traceback); after each call no budget reservation is left (the key's
subject has a token budget, so every billed request reserves).

The engine runs on the test's own loop and is called through the ASGI app, against two
fakes of its own (Anthropic's and OpenAI's, tests/agent_support.py's routes). 300
derandomized examples (tests/fuzzing.py: more, locally).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import event, example, given, note
from hypothesis import strategies as st

from asgi_middleware import create_app
from llm_gateway.billing.model import BudgetScope
from llm_gateway.keys import new_key_record
from llm_gateway.testing.fake_faults import Fault
from llm_gateway.testing.fake_upstream import FakeUpstream, running_fake_upstream
from llm_gateway.wiring import build_gateway
from tests.agent_support import PROVIDER_KEY, agent_routes
from tests.billing_support import set_budget
from tests.conftest import make_settings
from tests.fuzzing import fuzz_settings
from tests.surfaces import reserved
from tests.test_fuzz import KEY, Generated, Running, call_app, nothing_logged

pytestmark = pytest.mark.slow_once  # fakes and state of its own: one pass is enough
SUBJECT = "fuzz"  # every key's subject, with a token budget: billed requests reserve
BODY_LIMIT = 256 * 1024  # REQUEST_BODY_LIMIT_BYTES here: strings near it stay cheap

# ---- the request shapes ------------------------------------------------------------------

TEXT = st.text(max_size=24)
MODEL = st.sampled_from(["gpt", "claude"])  # OpenAI's upstream, Anthropic's
TEXT_BLOCKS = st.lists(st.fixed_dictionaries({"type": st.just("text"), "text": TEXT}),
                       min_size=1, max_size=2)
FUNCTION = {"name": "lookup", "description": "Looks a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}}}
CHAT = st.fixed_dictionaries({
    "model": MODEL,
    "messages": st.lists(st.fixed_dictionaries({
        "role": st.sampled_from(["user", "user", "system", "assistant"]),
        "content": TEXT | TEXT_BLOCKS}), min_size=1, max_size=3),
}, optional={
    "stream": st.booleans(), "max_tokens": st.integers(1, 40), "temperature": st.floats(0, 2),
    "stream_options": st.just({"include_usage": True}), "n": st.integers(1, 3),
    "tools": st.just([{"type": "function", "function": FUNCTION}]),
    "stop": st.lists(TEXT, max_size=2), "user": TEXT,
})
EMBEDDINGS = st.fixed_dictionaries({
    "model": st.just("gpt"), "input": TEXT | st.lists(TEXT, min_size=1, max_size=3),
}, optional={"encoding_format": st.sampled_from(["float", "base64"]),
             "dimensions": st.integers(1, 64)})
ANTHROPIC_MESSAGES = st.lists(st.fixed_dictionaries({
    "role": st.sampled_from(["user", "user", "assistant"]), "content": TEXT | TEXT_BLOCKS}),
    min_size=1, max_size=3)
MESSAGES = st.fixed_dictionaries({
    "model": MODEL, "max_tokens": st.integers(1, 40), "messages": ANTHROPIC_MESSAGES,
}, optional={
    "system": TEXT | TEXT_BLOCKS, "stream": st.booleans(), "temperature": st.floats(0, 1),
    "tools": st.just([{"name": "lookup", "description": "Looks a word up.",
                       "input_schema": FUNCTION["parameters"]}]),
    "metadata": st.fixed_dictionaries({"user_id": TEXT}),
    "stop_sequences": st.lists(TEXT, max_size=2),
})
COUNT_TOKENS = st.fixed_dictionaries({"model": MODEL, "messages": ANTHROPIC_MESSAGES},
                                     optional={"system": TEXT})
INPUT = TEXT | st.lists(st.fixed_dictionaries({
    "role": st.sampled_from(["user", "user", "assistant", "developer"]),
    "content": TEXT | st.lists(st.fixed_dictionaries({"type": st.just("input_text"),
                                                      "text": TEXT}), min_size=1, max_size=2),
}), min_size=1, max_size=3)
RESPONSES = st.fixed_dictionaries({"model": MODEL, "input": INPUT}, optional={
    "instructions": TEXT, "stream": st.booleans(), "max_output_tokens": st.integers(16, 64),
    "temperature": st.floats(0, 2), "store": st.booleans(),
    "tools": st.just([{"type": "function", **FUNCTION}]),
    "previous_response_id": st.sampled_from(["resp_nothing_stored"]) | TEXT,
})
RESPONSES_INPUT = st.fixed_dictionaries({"model": MODEL, "input": INPUT},
                                        optional={"instructions": TEXT})
# path -> (the caller's protocol, the shape of its bodies)
ENDPOINTS: dict[str, tuple[str, st.SearchStrategy[dict[str, Any]]]] = {
    "/chat/completions": ("openai", CHAT), "/embeddings": ("openai", EMBEDDINGS),
    "/messages": ("anthropic", MESSAGES), "/messages/count_tokens": ("anthropic", COUNT_TOKENS),
    "/responses": ("responses", RESPONSES),
    "/responses/input_tokens": ("responses", RESPONSES_INPUT),
    "/responses/compact": ("responses", RESPONSES_INPUT),
}

# ---- and mutated -------------------------------------------------------------------------

ANY_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | TEXT,
    lambda inner: st.lists(inner, max_size=2) | st.dictionaries(TEXT, inner, max_size=2),
    max_leaves=5)
HUGE_INTS = st.sampled_from([2**63, 2**64, -(2**63) - 1, 10**30, 10**400, -1, 0])
MUTATIONS = ["drop", "retype", "huge int", "surrogate", "deep", "long string",
             "over the limit", "unknown field", "NaN", "duplicate model", "truncated",
             "bad UTF-8", "not an object"]
DEEP = "\x00deep\x00"  # stands for a nesting too deep to serialise: written into the bytes


def places(value: object, path: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    """The path of every value in a JSON document, the root first."""
    found = [path]
    items = (value.items() if isinstance(value, dict)
             else enumerate(value) if isinstance(value, list) else ())
    for key, inner in items:
        found += places(inner, (*path, key))
    return found


def changed(document: Any, path: tuple[object, ...], new: object, *, drop: bool = False) -> Any:
    if not path:
        return new
    copy = dict(document) if isinstance(document, dict) else list(document)
    head, rest = path[0], path[1:]
    if rest:
        copy[head] = changed(copy[head], rest, new, drop=drop)  # type: ignore[index]
    elif drop:
        del copy[head]  # type: ignore[arg-type]
    else:
        copy[head] = new  # type: ignore[index]
    return copy


def mutate(draw: st.DrawFn, document: Any, kind: str) -> Any:
    """``document`` with one change of ``kind`` made to it (those of its bytes: later)."""
    path = draw(st.sampled_from(places(document)[1:] or [()]))
    value: object = {
        "retype": ANY_JSON, "huge int": HUGE_INTS, "NaN": st.just(float("nan")),
        "deep": st.just(DEEP),
        "surrogate": st.sampled_from(["\ud800", "a\udfffb", "\udbff\udc00\udc00"]),
        "long string": st.just("x" * (BODY_LIMIT // 2)),
        "over the limit": st.just("x" * BODY_LIMIT),
    }.get(kind, st.none())
    if kind == "drop" and path:
        return changed(document, path, None, drop=True)
    if kind == "unknown field" and isinstance(document, dict):
        return {**document, draw(TEXT): draw(ANY_JSON)}
    if isinstance(value, st.SearchStrategy):
        return changed(document, path, draw(value))
    return document


def serialised(draw: st.DrawFn, document: Any, kinds: list[str]) -> bytes:
    data = json.dumps(document).encode()
    depth = draw(st.sampled_from([100, 1000, 20_000]))
    data = data.replace(json.dumps(DEEP).encode(), b"[" * depth + b"]" * depth)
    if "duplicate model" in kinds and data.startswith(b"{"):
        data = b'{"model": ' + json.dumps(draw(ANY_JSON)).encode() + b", " + data[1:]
    if "bad UTF-8" in kinds:
        cut = draw(st.integers(0, len(data)))
        data = data[:cut] + draw(st.sampled_from([b"\xff", b"\xc3", b"\xed\xa0\x80"])) + data[cut:]
    if "truncated" in kinds:
        data = data[:draw(st.integers(0, max(0, len(data) - 1)))]
    if "not an object" in kinds:
        data = json.dumps(draw(ANY_JSON.filter(lambda value: not isinstance(value, dict)))
                          ).encode()
    return data


FAULTS = [Fault(status=500), Fault(status=503), Fault(status=429, retry_after="0"),
          Fault(status=400), Fault(cut_after_chunks=1), Fault(malformed_frame=True),
          Fault(inband_error="the upstream failed mid-answer")]


@dataclasses.dataclass(frozen=True)
class Sent:
    path: str
    protocol: str
    body: bytes
    mutations: tuple[str, ...]
    fault: Fault | None


@st.composite
def sent(draw: st.DrawFn) -> Sent:
    path = draw(st.sampled_from(sorted(ENDPOINTS)))
    protocol, shape = ENDPOINTS[path]
    document = draw(shape)
    kinds = draw(st.lists(st.sampled_from(MUTATIONS), min_size=1, max_size=2)
                 | st.just([]))  # one third unchanged
    for kind in kinds:
        document = mutate(draw, document, kind)
    fault = draw(st.sampled_from([None] * 6 + FAULTS))
    return Sent(path, protocol, serialised(draw, document, kinds), tuple(kinds), fault)


# ---- what every answer must be ---------------------------------------------------------


def assert_error(protocol: str, payload: Any) -> None:
    """An error in the caller's protocol's shape."""
    if protocol == "anthropic":
        assert payload["type"] == "error", payload
        error = payload["error"]
        assert isinstance(error["type"], str) and error["type"], payload
    else:
        error = payload["error"]
        assert isinstance(error["type"], str | None), payload
        assert error.get("code") is None or isinstance(error["code"], str), payload
    assert isinstance(error["message"], str) and error["message"], payload


def assert_events(request: Sent, body: bytes) -> None:
    """Every event of a stream parses, its errors in the protocol's shape (the frames the
    upstream was told to break or to fail with are relayed as they came: a stream of the
    caller's own protocol passes through)."""
    protocol, fault = request.protocol, request.fault or Fault()
    for frame in body.decode("utf-8").split("\n\n"):
        data = "".join(line.removeprefix("data:").strip() for line in frame.split("\n")
                       if line.startswith("data:"))
        if not data or data == "[DONE]" or (fault.malformed_frame and data == "{not json"):
            continue
        payload = json.loads(data)
        if fault.inband_error and payload == {"error": fault.inband_error}:
            continue
        kind = payload.get("type")
        if (protocol, kind) == ("anthropic", "error") or (
                protocol == "openai" and "error" in payload):
            assert_error(protocol, payload)
        elif protocol == "responses" and kind == "error":
            assert isinstance(payload["message"], str) and payload["message"], payload
            assert isinstance(payload["sequence_number"], int), payload
        elif protocol == "openai":
            assert payload["object"] == "chat.completion.chunk", payload
        else:
            assert isinstance(kind, str), payload


SUCCESS: dict[str, Callable[[dict[str, Any]], bool]] = {
    "/chat/completions": lambda answer: answer["object"] == "chat.completion",
    "/embeddings": lambda answer: answer["object"] == "list",
    "/messages": lambda answer: answer["type"] == "message",
    "/messages/count_tokens": lambda answer: isinstance(answer["input_tokens"], int),
    "/responses": lambda answer: answer["object"] == "response",
    "/responses/input_tokens": lambda answer: isinstance(answer["input_tokens"], int),
    "/responses/compact": lambda answer: answer["object"] == "response.compaction",
}


def replaced_by_upstream(request: Sent, status: int, content_type: bytes, body: bytes) -> bool:
    """A whole 200 answer whose body the upstream replaced (``{not json``, or an error
    object with status 200): the gateway relays it as it came (exchange.complete_body reads
    it after, for the record), and translated into the caller's protocol such an error
    reads as an empty answer (a gap this fuzzer found, left to the translators)."""
    fault = request.fault
    if fault is None or not (fault.malformed_frame or fault.inband_error) or status != 200:
        return False
    if content_type.startswith(b"text/event-stream"):
        return False
    return body == b"{not json" or isinstance(json.loads(body), dict)


def assert_answer(request: Sent, status: int, headers: list[tuple[bytes, bytes]],
                  body: bytes) -> None:
    # An upstream's 500 is relayed as one, after the retries (a fault fails one attempt).
    fault = request.fault
    upstream_failed = fault is not None and status in (502, 503, 504, fault.status)
    assert status < 500 or upstream_failed, (status, body[:500])
    assert b"Traceback" not in body
    content_type = dict(headers).get(b"content-type", b"")
    if replaced_by_upstream(request, status, content_type, body):
        return
    if status >= 400:
        assert content_type.startswith(b"application/json"), content_type
        assert_error(request.protocol, json.loads(body))
    elif content_type.startswith(b"text/event-stream"):
        assert_events(request, body)
    else:
        assert SUCCESS[request.path](json.loads(body)), body[:500]


# ---- the engine, on a loop of the test's own, with a budget ---------------------------------


class Budgeted(Running):
    """Each call with a fresh key (no per-key limit piles up) of the budgeted subject."""

    async def with_fresh_key(self, generated: Generated) -> Generated:
        record, key = new_key_record(name="fuzz", subject_id=SUBJECT, now=time.time(),
                                     rate_limit_requests=10**6)
        await self.gateway.store.insert_key(record)
        headers = [(name, value.replace(KEY, key)) for name, value in generated.headers]
        return dataclasses.replace(generated, headers=headers)


async def released(engine: Running) -> None:
    """Until no budget reservation is held (a stream's settles as it closes)."""
    deadline = time.monotonic() + 5.0
    while reserved(engine.gateway):
        assert time.monotonic() < deadline, "a budget reservation was left behind"
        await asyncio.sleep(0.01)


@pytest.fixture(scope="module")
def fakes() -> Iterator[tuple[tuple[FakeUpstream, str], tuple[FakeUpstream, str]]]:
    with running_fake_upstream(FakeUpstream(usage_mode="anthropic")) as claude, \
            running_fake_upstream(FakeUpstream(usage_mode="openai")) as gpt:
        yield claude, gpt


@pytest.fixture(scope="module")
def engine(fakes: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Budgeted]:
    (_, claude_url), (_, gpt_url) = fakes
    directory: Path = tmp_path_factory.mktemp("protocol-fuzz")
    # Faults one example injects must not cool a target down for the next ones.
    routes = {**agent_routes(claude_url, gpt_url), "routing": {"health": {
        "failures_to_degraded": 10**6, "failures_to_down": 10**6, "cooldown_seconds": 0.001,
        "max_cooldown_seconds": 0.001}}}
    settings = make_settings(directory, gpt_url, routes=routes,
                             redis_url=None, database_url=f"sqlite:///{directory / 'g.db'}",
                             request_body_limit_bytes=BODY_LIMIT)
    set_budget(settings.database_url, BudgetScope.SUBJECT, SUBJECT, daily_tokens=10**12)
    loop = asyncio.new_event_loop()
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(os.environ, "AGENT_TEST_KEY", PROVIDER_KEY)
        gateway = build_gateway(settings, key_cache_seconds=0)
        loop.run_until_complete(gateway.start())
        yield Budgeted(loop, gateway)
        loop.run_until_complete(gateway.close())
    loop.close()


@pytest.fixture(scope="module")
def app(engine: Budgeted) -> object:
    return create_app(engine.gateway.settings, gateway=engine.gateway)


HI = [{"role": "user", "content": "hi"}]


@fuzz_settings(300)
@given(request=sent())
# Found by this fuzzer: an encoded surrogate (no UTF-8) passed request_body.decode, which
# read bytes with surrogatepass, and went to the provider (the fake failed on it: a 500).
@example(request=Sent("/messages", "anthropic", b'{"model": "claude", "max_tokens": 1, '
                      b'"\xed\xa0\x80x": 1, "messages": [{"role": "user", "content": "a"}]}',
                      ("bad UTF-8",), None))
# Found by this fuzzer: a token count for a target of the other protocol was translated
# into a whole completion (answered as one, made outside the budget).
@example(request=Sent("/messages/count_tokens", "anthropic",
                      json.dumps({"model": "gpt", "messages": HI}).encode(), (), None))
@example(request=Sent("/responses/input_tokens", "responses",
                      json.dumps({"model": "claude", "input": "hi"}).encode(), (), None))
def test_every_endpoint_answers_any_body_in_its_protocol(
        engine: Budgeted, app: object, fakes: Any, request: Sent) -> None:
    note(f"{request.path} {request.mutations} fault={request.fault}\n{request.body[:2000]!r}")
    event(request.path)
    event(f"mutations: {len(request.mutations)}")
    for fake, _ in fakes:
        fake.reset()
        if request.fault is not None:
            fake.push_fault(dataclasses.replace(request.fault))
    headers = [("authorization", f"Bearer {KEY}"), ("content-type", "application/json")]
    if request.protocol == "anthropic":
        headers.append(("anthropic-version", "2023-06-01"))
    with nothing_logged():
        status, answer_headers, body = engine.run(  # type: ignore[misc]
            call_app(engine, app, Generated("POST", request.path, headers, request.body)))
        engine.run(released(engine))
    event(f"status {status}" + (" unmutated" if not request.mutations else ""))
    assert_answer(request, status, answer_headers, body)


def test_what_no_translator_writes_never_reaches_a_target_of_another_protocol(
        engine: Budgeted, app: object, fakes: Any) -> None:
    """A token count, a compaction (found by the fuzzer above): refused, 400 in the
    caller's shape, and no completion is made upstream (it was one, billed by the provider,
    and for the two token counts outside the budget)."""
    for path, model in (("/messages/count_tokens", "gpt"), ("/responses/input_tokens", "claude"),
                        ("/responses/compact", "claude")):
        for fake, _ in fakes:
            fake.reset()
        body = {"model": model, **({"messages": HI} if path.startswith("/messages")
                                   else {"input": "hi"})}
        status, _, answer = engine.run(call_app(engine, app, Generated(  # type: ignore[misc]
            "POST", path, [("authorization", f"Bearer {KEY}")], json.dumps(body).encode())))
        payload = json.loads(answer)
        error = payload["error"]
        assert (status, error["type"]) == (400, "invalid_request_error"), payload
        assert "no translation" in error["message"]
        assert [fake.requests for fake, _ in fakes] == [[], []]


def test_a_compaction_under_a_budget_carries_no_output_cap(
        engine: Budgeted, app: object, fakes: Any) -> None:
    """OpenAI's /responses/compact takes no max_output_tokens (it refuses the unknown
    parameter): the budget's cap is not written into it (found by the fuzzer above: every
    compaction under a budget failed)."""
    (_, _), (gpt, _) = fakes
    gpt.reset()
    status, _, answer = engine.run(call_app(engine, app, Generated(  # type: ignore[misc]
        "POST", "/responses/compact", [("authorization", f"Bearer {KEY}")],
        json.dumps({"model": "gpt", "input": "hi"}).encode())))
    assert (status, json.loads(answer)["object"]) == (200, "response.compaction"), answer
    [sent] = gpt.requests
    assert "max_output_tokens" not in json.loads(sent.body)
    engine.run(released(engine))


def test_an_encoded_surrogate_is_refused_before_anything_is_sent(
        engine: Budgeted, app: object, fakes: Any) -> None:
    """b"\\xed\\xa0\\x80" is no UTF-8 (it encodes a lone surrogate): the body is no JSON
    text, refused, and nothing reaches the provider (found by the fuzzer above)."""
    for fake, _ in fakes:
        fake.reset()
    body = b'{"model": "gpt", "messages": [{"role": "user", "content": "a\xed\xa0\x80b"}]}'
    status, _, answer = engine.run(call_app(engine, app, Generated(  # type: ignore[misc]
        "POST", "/chat/completions", [("authorization", f"Bearer {KEY}")], body)))
    assert (status, json.loads(answer)["error"]["code"]) == (400, "invalid_json")
    assert [fake.requests for fake, _ in fakes] == [[], []]
