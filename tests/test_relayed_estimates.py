"""An estimate (a cut stream, a provider that reports nothing) counts what was relayed:
a streamed tool call's arguments and a model's reasoning, not only its visible text."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from llm_gateway.observe import ResponseFacts, read_openai
from llm_gateway.protocols.responses import read_response
from llm_gateway.providers import profile_named
from llm_gateway.testing.fake_upstream import FakeUpstream, Fault
from tests.routing_support import CHAT, provider, routed_gateway


def routes(url: str) -> dict[str, Any]:
    return {"providers": {"p": provider(url)},
            "models": {"chat-fast": {"targets": [{"provider": "p", "model": "llama-3.3-70b"}]}}}


def test_a_cut_stream_of_a_tool_call_is_metered_by_its_arguments(
        tmp_path: Path, fake: FakeUpstream, fake_url: str, monkeypatch: Any) -> None:
    tools = [{"type": "function", "function": {
        "name": "get_weather", "parameters": {"type": "object", "properties": {
            "city": {"type": "string"}}}}}]
    with routed_gateway(tmp_path, routes(fake_url), monkeypatch) as gw:
        whole = gw.chat(gw.key(), {**CHAT, "stream": True, "tools": tools},
                        **{"x-fake-tool-call": "get_weather"})
        frames = [json.loads(line.removeprefix("data: ")) for line in whole.text.split("\n\n")
                  if line.startswith("data: {")]
        arguments = "".join(call["function"].get("arguments") or ""
                            for frame in frames for choice in frame["choices"]
                            for call in choice["delta"].get("tool_calls") or ())
        assert arguments  # the fake streams the call's arguments
        gw.finished.wait_for(1)
        fake.push_fault(Fault(cut_after_chunks=50))  # past every chunk: no usage, no [DONE]
        gw.chat(gw.key(), {**CHAT, "stream": True, "tools": tools},
                **{"x-fake-tool-call": "get_weather"})
        [_, cut] = gw.finished.wait_for(2)
        assert cut.tokens_estimated and cut.error_code == "upstream_stream_interrupted"
        assert cut.completion_tokens >= len(arguments) // 4 > 0


def test_chat_reasoning_and_tool_call_fragments_count_as_relayed_output() -> None:
    facts = ResponseFacts(profile_named("openai"))
    for delta in ({"reasoning_content": "abcd"}, {"reasoning": "efgh"},
                  {"tool_calls": [{"index": 0, "function": {"name": "f", "arguments": ""}}]},
                  {"tool_calls": [{"index": 0, "function": {"arguments": '{"city":'}}]},
                  {"tool_calls": [{"index": 0, "function": {"arguments": '"Paris"}'}}]},
                  {"content": "ok"}, {"function_call": {"arguments": "xy"}}):
        read_openai(facts, {"choices": [{"index": 0, "delta": delta}]})
    assert facts.text_chars == 4 + 4 + 1 + 8 + 8 + 2 + 2


def test_a_responses_answer_counts_its_reasoning_summary() -> None:
    facts = ResponseFacts(profile_named("openai"), read_response)
    read_response(facts, {"object": "response", "id": "resp_1", "status": "incomplete",
                          "output": [
                              {"type": "reasoning", "summary": [
                                  {"type": "summary_text", "text": "thinking..."}]},
                              {"type": "function_call", "name": "f", "arguments": '{"a":1}'},
                          ]})
    assert facts.text_chars == len("thinking...") + len('{"a":1}')
