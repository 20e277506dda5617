"""The answer a ``POST /messages`` gets, planned whole before anything is sent, so its JSON
message and its event stream agree: the content blocks (``thinking``, then ``tool_use`` or
``text``) with the deltas that stream each, what ``max_tokens`` leaves of them and the
``stop_reason`` that says so, and the event stream itself (``message_start``, per block
``content_block_start`` / ``_delta`` / ``_stop``, a ``ping``, ``message_delta``,
``message_stop``)."""

import json
from dataclasses import dataclass, field

from llm_gateway.testing.fake_agent_reply import fit_reply
from llm_gateway.testing.fake_anthropic_request import CacheSplit, client_tools, thinking
from llm_gateway.testing.fake_content import (
    FAKE_THINKING_TEXT,
    fake_id,
    fake_reply_chunk,
    fake_reply_text,
    fake_signature,
    fake_tool_arguments,
)
from llm_gateway.testing.fake_exchange import Exchange
from llm_gateway.testing.fake_faults import Fault
from llm_gateway.testing.fake_stream import MALFORMED_SSE_FRAME, ChunkPacer

# Among named events, Fault.malformed_frame comes as a content_block_delta that does not parse.
_MALFORMED_DELTA = b"event: content_block_delta\n" + MALFORMED_SSE_FRAME


@dataclass
class _Block:
    start: dict[str, object]  # content_block_start's content_block
    deltas: list[dict[str, object]]  # its content_block_delta deltas, in order
    final: dict[str, object]  # the block as the JSON answer holds it


@dataclass
class AnthropicReply:
    model: str
    blocks: list[_Block]
    stop_reason: str
    output_tokens: int
    cache: CacheSplit
    id: str = field(default_factory=lambda: fake_id("msg_01"))

    def message(self) -> dict[str, object]:
        return {
            "id": self.id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [block.final for block in self.blocks],
            "stop_reason": self.stop_reason,
            "stop_sequence": None,
            "usage": self.cache.usage(self.output_tokens),
        }

    def message_start(self) -> dict[str, object]:
        head = {**self.message(), "content": [], "stop_reason": None}
        # The API's first count of output tokens is a small placeholder; message_delta's is final.
        head["usage"] = self.cache.usage(1)
        return {"type": "message_start", "message": head}

    def message_delta(self) -> dict[str, object]:
        usage = self.cache.usage(self.output_tokens)
        cumulative = {name: usage[name] for name in (
            "input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
            "output_tokens")}
        return {"type": "message_delta",
                "delta": {"stop_reason": self.stop_reason, "stop_sequence": None},
                "usage": cumulative}

    @property
    def delta_count(self) -> int:
        return sum(len(block.deltas) for block in self.blocks)


def _json_pieces(arguments: dict[str, object]) -> list[str]:
    """The partial_json deltas of a tool call: the API starts with an empty one."""
    encoded = json.dumps(arguments)
    if not arguments:
        return [""]
    middle = len(encoded) // 2
    return ["", encoded[:middle], encoded[middle:]]


def _thinking_block(model: str, omitted: bool) -> _Block:
    text = "" if omitted else FAKE_THINKING_TEXT
    signature = fake_signature(model, FAKE_THINKING_TEXT)
    deltas: list[dict[str, object]] = [] if omitted else [
        {"type": "thinking_delta", "thinking": text}]
    deltas.append({"type": "signature_delta", "signature": signature})
    return _Block({"type": "thinking", "thinking": "", "signature": ""}, deltas,
                  {"type": "thinking", "thinking": text, "signature": signature})


def _tool_use_block(request: dict[str, object], tool_name: str) -> _Block:
    tool_id = fake_id("toolu_01")
    arguments = fake_tool_arguments(client_tools(request)[tool_name].get("input_schema"))
    return _Block(
        {"type": "tool_use", "id": tool_id, "name": tool_name, "input": {}},
        [{"type": "input_json_delta", "partial_json": piece}
         for piece in _json_pieces(arguments)],
        {"type": "tool_use", "id": tool_id, "name": tool_name, "input": arguments})


def plan_reply(
    request: dict[str, object], model: str, max_tokens: int, chunk_count: int,
    tool_name: str | None, cache: CacheSplit,
) -> AnthropicReply:
    thinks, omitted = thinking(request)
    fitted = fit_reply(max_tokens, thinks=thinks, calls_tool=tool_name is not None,
                       chunk_count=chunk_count)
    blocks: list[_Block] = []
    if fitted.thinks:
        blocks.append(_thinking_block(model, omitted))
    if fitted.calls_tool and tool_name is not None:
        blocks.append(_tool_use_block(request, tool_name))
    elif fitted.chunks > 0:
        blocks.append(_Block(
            {"type": "text", "text": ""},
            [{"type": "text_delta", "text": fake_reply_chunk(index)}
             for index in range(fitted.chunks)],
            {"type": "text", "text": fake_reply_text(fitted.chunks)}))
    stop_reason = "tool_use" if fitted.calls_tool else "max_tokens" if fitted.cut else "end_turn"
    return AnthropicReply(model, blocks, stop_reason, fitted.output_tokens, cache)


async def stream(
    exchange: Exchange, fault: Fault | None, reply: AnthropicReply, chunk_delay: float
) -> None:
    await exchange.start_event_stream()
    await exchange.send_event("message_start", reply.message_start())
    if fault is not None and fault.inband_error is not None:
        # What Anthropic sends when it is overloaded after committing to a 200.
        error = {"type": "overloaded_error", "message": fault.inband_error}
        await exchange.send_event("error", {"type": "error", "error": error,
                                            "request_id": exchange.request_id})
        await exchange.end_stream()
        return
    pacer = ChunkPacer(exchange, fault, reply.delta_count, chunk_delay, _MALFORMED_DELTA)
    for index, block in enumerate(reply.blocks):
        await exchange.send_event("content_block_start", {
            "type": "content_block_start", "index": index, "content_block": block.start})
        if index == 0:
            await exchange.send_event("ping", {"type": "ping"})
        for delta in block.deltas:
            if not await pacer.before_chunk():
                return
            await exchange.send_event("content_block_delta", {
                "type": "content_block_delta", "index": index, "delta": delta})
            pacer.chunk_sent()
        await exchange.send_event("content_block_stop",
                                  {"type": "content_block_stop", "index": index})
    if not reply.blocks:
        await exchange.send_event("ping", {"type": "ping"})
    await pacer.finish()
    await exchange.send_event("message_delta", reply.message_delta())
    await exchange.send_event("message_stop", {"type": "message_stop"})
    await exchange.end_stream()
