"""A paced SSE upstream cheap enough to feed thousands of streams at once, for the long-lived
streams phase (``bench.streams``).

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

Routes under any prefix: ``POST …/chat/completions`` (JSON or ``"stream": true``) and
``GET …/models``; ``Authorization: Bearer <api key>`` on both. HTTP/1.1 keep-alive, bodies by
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

from bench.procstat import raise_fd_limit

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


def _error(status: int, message: str) -> bytes:
    reason = {400: "Bad Request", 401: "Unauthorized", 404: "Not Found"}.get(status, "Error")
    return _json_response(status, json.dumps({"error": message}).encode(), reason)


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
        if headers.get("authorization") != self.authorization:
            self.transport.write(_error(401, "Authentication failed"))
        elif method == "GET" and path.endswith("/models"):
            self.transport.write(_json_response(200, _MODELS))
        elif method == "POST" and path.endswith("/chat/completions"):
            self._chat(headers, body)
        else:
            self.transport.write(_error(404, "Not found"))

    def _chat(self, headers: dict[str, str], body: bytes) -> None:
        assert self.transport is not None
        try:
            request = _loads(body)
            chunks = int(headers.get("x-fake-chunks", "8"))
            delay_s = float(headers.get("x-fake-chunk-delay-ms", "0")) / 1000
        except ValueError:
            self.transport.write(_error(400, "bad request"))
            return
        if not isinstance(request, dict) or not isinstance(request.get("model"), str):
            self.transport.write(_error(400, "model must be a string"))
            return
        cap = request.get("max_tokens", request.get("max_completion_tokens"))
        if isinstance(cap, int) and not isinstance(cap, bool) and cap >= 0:
            chunks = min(chunks, cap // WORDS_PER_CHUNK)
        model = request["model"]
        prompt_words = _prompt_words(request.get("messages"))
        reply_id = _next_reply_id()
        created = int(time.time())
        if request.get("stream") is not True:
            self.transport.write(_json_answer(reply_id, created, model, chunks, prompt_words))
            return
        usage = _usage(prompt_words, WORDS_PER_CHUNK * chunks)
        head = (b'data: {"id":"' + reply_id.encode() + b'","object":"chat.completion.chunk",'
                b'"created":' + str(created).encode() + b',"model":'
                + json.dumps(model).encode())

        def frame(choices: list[object] | None, extra: dict[str, object] | None = None) -> bytes:
            rest = json.dumps({"choices": choices, **(extra or {})}, separators=(",", ":"))
            return _chunk(head + b"," + rest[1:].encode() + b"\n\n")

        role = frame([{"index": 0, "delta": {"role": "assistant", "content": ""},
                       "logprobs": None, "finish_reason": None}])
        ending = (frame([{"index": 0, "delta": {}, "logprobs": None, "finish_reason": "stop"}])
                  + frame([], {"usage": usage}) + _chunk(_DONE_FRAME) + b"0\r\n\r\n")
        self.busy = True
        self.transport.write(_SSE_HEAD + role)
        loop = asyncio.get_running_loop()
        started = loop.time()

        def send(index: int) -> None:
            self.timer = None
            transport = self.transport
            if transport is None:
                return
            if index < chunks:
                transport.write(_chunk(head + _content_tail(index)))
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
