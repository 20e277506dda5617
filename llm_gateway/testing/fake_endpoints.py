"""The OpenAI-style endpoints the fake upstream implements in venice and openai modes: chat
completions (JSON or SSE, ending in ``[DONE]``; tool calls and reasoning as
``fake_chat_reply`` plans them), embeddings and the model catalogue, each
answering one authenticated :class:`Exchange`; and the ``x-fake-cached-tokens`` header, which
the Responses API honours as well."""

import base64
import json
import struct
import time
import urllib.parse

from llm_gateway.testing.fake_chat_reply import (
    ChatPlan,
    chat_problem,
    chat_prompt_tokens,
    chat_tool_to_call,
    plan_chat,
)
from llm_gateway.testing.fake_content import (
    DEFAULT_EMBEDDING_DIMENSIONS,
    ChatReply,
    count_words,
    fake_embedding,
    models_payload,
    usage_payload,
)
from llm_gateway.testing.fake_errors import CHAT_FIELDS_BY_MODE, unknown_fields_payload
from llm_gateway.testing.fake_exchange import Exchange, encode_json, send_json
from llm_gateway.testing.fake_faults import Fault
from llm_gateway.testing.fake_stream import ChunkPacer, stream_settings, waited_as_generating

# Report this many of the prompt's tokens as read from the prompt cache (OpenAI's
# usage.prompt_tokens_details.cached_tokens). Without it the fake reports no details.
CACHED_TOKENS_HEADER = "x-fake-cached-tokens"

SSE_DONE_FRAME = b"data: [DONE]\n\n"

_SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache"),
]


def cached_tokens_asked(headers: dict[str, str]) -> int | str | None:
    """The cached prompt tokens a test asked the fake to report, None, or a problem."""
    raw = headers.get(CACHED_TOKENS_HEADER)
    if raw is None:
        return None
    if not raw.isdigit():
        return f"{CACHED_TOKENS_HEADER} must be a non-negative integer"
    return int(raw)


async def chat_completions(
    exchange: Exchange,
    fault: Fault | None,
    *,
    chunk_count: int,
    chunk_delay: float,
    strict_fields: bool,
) -> None:
    checked = await _checked_chat(exchange, strict_fields)
    if checked is None:
        return
    request, model, messages = checked
    problem = chat_problem(request, messages, exchange.provider)
    if problem is not None:
        await problem.send(exchange)
        return
    steered = await _steering(exchange, request, chunk_count, chunk_delay)
    if steered is None:
        return
    chunk_count, chunk_delay, cached_tokens, choices = steered
    tool_name = chat_tool_to_call(request, messages, exchange.headers)
    if isinstance(tool_name, ValueError):
        await exchange.send_error(400, str(tool_name))
        return
    plan, thinking_asked = plan_chat(request, provider=exchange.provider,
                                     chunk_count=chunk_count, tool_name=tool_name,
                                     choices=choices)
    reply = ChatReply(model=model, chunk_count=plan.fitted.chunks, created=int(time.time()),
                      choices=choices)
    venice = exchange.provider == "venice"
    # Every choice is generated, and billed: n choices cost n times the output.
    usage = usage_payload(
        chat_prompt_tokens(messages), plan.fitted.output_tokens * choices, with_cost=venice,
        cached_tokens=cached_tokens,
    )
    if thinking_asked:
        usage["completion_tokens_details"] = {
            "reasoning_tokens": plan.fitted.thinking_tokens * choices}

    silent = fault is not None and fault.omit_usage  # a server that counts nothing
    if request.get("stream") is not True:
        if await waited_as_generating(exchange, chunk_delay, plan.paced_count):
            choices_made = [{"index": index, "message": plan.message(index), "logprobs": None,
                             "finish_reason": plan.finish_reason} for index in range(choices)]
            answer = {**reply.completion(usage), "choices": choices_made}
            if silent:
                del answer["usage"]
            await exchange.send_success(answer, fault)
        return

    # Venice always ends a stream with usage; OpenAI only when the request asked for it.
    stream_options = request.get("stream_options")
    include_usage = not silent and (venice or (
        isinstance(stream_options, dict) and stream_options.get("include_usage") is True
    ))
    await _stream_completion(exchange, fault, reply, plan, chunk_delay,
                             usage if include_usage else None)


async def _checked_chat(
    exchange: Exchange, strict_fields: bool
) -> tuple[dict[str, object], str, list[object]] | None:
    """(request, model, messages), or None after the provider's 400 for a body that is no
    object, names a field the provider does not take, or lacks its model or messages."""
    request = exchange.body_json
    if not isinstance(request, dict):
        await exchange.reject("body", "Request body must be a JSON object")
        return None
    known_fields = CHAT_FIELDS_BY_MODE[exchange.provider]
    unknown = [name for name in request if name not in known_fields] if strict_fields else []
    if unknown:
        await send_json(exchange.send, 400, unknown_fields_payload(exchange.provider, unknown))
        return None
    model = request.get("model")
    messages = request.get("messages")
    if not isinstance(model, str):
        await exchange.reject("model", "model must be a string")
        return None
    if not isinstance(messages, list):
        await exchange.reject("messages", "messages must be an array")
        return None
    return request, model, messages


async def _steering(
    exchange: Exchange, request: dict[str, object], chunk_count: int, chunk_delay: float
) -> tuple[int, float, int | None, int] | None:
    """(chunk count, chunk delay, cached tokens, choices) as the headers and ``n`` shape the
    reply (the token cap is :func:`plan_chat`'s), or None after a 400 for one of them."""
    settings = stream_settings(exchange.headers, chunk_count, chunk_delay)
    if isinstance(settings, str):
        await exchange.reject("headers", settings)
        return None
    chunk_count, chunk_delay = settings
    cached_tokens = cached_tokens_asked(exchange.headers)
    if isinstance(cached_tokens, str):
        await exchange.reject("headers", cached_tokens)
        return None
    choices = 1 if request.get("n") is None else request["n"]
    if isinstance(choices, bool) or not isinstance(choices, int) or not 1 <= choices <= 128:
        await exchange.reject("n", "n must be an integer from 1 to 128")
        return None
    return chunk_count, chunk_delay, cached_tokens, choices


async def _send_json_frame(exchange: Exchange, payload: object) -> None:
    await exchange.send_raw_frame(b"data: " + encode_json(payload) + b"\n\n")


async def _end_stream(exchange: Exchange) -> None:
    await exchange.send({"type": "http.response.body", "body": SSE_DONE_FRAME, "more_body": False})


async def _stream_completion(
    exchange: Exchange,
    fault: Fault | None,
    reply: ChatReply,
    plan: ChatPlan,
    chunk_delay: float,
    usage: dict[str, object] | None,
) -> None:
    await exchange.send({"type": "http.response.start", "status": 200, "headers": _SSE_HEADERS})
    if fault is not None and fault.inband_error is not None:
        # What Venice does when overloaded after it has already committed to a 200.
        await _send_json_frame(exchange, {"error": fault.inband_error})
        await _end_stream(exchange)
        return
    head = plan.head()
    if head is not None:
        for index in range(reply.choices):
            await _send_json_frame(exchange, reply.chunk(head, None, index))
    if not await _stream_content(exchange, fault, reply, plan, chunk_delay):
        return
    for index in range(reply.choices):
        await _send_json_frame(exchange, reply.chunk({}, plan.finish_reason, index))
    if usage is not None:
        await _send_json_frame(exchange, reply.usage_chunk(usage))
    await _end_stream(exchange)


async def _stream_content(
    exchange: Exchange, fault: Fault | None, reply: ChatReply, plan: ChatPlan,
    chunk_delay: float,
) -> bool:
    """Send the paced deltas (reasoning, then the tool call or the content chunks), each in
    every choice, applying stream faults; False when the client hung up."""
    deltas = [plan.deltas(choice) for choice in range(reply.choices)]
    pacer = ChunkPacer(exchange, fault, plan.paced_count, chunk_delay)
    for index in range(plan.paced_count):
        if not await pacer.before_chunk():
            return False
        for choice in range(reply.choices):
            await _send_json_frame(exchange, reply.chunk(deltas[choice][index], None, choice))
        pacer.chunk_sent()
    await pacer.finish()
    return True


async def embeddings(exchange: Exchange, fault: Fault | None) -> None:
    request = exchange.body_json
    if not isinstance(request, dict):
        await exchange.reject("body", "Request body must be a JSON object")
        return
    model = request.get("model")
    raw_input = request.get("input")
    dimensions = request.get("dimensions", DEFAULT_EMBEDDING_DIMENSIONS)
    encoding_format = request.get("encoding_format") or "float"
    if not isinstance(model, str):
        await exchange.reject("model", "model must be a string")
        return
    # Token-id arrays are accepted too and embedded by their text form.
    texts = [raw_input] if isinstance(raw_input, str) else raw_input
    if not isinstance(texts, list) or not texts:
        await exchange.reject("input", "input must be a string or a non-empty array")
        return
    if not isinstance(dimensions, int) or isinstance(dimensions, bool) or dimensions < 1:
        await exchange.reject("dimensions", "dimensions must be a positive integer")
        return
    if encoding_format not in ("float", "base64"):
        await exchange.reject("encoding_format", "encoding_format must be float|base64")
        return

    data: list[dict[str, object]] = []
    prompt_tokens = 0
    for index, item in enumerate(texts):
        text = item if isinstance(item, str) else json.dumps(item)
        prompt_tokens += count_words(text)
        vector = fake_embedding(model, text, dimensions)
        embedding: list[float] | str = vector
        if encoding_format == "base64":
            # The openai SDK asks for base64 by default: little-endian float32s.
            packed = struct.pack(f"<{dimensions}f", *vector)
            embedding = base64.b64encode(packed).decode("ascii")
        data.append({"object": "embedding", "index": index, "embedding": embedding})
    payload = {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens},
    }
    await exchange.send_success(payload, fault)


async def models(exchange: Exchange, fault: Fault | None) -> None:
    # Venice filters the catalogue with ?type=text|embedding; without it the fake lists all.
    wanted_type = urllib.parse.parse_qs(exchange.query).get("type", ["all"])[0]
    await exchange.send_success(models_payload(wanted_type), fault)
