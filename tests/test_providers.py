"""Each provider translator, fed recorded responses (as h11's tests feed bytes): usage and
cost, errors in OpenAI's shape, errors inside a 200."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llm_gateway.observe import ResponseFacts, StreamObserver
from llm_gateway.providers import OpenAIProfile, Profile, Usage, VeniceProfile, profile_named

RECORDED = Path(__file__).parent / "recorded"


def recorded(name: str) -> bytes:
    return (RECORDED / name).read_bytes()


def facts_of(profile: Profile, name: str) -> ResponseFacts:
    facts = ResponseFacts(profile)
    facts.observe(json.loads(recorded(name)))
    return facts


def streamed(profile: Profile, name: str, split: int) -> StreamObserver:
    """The recorded stream fed in pieces of ``split`` bytes."""
    data = recorded(name)
    observer = StreamObserver(profile)
    for start in range(0, len(data), split):
        observer.feed(data[start:start + split], float(start))
    observer.close()
    return observer


def test_profiles_are_found_by_name() -> None:
    assert isinstance(profile_named("venice"), VeniceProfile)
    assert isinstance(profile_named("openai"), OpenAIProfile)
    with pytest.raises(KeyError, match="known: openai, venice"):
        profile_named("bedrock")


def test_venice_json_usage_carries_its_cost() -> None:
    facts = facts_of(VeniceProfile(), "venice_chat_completion.json")
    assert facts.usage == Usage(12, 9, 21, cost_usd=0.0000336, cost_diem=0.0000243)
    assert (facts.response_id, facts.model, facts.finish_reasons) == (
        "chatcmpl-7f3a0e5b1c2d4e6f", "llama-3.3-70b", ["stop"])
    assert facts.error is None


def test_openai_json_usage_has_no_cost() -> None:
    facts = facts_of(OpenAIProfile(), "openai_chat_completion.json")
    assert facts.usage == Usage(9, 2, 11)
    assert facts.model == "gpt-4o-mini-2024-07-18"


def test_input_and_output_tokens_are_prompt_and_completion_tokens() -> None:
    facts = facts_of(OpenAIProfile(), "vllm_usage_input_output.json")
    assert facts.usage == Usage(30, 7, 37)


@pytest.mark.parametrize(("profile", "usage", "cached"), [
    # OpenAI's chat completions (and Venice's: the same field).
    ("openai", {"prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
                "prompt_tokens_details": {"cached_tokens": 1920, "audio_tokens": 0}}, 1920),
    ("venice", {"prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
                "prompt_tokens_details": {"cached_tokens": 1920,
                                          "cache_creation_input_tokens": 64}}, 1920),
    # The Responses API's naming.
    ("openai", {"input_tokens": 2006, "output_tokens": 300,
                "input_tokens_details": {"cached_tokens": 1024}}, 1024),
    # DeepSeek's, through the generic profile; OpenAI's profile does not guess at it.
    ("generic", {"prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
                 "prompt_cache_hit_tokens": 1536, "prompt_cache_miss_tokens": 470}, 1536),
    ("openai", {"prompt_tokens": 2006, "completion_tokens": 300,
                "prompt_cache_hit_tokens": 1536}, 0),
    # Garbage counts as nothing, and never more cached tokens than the prompt has.
    ("openai", {"prompt_tokens": 10, "prompt_tokens_details": None}, 0),
    ("openai", {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": -5}}, 0),
    ("openai", {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": "9"}}, 0),
    ("openai", {"prompt_tokens": 10, "prompt_tokens_details": {"cached_tokens": 99}}, 10),
    ("generic", {"prompt_tokens": 10, "prompt_cache_hit_tokens": 99}, 10),
])
def test_cached_prompt_tokens_are_read(profile: str, usage: dict, cached: int) -> None:
    read = profile_named(profile).usage({"usage": usage})
    assert read is not None and read.cache_read_tokens == cached


@pytest.mark.parametrize("split", [1, 7, 64, 100_000])
def test_venice_stream_usage_at_every_split(split: int) -> None:
    observer = streamed(VeniceProfile(), "venice_stream.sse", split)
    assert observer.usage == Usage(8, 2, 10, cost_usd=0.0000084, cost_diem=0.000006)
    assert (observer.done, observer.finish_reasons, observer.malformed_count) == (
        True, ["stop"], 0)


@pytest.mark.parametrize("split", [1, 13, 100_000])
def test_openai_stream_usage_chunk_at_every_split(split: int) -> None:
    observer = streamed(OpenAIProfile(), "openai_stream_with_usage.sse", split)
    # "usage": null on the content chunks is no usage; the last chunk's counts.
    assert observer.usage == Usage(8, 1, 9)
    assert observer.response_id == "chatcmpl-CVa8"


def test_openai_errors_pass_unchanged() -> None:
    body = recorded("openai_error_401.json")
    assert OpenAIProfile().error_body(body, 401) == body
    assert VeniceProfile().error_body(body, 401) == body


@pytest.mark.parametrize(("name", "status", "message", "type_"), [
    ("venice_error_401.json", 401, "Authentication failed", "authentication_error"),
    ("venice_error_400_validation.json", 400, "Invalid request parameters",
     "invalid_request_error"),
])
def test_venice_errors_get_openai_shape_with_the_message_verbatim(
    name: str, status: int, message: str, type_: str,
) -> None:
    error = json.loads(VeniceProfile().error_body(recorded(name), status))["error"]
    assert error == {"message": message, "type": type_, "code": None}


@pytest.mark.parametrize(("body", "status", "message", "type_"), [
    (b"<html><body>502 Bad Gateway</body></html>", 502,
     "<html><body>502 Bad Gateway</body></html>", "upstream_error"),
    (b"", 429, "upstream answered HTTP 429", "rate_limit_error"),
    (b'{"message": "model not found"}', 404, "model not found", "not_found_error"),
])
def test_anything_else_is_quoted(body: bytes, status: int, message: str, type_: str) -> None:
    for profile in (OpenAIProfile(), VeniceProfile()):
        error = json.loads(profile.error_body(body, status))["error"]
        assert (error["message"], error["type"]) == (message, type_)


def test_an_error_inside_a_200_is_found_in_either_shape() -> None:
    venice = VeniceProfile()
    assert venice.error_in({"error": "Model overloaded"}) == {
        "message": "Model overloaded", "type": None, "code": None}
    assert venice.error_in({"error": {"message": "Rate limit", "type": "requests",
                                      "code": 429}}) == {
        "message": "Rate limit", "type": "requests", "code": "429"}
    assert OpenAIProfile().error_in({"error": "a bare string is Venice's"}) is None
    assert venice.error_in({"error": None}) is None
