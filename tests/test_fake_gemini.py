"""The fake upstream's gemini mode, over HTTP (httpx) and through Google's own SDK
(google-genai), as the real API answers: generateContent and its streams, function calls,
thoughts, cached tokens, strict fields, Google's errors and faults, embeddings."""

from __future__ import annotations

import json
from collections.abc import Iterator

import httpx
import pytest

from llm_gateway.testing.fake_upstream import (
    DEFAULT_FAKE_API_KEY,
    THINKING_TOKENS,
    WORDS_PER_CHUNK,
    FakeUpstream,
    Fault,
    fake_reply_text,
    running_fake_upstream,
)

# The fake upstream alone, no store: the second pass (Postgres and Redis) adds nothing.
pytestmark = pytest.mark.slow_once

genai = pytest.importorskip("google.genai")
types = genai.types

KEY = DEFAULT_FAKE_API_KEY
MODEL = "gemini-2.5-flash"
HELLO = {"contents": [{"role": "user", "parts": [{"text": "Say hello to me"}]}]}
WEATHER = {"functionDeclarations": [{
    "name": "get_weather", "description": "The weather in a city",
    "parametersJsonSchema": {"type": "object", "properties": {"city": {"type": "string"}},
                             "required": ["city"]}}]}


@pytest.fixture(scope="module")
def _server() -> Iterator[tuple[FakeUpstream, str]]:
    with running_fake_upstream(FakeUpstream(usage_mode="gemini", chunk_count=3)) as served:
        yield served


@pytest.fixture
def gemini(_server: tuple[FakeUpstream, str]) -> tuple[FakeUpstream, str]:
    _server[0].reset()
    return _server


def post(url: str, method: str, body: object, **headers: str) -> httpx.Response:
    sent = {"x-goog-api-key": KEY, **headers}
    query = "?alt=sse" if method == "streamGenerateContent" else ""
    return httpx.post(f"{url}/models/{MODEL}:{method}{query}", json=body, headers=sent)


def sse(response: httpx.Response) -> list[dict]:
    return [json.loads(frame.removeprefix("data: "))
            for frame in response.text.split("\n\n") if frame]


def client(url: str, key: str = KEY) -> genai.Client:
    base = url.removesuffix("/v1beta")
    return genai.Client(api_key=key, http_options=types.HttpOptions(
        base_url=base, api_version="v1beta", retry_options=types.HttpRetryOptions(attempts=1)))


def test_a_json_answer_with_usage(gemini) -> None:
    _, url = gemini
    answer = post(url, "generateContent", HELLO).json()
    assert answer["candidates"][0]["content"] == {"parts": [{"text": fake_reply_text(3)}],
                                                  "role": "model"}
    assert answer["candidates"][0]["finishReason"] == "STOP"
    assert answer["usageMetadata"]["promptTokenCount"] == 4
    assert answer["usageMetadata"]["candidatesTokenCount"] == 3 * WORDS_PER_CHUNK
    assert answer["modelVersion"] == MODEL and answer["responseId"]


def test_the_stream_is_whole_chunks_with_the_usage_so_far(gemini) -> None:
    _, url = gemini
    response = post(url, "streamGenerateContent", HELLO)
    assert response.headers["content-type"].startswith("text/event-stream")
    chunks = sse(response)
    assert "".join(chunk["candidates"][0]["content"]["parts"][0]["text"]
                   for chunk in chunks) == fake_reply_text(3)
    assert [chunk["usageMetadata"]["candidatesTokenCount"] for chunk in chunks] == [8, 16, 24]
    assert [chunk["candidates"][0].get("finishReason") for chunk in chunks] == [
        None, None, "STOP"]
    assert len({chunk["responseId"] for chunk in chunks}) == 1
    as_array = httpx.post(f"{url}/models/{MODEL}:streamGenerateContent", json=HELLO,
                          headers={"x-goog-api-key": KEY})
    assert [chunk["usageMetadata"] for chunk in as_array.json()] == [
        chunk["usageMetadata"] for chunk in chunks]


def test_a_function_call_with_thoughts_and_the_signature_on_it(gemini) -> None:
    _, url = gemini
    body = {**HELLO, "tools": [WEATHER], "generationConfig": {
        "thinkingConfig": {"thinkingBudget": 1024, "includeThoughts": True}}}
    answer = post(url, "generateContent", body, **{"x-fake-tool-call": "get_weather"}).json()
    thought, call = answer["candidates"][0]["content"]["parts"]
    assert thought["thought"] is True and "thoughtSignature" not in thought
    assert call["functionCall"] == {"name": "get_weather", "args": {"city": "fake"}}
    assert call["thoughtSignature"]
    assert answer["usageMetadata"]["thoughtsTokenCount"] == THINKING_TOKENS
    # the turn that answers the call gets text
    body["contents"] = [*body["contents"], {"role": "model", "parts": [call]}, {
        "role": "user", "parts": [{"functionResponse": {"name": "get_weather",
                                                        "response": {"output": "sunny"}}}]}]
    answer = post(url, "generateContent", body, **{"x-fake-tool-call": "get_weather"}).json()
    assert "functionCall" not in answer["candidates"][0]["content"]["parts"][-1]


@pytest.mark.parametrize(("mode", "calls"), [("ANY", True), ("NONE", False), ("AUTO", False)])
def test_the_calling_mode_forces_or_forbids_a_call(gemini, mode: str, calls: bool) -> None:
    _, url = gemini
    body = {**HELLO, "tools": [WEATHER],
            "toolConfig": {"functionCallingConfig": {"mode": mode}}}
    parts = post(url, "generateContent", body).json()["candidates"][0]["content"]["parts"]
    assert ("functionCall" in parts[0]) is calls


def test_max_output_tokens_cuts_the_reply(gemini) -> None:
    _, url = gemini
    body = {**HELLO, "generationConfig": {"maxOutputTokens": 10}}
    answer = post(url, "generateContent", body).json()
    assert answer["candidates"][0]["finishReason"] == "MAX_TOKENS"
    assert answer["usageMetadata"]["candidatesTokenCount"] == WORDS_PER_CHUNK


def test_cached_tokens_are_part_of_the_prompt(gemini) -> None:
    _, url = gemini
    usage = post(url, "generateContent", HELLO,
                 **{"x-fake-cache-read-tokens": "3"}).json()["usageMetadata"]
    assert (usage["promptTokenCount"], usage["cachedContentTokenCount"]) == (4, 3)


@pytest.mark.parametrize(("body", "message"), [
    ({**HELLO, "foo": 1}, 'Unknown name "foo": Cannot find field.'),
    ({**HELLO, "generationConfig": {"max_tokens": 5}},
     """Unknown name "max_tokens" at 'generation_config': Cannot find field."""),
    ({"contents": []}, "contents is not specified"),
    ({"contents": [{"role": "assistant", "parts": [{"text": "x"}]}]}, "valid role"),
])
def test_a_bad_request_is_googles_400(gemini, body: dict, message: str) -> None:
    _, url = gemini
    response = post(url, "generateContent", body)
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["status"] == "INVALID_ARGUMENT" and message in error["message"]


def test_snake_case_fields_are_taken_as_proto_json_takes_them(gemini) -> None:
    _, url = gemini
    body = {**HELLO, "generation_config": {"max_output_tokens": 10}}
    assert post(url, "generateContent", body).json()["candidates"][0][
        "finishReason"] == "MAX_TOKENS"


@pytest.mark.parametrize(("headers", "status", "name"), [
    ({}, 403, "PERMISSION_DENIED"),
    ({"x-goog-api-key": "wrong"}, 400, "INVALID_ARGUMENT"),
    ({"authorization": "Bearer ya29.token"}, 401, "UNAUTHENTICATED"),
])
def test_the_key_is_checked_as_google_checks_it(gemini, headers, status, name) -> None:
    _, url = gemini
    response = httpx.post(f"{url}/models/{MODEL}:generateContent", json=HELLO, headers=headers)
    assert (response.status_code, response.json()["error"]["status"]) == (status, name)
    assert httpx.post(f"{url}/models/{MODEL}:generateContent?key={KEY}",
                      json=HELLO).status_code == 200


@pytest.mark.parametrize(("status", "name"), [(429, "RESOURCE_EXHAUSTED"),
                                              (503, "UNAVAILABLE"), (400, "INVALID_ARGUMENT")])
def test_faults_take_googles_shape_and_the_status_the_relay_judges(gemini, status, name) -> None:
    """429 and 503 are HTTP statuses, so the relay's rules (429: back-pressure, 5xx: the next
    target) apply to Gemini as they are; the body is Google's error object."""
    fake, url = gemini
    fake.push_fault(Fault(status=status, message="injected"))
    response = post(url, "generateContent", HELLO)
    assert response.status_code == status
    assert response.json() == {"error": {"code": status, "message": "injected", "status": name}}


def test_an_inband_failure_is_an_error_chunk(gemini) -> None:
    fake, url = gemini
    fake.push_fault(Fault(inband_error="overloaded"))
    chunks = sse(post(url, "streamGenerateContent", HELLO))
    assert chunks == [{"error": {"code": 503, "message": "overloaded", "status": "UNAVAILABLE"}}]


def test_embeddings_and_tokens(gemini) -> None:
    _, url = gemini
    one = post(url, "embedContent", {"content": {"parts": [{"text": "hi"}]},
                                     "outputDimensionality": 4}).json()
    assert len(one["embedding"]["values"]) == 4
    batch = post(url, "batchEmbedContents", {"requests": [
        {"model": f"models/{MODEL}", "content": {"parts": [{"text": "hi"}]},
         "outputDimensionality": 4}]}).json()
    assert batch["embeddings"][0] == one["embedding"]
    assert post(url, "countTokens", HELLO).json()["totalTokens"] == 4


def test_the_sdk_generates_streams_calls_and_embeds(gemini) -> None:
    _, url = gemini
    sdk = client(url)
    answer = sdk.models.generate_content(model=MODEL, contents="Say hello to me")
    assert answer.text == fake_reply_text(3)
    assert answer.usage_metadata.prompt_token_count == 4
    streamed = "".join(chunk.text or "" for chunk in sdk.models.generate_content_stream(
        model=MODEL, contents="Say hello to me"))
    assert streamed == fake_reply_text(3)
    weather = types.FunctionDeclaration(
        name="get_weather", description="The weather",
        parameters_json_schema=WEATHER["functionDeclarations"][0]["parametersJsonSchema"])
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[weather])],
        tool_config=types.ToolConfig(function_calling_config=types.FunctionCallingConfig(
            mode="ANY")),
        thinking_config=types.ThinkingConfig(thinking_budget=512, include_thoughts=True),
        system_instruction="Be brief.")
    called = sdk.models.generate_content(model=MODEL, contents="Weather?", config=config)
    assert called.function_calls[0].name == "get_weather"
    assert called.usage_metadata.thoughts_token_count == THINKING_TOKENS
    embedded = sdk.models.embed_content(model="gemini-embedding-001", contents=["a", "b"])
    assert len(embedded.embeddings) == 2
    wrong = client(url, "wrong")  # held: a collected Client closes its connections
    with pytest.raises(genai.errors.ClientError) as refused:
        wrong.models.generate_content(model=MODEL, contents="x")
    assert refused.value.code == 400 and refused.value.status == "INVALID_ARGUMENT"
