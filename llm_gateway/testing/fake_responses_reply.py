"""The reply a ``POST /responses`` gets, planned whole before anything is sent, so its JSON
answer, its stream and its stored copy agree: the output items (a ``reasoning`` item, then a
``function_call`` / ``custom_tool_call`` or a ``message``), each with the stream events that
build it, what the cap leaves of them, the usage, and the response object that carries them
(OpenAI echoes the request's settings in it)."""

import json
from dataclasses import dataclass

from llm_gateway.testing.fake_agent_reply import FittedReply, fit_reply
from llm_gateway.testing.fake_content import (
    FAKE_CUSTOM_TOOL_INPUT,
    FAKE_THINKING_TEXT,
    fake_reply_chunk,
    fake_reply_text,
    fake_signature,
    fake_tool_arguments,
    openai_id,
)
from llm_gateway.testing.fake_responses_request import callable_tools

Event = tuple[str, dict[str, object], bool]  # (type, payload, whether it is a content chunk)


@dataclass
class Item:
    added: dict[str, object]  # as response.output_item.added carries it
    final: dict[str, object]  # as the response's output holds it
    events: list[Event]  # the events between added and done, without their index and number


@dataclass
class Plan:
    items: list[Item]
    fitted: FittedReply

    @property
    def incomplete(self) -> bool:
        return self.fitted.cut

    @property
    def chunk_count(self) -> int:
        return sum(chunk for item in self.items for _, _, chunk in item.events)


def _reasoning_item(request: dict[str, object], model: str, output_index: int) -> Item:
    reasoning = request.get("reasoning")
    summary = isinstance(reasoning, dict) and reasoning.get("summary") in (
        "auto", "concise", "detailed")
    include = request.get("include")
    item_id = openai_id("rs_")
    final: dict[str, object] = {"id": item_id, "type": "reasoning", "summary": []}
    if isinstance(include, list) and "reasoning.encrypted_content" in include:
        final["encrypted_content"] = fake_signature(model, FAKE_THINKING_TEXT)
    events: list[Event] = []
    if summary:
        part = {"type": "summary_text", "text": FAKE_THINKING_TEXT}
        where = {"item_id": item_id, "output_index": output_index, "summary_index": 0}
        events = [
            ("response.reasoning_summary_part.added",
             {**where, "part": {"type": "summary_text", "text": ""}}, False),
            ("response.reasoning_summary_text.delta", {**where, "delta": FAKE_THINKING_TEXT},
             True),
            ("response.reasoning_summary_text.done", {**where, "text": FAKE_THINKING_TEXT},
             False),
            ("response.reasoning_summary_part.done", {**where, "part": part}, False),
        ]
        final["summary"] = [part]
    return Item({**final, "summary": []}, final, events)


def _custom_tool_item(name: str, output_index: int) -> Item:
    item_id = openai_id("ctc_")
    final: dict[str, object] = {"id": item_id, "type": "custom_tool_call",
                                "status": "completed", "call_id": openai_id("call_"),
                                "name": name, "input": FAKE_CUSTOM_TOOL_INPUT}
    where = {"item_id": item_id, "output_index": output_index}
    events: list[Event] = [
        ("response.custom_tool_call_input.delta", {**where, "delta": FAKE_CUSTOM_TOOL_INPUT},
         True),
        ("response.custom_tool_call_input.done", {**where, "input": FAKE_CUSTOM_TOOL_INPUT},
         False),
    ]
    return Item({**final, "status": "in_progress", "input": ""}, final, events)


def _tool_item(request: dict[str, object], name: str, output_index: int) -> Item:
    if callable_tools(request)[name] == "custom":
        return _custom_tool_item(name, output_index)
    tools = request.get("tools")
    definition = next(tool for tool in (tools if isinstance(tools, list) else [])
                      if isinstance(tool, dict) and tool.get("name") == name)
    arguments = json.dumps(fake_tool_arguments(definition.get("parameters")))
    item_id = openai_id("fc_")
    final = {"id": item_id, "type": "function_call", "status": "completed",
             "arguments": arguments, "call_id": openai_id("call_"), "name": name}
    where = {"item_id": item_id, "output_index": output_index}
    middle = len(arguments) // 2
    events: list[Event] = [
        ("response.function_call_arguments.delta", {**where, "delta": piece}, True)
        for piece in (arguments[:middle], arguments[middle:]) if piece]
    events.append(("response.function_call_arguments.done",
                   {**where, "name": name, "arguments": arguments}, False))
    return Item({**final, "status": "in_progress", "arguments": ""}, final, events)


def _message_item(chunks: int, complete: bool, output_index: int) -> Item:
    item_id = openai_id("msg_")
    text = fake_reply_text(chunks)
    part = {"type": "output_text", "text": text, "annotations": [], "logprobs": []}
    final: dict[str, object] = {"id": item_id, "type": "message",
                                "status": "completed" if complete else "incomplete",
                                "role": "assistant", "content": [part]}
    where = {"item_id": item_id, "output_index": output_index, "content_index": 0}
    events: list[Event] = [("response.content_part.added",
                            {**where, "part": {**part, "text": ""}}, False)]
    events += [("response.output_text.delta",
                {**where, "delta": fake_reply_chunk(index), "logprobs": []}, True)
               for index in range(chunks)]
    events += [("response.output_text.done", {**where, "text": text, "logprobs": []}, False),
               ("response.content_part.done", {**where, "part": part}, False)]
    return Item({**final, "status": "in_progress", "content": []}, final, events)


def plan_output(request: dict[str, object], model: str, chunk_count: int,
                tool_name: str | None) -> Plan:
    """The output items, as much of them as ``max_output_tokens`` leaves (no cap: all)."""
    cap = request.get("max_output_tokens")
    reasoning = request.get("reasoning")
    fitted = fit_reply(cap if isinstance(cap, int) else 1 << 62,
                       thinks=isinstance(reasoning, dict) and reasoning.get("effort") != "none",
                       calls_tool=tool_name is not None, chunk_count=chunk_count)
    items: list[Item] = []
    if fitted.thinks:
        items.append(_reasoning_item(request, model, len(items)))
    if fitted.calls_tool and tool_name is not None:
        items.append(_tool_item(request, tool_name, len(items)))
    elif fitted.chunks > 0 or not fitted.cut:
        # A reply of no chunks that the cap did not cut is still a message, an empty one.
        items.append(_message_item(fitted.chunks, not fitted.cut, len(items)))
    return Plan(items, fitted)


def usage(input_tokens: int, cached: int | None, output_tokens: int,
          reasoning_tokens: int) -> dict[str, object]:
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": min(cached or 0, input_tokens),
                                 "cache_write_tokens": 0},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
        "total_tokens": input_tokens + output_tokens,
    }


def response_object(request: dict[str, object], response_id: str, created_at: int,
                    store: bool) -> dict[str, object]:
    """The response's fields, as OpenAI echoes the request's settings, before it is done."""
    reasoning = request.get("reasoning")
    text = request.get("text") if isinstance(request.get("text"), dict) else {}
    assert isinstance(text, dict)
    return {
        "id": response_id,
        "object": "response",
        "created_at": created_at,
        "status": "in_progress",
        "background": request.get("background") is True,
        "completed_at": None,
        "error": None,
        "incomplete_details": None,
        "instructions": request.get("instructions"),
        "max_output_tokens": request.get("max_output_tokens"),
        "max_tool_calls": request.get("max_tool_calls"),
        "model": request["model"],
        "output": [],
        "parallel_tool_calls": request.get("parallel_tool_calls", True),
        "previous_response_id": request.get("previous_response_id"),
        "prompt_cache_key": request.get("prompt_cache_key"),
        "reasoning": {
            "effort": reasoning.get("effort") if isinstance(reasoning, dict) else None,
            "summary": reasoning.get("summary") if isinstance(reasoning, dict) else None,
        },
        "safety_identifier": request.get("safety_identifier"),
        "service_tier": "default",
        "store": store,
        "temperature": 1.0,
        "text": {"format": text.get("format", {"type": "text"}),
                 "verbosity": text.get("verbosity", "medium")},
        "tool_choice": request.get("tool_choice", "auto"),
        "tools": request.get("tools") or [],
        "top_logprobs": 0,
        "top_p": 1.0,
        "truncation": request.get("truncation") or "disabled",
        "usage": None,
        "user": request.get("user"),
        "metadata": request.get("metadata") or {},
    }


def finished(start: dict[str, object], plan: Plan, usage: dict[str, object],
             failure: str | None) -> dict[str, object]:
    """The response once done: ``completed``, ``incomplete`` when the cap cut it, or ``failed``
    (with no output) when a fault's in-band error broke it off."""
    if failure is not None:
        return {**start, "status": "failed", "output": [], "usage": None,
                "error": {"code": "server_error", "message": failure}}
    return {**start, "status": "incomplete" if plan.incomplete else "completed",
            "completed_at": start["created_at"],
            "incomplete_details": {"reason": "max_output_tokens"} if plan.incomplete else None,
            "output": [item.final for item in plan.items], "usage": usage}
