"""A paced SSE upstream cheap enough to feed thousands of streams at once, for the long-lived
streams phase (``bench.streams``) and the protocols phase (chat, Messages, Responses).

    python -m bench.paced_upstream --listen 127.0.0.1:PORT [--api-key sk-fake-upstream]

The project's fake upstream (``llm-gateway fake-upstream``) runs on uvicorn and spends some
tens of microseconds per chunk (an ASGI message, a JSON encoding, a timer task per wait): 5 000
streams at one chunk every 100 ms are 50 000 chunks a second, more than a core can give it, and
it shares that core with the harness's client. This one speaks the same API for what the phase
needs, byte for byte the same frames as the fake in its Venice mode (a role frame, content frames
"This is chunk N of the fake reply.", a finish frame, a usage frame with Venice's cost, then
``[DONE]``), with ``x-fake-chunks``/``x-fake-chunk-delay-ms`` and ``max_tokens`` read the same
way; but every frame is pre-encoded and written straight to the socket from one timer (an
absolute schedule: chunk i is due at start + i x delay, so pacing does not drift).

The same pacing serves Anthropic's Messages and OpenAI's Responses streams, the event
shapes of the project's fake in its ``anthropic`` and ``openai`` modes (the same objects: its
``response_object``, ``usage`` and ``CacheSplit``), with the same text per content event as a
chat chunk: Messages ``message_start`` (usage: the input, one output token), a text block's
``content_block_start``, ``ping``, a ``content_block_delta`` per chunk, ``content_block_stop``,
``message_delta`` (the final usage) and ``message_stop``; Responses ``response.created``,
``response.in_progress``, ``response.output_item.added``, ``response.content_part.added``, a
``response.output_text.delta`` per chunk, the ``.done`` events of the text, part and item (each
with the whole text) and ``response.completed`` (the usage), every event with its
``sequence_number``. Each event is its own HTTP chunk, as the fake sends it; a content event is
a cached tail after the stream's own head, as a chat chunk is.

Routes under any prefix: ``POST …/chat/completions``, ``POST …/messages`` and
``POST …/responses`` (JSON or ``"stream": true``; ``max_tokens``, or ``max_output_tokens``
for Responses, caps the chunks as the fake does) and ``GET …/models``;
``Authorization: Bearer <api key>`` on every route, or ``x-api-key`` on ``/messages`` (which
also needs ``anthropic-version``, as the fake does). HTTP/1.1 keep-alive, bodies by
Content-Length only (what the gateways and LiteLLM send).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import sys
import time
import uuid
from collections.abc import Callable

from bench.procstat import raise_fd_limit
from llm_gateway.testing.fake_anthropic_request import CacheSplit
from llm_gateway.testing.fake_responses_reply import response_object
from llm_gateway.testing.fake_responses_reply import usage as responses_usage

WORDS_PER_CHUNK = 8  # as the fake: eight words (and tokens) per chunk
USD_PER_PROMPT_TOKEN = 0.7e-6
USD_PER_COMPLETION_TOKEN = 2.8e-6
DIEM_PER_PROMPT_TOKEN = 0.5e-6
DIEM_PER_COMPLETION_TOKEN = 2.0e-6
MAX_REQUEST_BYTES = 1 << 20

_SSE_HEAD = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
             b"transfer-encoding: chunked\r\n\r\n")
_DONE_FRAME = b"data: [DONE]\n\n"
_MODELS = json.dumps({"object": "list", "data": [
    {"id": name, "object": "model", "created": 1733768349, "owned_by": "venice.ai",
     "type": "text"} for name in ("llama-3.3-70b", "qwen3-4b")]}).encode()


def _chunk(frame: bytes) -> bytes:
    """One HTTP/1.1 chunk holding one SSE frame."""
    return b"%x\r\n%s\r\n" % (len(frame), frame)


def _reply_chunk_text(index: int) -> str:
    sentence = f"This is chunk {index} of the fake reply."
    return sentence if index == 0 else " " + sentence


_CONTENT_TAILS: dict[int, bytes] = {}


def _content_tail(index: int) -> bytes:
    """Everything of content frame ``index`` after the stream's own head; cached."""
    tail = _CONTENT_TAILS.get(index)
    if tail is None:
        choice = json.dumps([{"index": 0, "delta": {"content": _reply_chunk_text(index)},
                              "logprobs": None, "finish_reason": None}],
                            separators=(",", ":")).encode()
        tail = _CONTENT_TAILS[index] = b',"choices":' + choice + b"}\n\n"
    return tail


def _json_response(status: int, payload: bytes, reason: str = "OK") -> bytes:
    return (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(payload)}\r\n\r\n").encode() + payload


_REASONS = {400: "Bad Request", 401: "Unauthorized", 404: "Not Found"}
_ANTHROPIC_ERRORS = {400: "invalid_request_error", 401: "authentication_error",
                     404: "not_found_error"}


def _error(status: int, message: str) -> bytes:
    return _json_response(status, json.dumps({"error": message}).encode(),
                          _REASONS.get(status, "Error"))


def _anthropic_error(status: int, message: str) -> bytes:
    error = {"type": _ANTHROPIC_ERRORS.get(status, "api_error"), "message": message}
    return _json_response(status, json.dumps({"type": "error", "error": error}).encode(),
                          _REASONS.get(status, "Error"))


def _encode(payload: object) -> bytes:
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False).encode()


def _event(kind: str, payload: dict[str, object]) -> bytes:
    """One named SSE event in its own HTTP chunk, as the fake sends it."""
    return _chunk(b"event: " + kind.encode() + b"\ndata: " + _encode(payload) + b"\n\n")


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, object]:
    usd = prompt_tokens * USD_PER_PROMPT_TOKEN + completion_tokens * USD_PER_COMPLETION_TOKEN
    diem = prompt_tokens * DIEM_PER_PROMPT_TOKEN + completion_tokens * DIEM_PER_COMPLETION_TOKEN
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "cost": {"diem": round(diem, 10), "usd": round(usd, 10)}}


def _prompt_words(messages: object) -> int:
    words = 0
    for message in messages if isinstance(messages, list) else ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, str):
            words += len(content.split())
    return words


try:  # the gateway's own dependency: a request body parsed in a few microseconds
    from orjson import loads as _loads
except ImportError:  # pragma: no cover
    _loads = json.loads

# Reply ids unique for the process's life without a system call each (uuid4 reads urandom).
_REPLY_ID_PREFIX = f"chatcmpl-{uuid.uuid4().hex[:16]}"
_reply_ids = itertools.count()


def _next_reply_id() -> str:
    return f"{_REPLY_ID_PREFIX}{next(_reply_ids):016x}"


Stream = tuple[bytes, Callable[[int], bytes], bytes]  # opening, content event i, ending


def _chat_stream(reply_id: str, created: int, model: str, chunks: int,
                 prompt_words: int) -> Stream:
    """(the frames before the first chunk, chunk i's frame, the frames after the last)."""
    usage = _usage(prompt_words, WORDS_PER_CHUNK * chunks)
    head = (b'data: {"id":"' + reply_id.encode() + b'","object":"chat.completion.chunk",'
            b'"created":' + str(created).encode() + b',"model":' + json.dumps(model).encode())

    def frame(choices: list[object] | None, extra: dict[str, object] | None = None) -> bytes:
        rest = json.dumps({"choices": choices, **(extra or {})}, separators=(",", ":"))
        return _chunk(head + b"," + rest[1:].encode() + b"\n\n")

    def content(index: int) -> bytes:
        return _chunk(head + _content_tail(index))

    role = frame([{"index": 0, "delta": {"role": "assistant", "content": ""},
                   "logprobs": None, "finish_reason": None}])
    ending = (frame([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}])
              + frame([], {"usage": usage}) + _chunk(_DONE_FRAME))
    return role, content, ending


def stream_events(protocol: str, chunks: int, model: str = "gpt-4o-mini") -> list[bytes]:
    """Every event of one stream of ``protocol`` (chat, messages, responses) as this upstream
    sends it, each an HTTP chunk: for tests and the protocols phase's micro-benchmark."""
    if protocol == "chat":
        opening, content, ending = _chat_stream(_next_reply_id(), int(time.time()), model,
                                                chunks, 2)
    elif protocol == "messages":
        opening, content, ending = _message_stream(model, chunks, 2, False)
    else:
        opening, content, ending = _response_stream(
            {"model": model, "input": "Say hello.", "stream": True}, chunks, 2, False)
    return [*_split_chunks(opening), *(content(i) for i in range(chunks)),
            *_split_chunks(ending)]


def _split_chunks(data: bytes) -> list[bytes]:
    pieces = []
    while data:
        size_end = data.index(b"\r\n")
        end = size_end + 2 + int(data[:size_end], 16) + 2
        pieces.append(data[:end])
        data = data[end:]
    return pieces


# Anthropic's ids (msg_01 and 22 letters or digits) and OpenAI's (a prefix and 48 hex digits).
_ID_HEX = uuid.uuid4().hex


def _anthropic_id() -> str:
    return f"msg_01{_ID_HEX[:10]}{next(_reply_ids):012d}"


def _openai_id(prefix: str) -> str:
    return f"{prefix}{_ID_HEX[:24]}{next(_reply_ids):024x}"


# ---- Messages: content_block_delta events, whole (nothing in them is the stream's own) -------

_MESSAGE_DELTAS: dict[int, bytes] = {}


def _message_delta(index: int) -> bytes:
    frame = _MESSAGE_DELTAS.get(index)
    if frame is None:
        frame = _MESSAGE_DELTAS[index] = _event("content_block_delta", {
            "type": "content_block_delta", "index": 0,
            "delta": {"type": "text_delta", "text": _reply_chunk_text(index)}})
    return frame


def _message(reply_id: str, model: str, text: str, stop_reason: str | None,
             usage: dict[str, object]) -> dict[str, object]:
    return {"id": reply_id, "type": "message", "role": "assistant", "model": model,
            "content": [{"type": "text", "text": text}] if text else [],
            "stop_reason": stop_reason, "stop_sequence": None, "usage": usage}


def _message_stream(model: str, chunks: int, prompt_words: int, cut: bool) -> Stream:
    """(the events before the first chunk, chunk i's event, the events after the last)."""
    cache = CacheSplit(prompt_words)
    reply_id = _anthropic_id()
    opening = (
        _event("message_start", {"type": "message_start", "message": _message(
            reply_id, model, "", None, cache.usage(1))})
        + _event("content_block_start", {"type": "content_block_start", "index": 0,
                                         "content_block": {"type": "text", "text": ""}})
        + _event("ping", {"type": "ping"}))
    final = cache.usage(WORDS_PER_CHUNK * chunks)
    ending = (
        _event("content_block_stop", {"type": "content_block_stop", "index": 0})
        + _event("message_delta", {
            "type": "message_delta",
            "delta": {"stop_reason": "max_tokens" if cut else "end_turn",
                      "stop_sequence": None},
            "usage": {name: final[name] for name in (
                "input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens",
                "output_tokens")}})
        + _event("message_stop", {"type": "message_stop"}))
    return opening, _message_delta, ending


# ---- Responses: response.output_text.delta events, a cached tail after the item's id --------

_RESPONSE_OPENING_EVENTS = 4  # created, in_progress, output_item.added, content_part.added
_RESPONSE_TAILS: dict[int, bytes] = {}


def _response_delta_tail(index: int) -> bytes:
    tail = _RESPONSE_TAILS.get(index)
    if tail is None:
        tail = _RESPONSE_TAILS[index] = (
            b',"output_index":0,"content_index":0,"delta":'
            + _encode(_reply_chunk_text(index)) + b',"logprobs":[],"sequence_number":'
            + str(_RESPONSE_OPENING_EVENTS + index).encode() + b"}\n\n")
    return tail


def _response_final(request: dict, chunks: int, prompt_words: int,
                    cut: bool) -> tuple[dict[str, object], dict[str, object]]:
    """(the response as it starts, as it ends), the fake's objects."""
    start = response_object(request, _openai_id("resp_"), int(time.time()),
                            request.get("store") is not False)
    text = "".join(_reply_chunk_text(i) for i in range(chunks))
    item = {"id": _openai_id("msg_"), "type": "message",
            "status": "incomplete" if cut else "completed", "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": [],
                         "logprobs": []}]}
    final = {**start, "status": "incomplete" if cut else "completed",
             "completed_at": start["created_at"],
             "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
             "output": [item],
             "usage": responses_usage(prompt_words, 0, WORDS_PER_CHUNK * chunks, 0)}
    return start, final


def _response_stream(request: dict, chunks: int, prompt_words: int, cut: bool) -> Stream:
    start, final = _response_final(request, chunks, prompt_words, cut)
    item = final["output"][0]  # type: ignore[index]
    part = item["content"][0]
    where = {"item_id": item["id"], "output_index": 0, "content_index": 0}
    numbers = itertools.count()

    def event(kind: str, payload: dict[str, object]) -> bytes:
        return _event(kind, {"type": kind, **payload, "sequence_number": next(numbers)})

    opening = (
        event("response.created", {"response": start})
        + event("response.in_progress", {"response": start})
        + event("response.output_item.added", {"output_index": 0, "item": {
            **item, "status": "in_progress", "content": []}})
        + event("response.content_part.added", {**where, "part": {**part, "text": ""}}))
    head = (b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta",'
            b'"item_id":"' + item["id"].encode() + b'"')

    def content(index: int) -> bytes:
        return _chunk(head + _response_delta_tail(index))

    for _ in range(chunks):  # the content events' numbers
        next(numbers)
    ending = (
        event("response.output_text.done", {**where, "text": part["text"], "logprobs": []})
        + event("response.content_part.done", {**where, "part": part})
        + event("response.output_item.done", {"output_index": 0, "item": item})
        + event("response.incomplete" if cut else "response.completed", {"response": final}))
    return opening, content, ending


_JSON_TAILS: dict[tuple[str, int, int], bytes] = {}


def _json_answer(reply_id: str, created: int, model: str, chunks: int,
                 prompt_words: int) -> bytes:
    """A whole (non-stream) answer, as the fake's: everything after the id and the time is
    the same for the same model, length and prompt, so it is encoded once. What the
    workers phase measures is the gateways; this upstream shares their two CPUs."""
    key = (model, chunks, prompt_words)
    tail = _JSON_TAILS.get(key)
    if tail is None:
        text = "".join(_reply_chunk_text(i) for i in range(chunks))
        rest = json.dumps({
            "model": model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": None, "finish_reason": "stop"}],
            "usage": _usage(prompt_words, WORDS_PER_CHUNK * chunks)}, separators=(",", ":"))
        tail = b"," + rest[1:].encode()
        if len(_JSON_TAILS) < 1024:
            _JSON_TAILS[key] = tail
    payload = b'{"id":"%s","object":"chat.completion","created":%d%s' % (
        reply_id.encode(), created, tail)
    return b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s" % (
        len(payload), payload)


class PacedConnection(asyncio.Protocol):
    """One client connection: requests one after another; a stream paced by loop timers."""

    def __init__(self, api_key: str) -> None:
        self.api_key = api_key
        self.authorization = f"Bearer {api_key}"
        self.buffer = b""
        self.transport: asyncio.Transport | None = None
        self.timer: asyncio.TimerHandle | None = None
        self.busy = False  # a stream is being sent: the next request waits in the buffer

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        if len(self.buffer) > MAX_REQUEST_BYTES and self.transport is not None:
            self.transport.close()
            return
        self._next_request()

    def _next_request(self) -> None:
        while not self.busy and self.transport is not None:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = self.buffer[:end].decode("latin-1")
            lines = head.split("\r\n")
            method, path, *_ = [*lines[0].split(" "), "", ""]
            headers: dict[str, str] = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length") or 0)
            if len(self.buffer) < end + 4 + length:
                return
            body = self.buffer[end + 4:end + 4 + length]
            self.buffer = self.buffer[end + 4 + length:]
            self._answer(method, path.split("?", 1)[0], headers, body)

    def _answer(self, method: str, path: str, headers: dict[str, str], body: bytes) -> None:
        assert self.transport is not None
        if method == "POST" and path.endswith("/messages"):
            self._messages(headers, body)
        elif headers.get("authorization") != self.authorization:
            self.transport.write(_error(401, "Authentication failed"))
        elif method == "GET" and path.endswith("/models"):
            self.transport.write(_json_response(200, _MODELS))
        elif method == "POST" and path.endswith("/chat/completions"):
            self._chat(headers, body)
        elif method == "POST" and path.endswith("/responses"):
            self._responses(headers, body)
        else:
            self.transport.write(_error(404, "Not found"))

    def _request(self, headers: dict[str, str], body: bytes,
                 cap_field: str | None = None) -> tuple[dict, int, float, bool] | str:
        """(the request, its chunks, the delay between them, whether its cap cut them), or
        why it is refused. ``cap_field``: the only field that caps the output (Responses'),
        else max_tokens or max_completion_tokens."""
        try:
            request = _loads(body)
            chunks = int(headers.get("x-fake-chunks", "8"))
            delay_s = float(headers.get("x-fake-chunk-delay-ms", "0")) / 1000
        except ValueError:
            return "bad request"
        if not isinstance(request, dict) or not isinstance(request.get("model"), str):
            return "model must be a string"
        cap = (request.get(cap_field) if cap_field
               else request.get("max_tokens", request.get("max_completion_tokens")))
        cut = False
        if isinstance(cap, int) and not isinstance(cap, bool) and cap >= 0:
            cut = cap // WORDS_PER_CHUNK < chunks
            chunks = min(chunks, cap // WORDS_PER_CHUNK)
        return request, chunks, delay_s, cut

    def _chat(self, headers: dict[str, str], body: bytes) -> None:
        assert self.transport is not None
        asked = self._request(headers, body)
        if isinstance(asked, str):
            self.transport.write(_error(400, asked))
            return
        request, chunks, delay_s, _ = asked
        model = request["model"]
        prompt_words = _prompt_words(request.get("messages"))
        reply_id = _next_reply_id()
        created = int(time.time())
        if request.get("stream") is not True:
            self.transport.write(_json_answer(reply_id, created, model, chunks, prompt_words))
            return
        self._pace(*_chat_stream(reply_id, created, model, chunks, prompt_words), chunks,
                   delay_s)

    def _messages(self, headers: dict[str, str], body: bytes) -> None:
        """Anthropic's Messages: the key in x-api-key (or as a bearer), anthropic-version."""
        assert self.transport is not None
        if (headers.get("x-api-key") != self.api_key
                and headers.get("authorization") != self.authorization):
            self.transport.write(_anthropic_error(401, "invalid x-api-key"))
            return
        if not headers.get("anthropic-version"):
            self.transport.write(_anthropic_error(400, "anthropic-version: header is required"))
            return
        asked = self._request(headers, body)
        if isinstance(asked, str):
            self.transport.write(_anthropic_error(400, asked))
            return
        request, chunks, delay_s, cut = asked
        prompt_words = _prompt_words(request.get("messages"))
        if request.get("stream") is not True:
            usage = CacheSplit(prompt_words).usage(WORDS_PER_CHUNK * chunks)
            text = "".join(_reply_chunk_text(i) for i in range(chunks))
            message = _message(_anthropic_id(), request["model"], text,
                               "max_tokens" if cut else "end_turn", usage)
            self.transport.write(_json_response(200, _encode(message)))
            return
        self._pace(*_message_stream(request["model"], chunks, prompt_words, cut), chunks,
                   delay_s)

    def _responses(self, headers: dict[str, str], body: bytes) -> None:
        assert self.transport is not None
        asked = self._request(headers, body, cap_field="max_output_tokens")
        if isinstance(asked, str):
            self.transport.write(_error(400, asked))
            return
        request, chunks, delay_s, cut = asked
        given = request.get("input")
        prompt_words = (len(given.split()) if isinstance(given, str)
                        else _prompt_words(given))
        if request.get("stream") is not True:
            _, final = _response_final(request, chunks, prompt_words, cut)
            self.transport.write(_json_response(200, _encode(final)))
            return
        self._pace(*_response_stream(request, chunks, prompt_words, cut), chunks, delay_s)

    def _pace(self, opening: bytes, content: Callable[[int], bytes], ending: bytes,
              chunks: int, delay_s: float) -> None:
        """``opening`` now, content event i at start + i x delay, then ``ending`` and the
        body's last chunk."""
        assert self.transport is not None
        ending += b"0\r\n\r\n"
        self.busy = True
        self.transport.write(_SSE_HEAD + opening)
        loop = asyncio.get_running_loop()
        started = loop.time()

        def send(index: int) -> None:
            self.timer = None
            transport = self.transport
            if transport is None:
                return
            if index < chunks:
                transport.write(content(index))
                if index + 1 < chunks:
                    self.timer = loop.call_at(started + (index + 1) * delay_s, send, index + 1)
                    return
            transport.write(ending)
            self.busy = False
            self._next_request()

        send(0)


async def serve(host: str, port: int, api_key: str) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: PacedConnection(api_key), host, port,
                                      backlog=8192, reuse_address=True)
    print(f"paced upstream listening on http://{host}:{port}", flush=True)
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.paced_upstream", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--listen", default="127.0.0.1:3005")
    parser.add_argument("--api-key", default="sk-fake-upstream")
    args = parser.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    raise_fd_limit()
    try:
        import uvloop  # a cheaper event loop where installed: more streams per core
    except ImportError:
        loop_factory = None
    else:
        loop_factory = uvloop.new_event_loop
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(host, int(port), args.api_key), loop_factory=loop_factory)
    return 0


if __name__ == "__main__":
    sys.exit(main())
