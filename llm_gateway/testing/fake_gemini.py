"""Google's Gemini API as the fake upstream's ``gemini`` mode speaks it (the API at
``https://generativelanguage.googleapis.com/v1beta``: ai.google.dev/api/generate-content,
.../embeddings, .../models, .../tokens, and the google-genai SDK's types, which its
clients parse).

What it answers, under the fake's prefix (``/v1beta`` by default in this mode):

* ``POST /models/{model}:generateContent`` -- a ``GenerateContentResponse``: one candidate
  whose parts are, in order, a thought (``thought: true``) when ``thinkingConfig`` asks for
  thinking with ``includeThoughts``, then a ``functionCall`` (no id, as Gemini's usually come;
  with the ``thoughtSignature`` when the model thought, as Gemini 3 puts it on the first
  call) or the text of :func:`fake_reply_text` (the signature on it); ``finishReason`` STOP,
  or MAX_TOKENS when ``maxOutputTokens`` cut the reply; ``usageMetadata`` (prompt, candidates,
  thoughts, cached and total tokens), ``modelVersion``, ``responseId``.
* ``POST /models/{model}:streamGenerateContent?alt=sse`` -- the same answer as ``data:``
  frames of whole ``GenerateContentResponse`` chunks: the thought, then one chunk per reply
  chunk (or the call), each with the usage so far, the finish reason in the last one.
  Without ``alt=sse``, the chunks as one JSON array, as Google sends them.
* ``POST /models/{model}:countTokens``, ``:embedContent``, ``:batchEmbedContents`` and
  ``GET /models``, ``GET /models/{model}``.

Tokens, so tests can predict them: the prompt is the words of the system instruction and of
every part (function calls' args and responses as JSON); a reply chunk costs
:data:`WORDS_PER_CHUNK`, thinking :data:`THINKING_TOKENS` (counted whether shown or not, as
``thoughtsTokenCount``), a call :data:`TOOL_CALL_TOKENS`. Thinking counts against
``maxOutputTokens``, as Gemini 2.5's does. ``x-fake-cache-read-tokens: N`` reports N of the
prompt's tokens as ``cachedContentTokenCount`` (part of ``promptTokenCount``, as Gemini
counts them); ``x-fake-tool-call: <name>`` calls that function (a ``functionCallingConfig``
of ANY forces a call, NONE forbids one; a turn answering a ``functionResponse`` answers text).

The key: ``x-goog-api-key`` (or ``?key=``). As Google answers: none is a 403
PERMISSION_DENIED, a wrong one a 400 INVALID_ARGUMENT (reason API_KEY_INVALID), an
``Authorization: Bearer`` (an OAuth token the fake cannot check) a 401 UNAUTHENTICATED.
Every error is ``{"error": {"code", "message", "status"}}``; injected faults too (429
RESOURCE_EXHAUSTED, 503 UNAVAILABLE, ...); a stream's in-band failure is such an error object
as a ``data:`` frame.
"""

import secrets
from dataclasses import dataclass, field

from llm_gateway.testing.fake_agent_reply import fit_reply
from llm_gateway.testing.fake_content import (
    DEFAULT_EMBEDDING_DIMENSIONS,
    FAKE_THINKING_TEXT,
    THINKING_TOKENS,
    TOOL_CALL_TOKENS,
    count_words,
    fake_embedding,
    fake_reply_chunk,
    fake_signature,
    fake_tool_arguments,
)
from llm_gateway.testing.fake_errors import gemini_error
from llm_gateway.testing.fake_exchange import Exchange, encode_json, send_json
from llm_gateway.testing.fake_faults import Fault
from llm_gateway.testing.fake_gemini_request import (
    Steering,
    functions,
    get,
    prompt_tokens,
    request_problem,
    steering,
    thinking,
)
from llm_gateway.testing.fake_stream import ChunkPacer, waited_as_generating

# (id, display name, input limit, output limit, thinks), as GET /models lists Gemini's.
FAKE_GEMINI_MODELS = (
    ("gemini-2.5-pro", "Gemini 2.5 Pro", 1_048_576, 65_536, True),
    ("gemini-2.5-flash", "Gemini 2.5 Flash", 1_048_576, 65_536, True),
    ("gemini-embedding-001", "Gemini Embedding 001", 2_048, 1, False),
)
_SSE_HEADERS = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]


@dataclass
class GeminiReply:
    model: str
    prompt: int
    cached: int
    parts: list[list[dict]]  # the stream's chunks' parts; the JSON answer joins them
    finish_reason: str
    thoughts: int
    candidates: int
    response_id: str = field(default_factory=lambda: secrets.token_urlsafe(16).replace("-", "x"))

    def usage(self, candidates: int | None = None) -> dict[str, object]:
        produced = self.candidates if candidates is None else candidates
        usage: dict[str, object] = {
            "promptTokenCount": self.prompt, "candidatesTokenCount": produced,
            "totalTokenCount": self.prompt + produced + self.thoughts,
            "promptTokensDetails": [{"modality": "TEXT", "tokenCount": self.prompt}]}
        if self.thoughts:
            usage["thoughtsTokenCount"] = self.thoughts
        if self.cached:
            usage["cachedContentTokenCount"] = self.cached
        return usage

    def chunk(self, parts: list[dict], finish: bool, candidates: int) -> dict[str, object]:
        candidate: dict[str, object] = {"content": {"parts": parts, "role": "model"},
                                        "index": 0}
        if finish:
            candidate["finishReason"] = self.finish_reason
        return {"candidates": [candidate], "usageMetadata": self.usage(candidates),
                "modelVersion": self.model, "responseId": self.response_id}

    def response(self) -> dict[str, object]:
        parts: list[dict] = []
        for chunk in self.parts:
            for part in chunk:
                if parts and _joins(parts[-1], part):
                    parts[-1] = {**parts[-1], "text": parts[-1]["text"] + part["text"]}
                else:
                    parts.append(dict(part))
        return self.chunk(parts or [{"text": ""}], True, self.candidates)


def _joins(before: dict, part: dict) -> bool:
    """Whether ``part`` continues ``before``'s text, as the JSON answer holds it whole."""
    return ("text" in before and "text" in part and "thought" not in before
            and "thought" not in part and "thoughtSignature" not in part)


def plan_reply(request: dict, model: str, steered: Steering) -> GeminiReply:
    config = get(request, "generationConfig")
    cap = get(config, "maxOutputTokens") if isinstance(config, dict) else None
    thinks, shows = thinking(request)
    fitted = fit_reply(cap if isinstance(cap, int) else 1 << 30, thinks=thinks,
                       calls_tool=steered.function is not None,
                       chunk_count=steered.chunk_count)
    signature = fake_signature(model, FAKE_THINKING_TEXT) if fitted.thinks else None
    chunks: list[list[dict]] = []
    if fitted.thinks and shows:
        chunks.append([{"text": FAKE_THINKING_TEXT, "thought": True}])
    if fitted.calls_tool:
        declaration = functions(request)[steered.function]
        schema = get(declaration, "parametersJsonSchema") or declaration.get("parameters")
        call = {"name": steered.function, "args": fake_tool_arguments(_lowered(schema))}
        chunks.append([{"functionCall": call}])
    else:
        chunks.extend([{"text": fake_reply_chunk(index)}] for index in range(fitted.chunks))
    if signature is not None:
        content = next((chunk for chunk in chunks if "thought" not in chunk[0]), None)
        if content is None:
            chunks.append(content := [{"text": ""}])
        content[0]["thoughtSignature"] = signature
    return GeminiReply(model, prompt_tokens(request), steered.cached,
                       chunks, "MAX_TOKENS" if fitted.cut else "STOP",
                       THINKING_TOKENS if fitted.thinks else 0,
                       fitted.output_tokens - (THINKING_TOKENS if fitted.thinks else 0))


def _lowered(schema: object) -> object:
    """Gemini's OpenAPI types (``STRING``) as the fake's argument maker reads them."""
    if isinstance(schema, dict):
        return {key: value.lower() if key == "type" and isinstance(value, str)
                else _lowered(value) for key, value in schema.items()}
    return schema


async def generate(exchange: Exchange, fault: Fault | None, model: str, *, stream: bool,
                   chunk_count: int, chunk_delay: float, strict_fields: bool) -> None:
    request = exchange.body_json
    problem = request_problem(request, strict_fields=strict_fields)
    if problem is not None:
        await exchange.send_error(400, problem)
        return
    assert isinstance(request, dict)
    steered = steering(exchange.headers, request, chunk_count, chunk_delay)
    if isinstance(steered, str):
        await exchange.send_error(400, steered)
        return
    reply = plan_reply(request, model, steered)
    if stream:
        await _stream(exchange, fault, reply, steered.chunk_delay, "alt=sse" in exchange.query)
    elif await waited_as_generating(exchange, steered.chunk_delay, len(reply.parts)):
        await exchange.send_success(reply.response(), fault)


async def _stream(exchange: Exchange, fault: Fault | None, reply: GeminiReply,
                  chunk_delay: float, sse: bool) -> None:
    headers = _SSE_HEADERS if sse else [(b"content-type", b"application/json")]
    await exchange.send({"type": "http.response.start", "status": 200, "headers": headers})
    if fault is not None and fault.inband_error is not None:
        # What Gemini sends when it fails after committing to a 200.
        error = encode_json(gemini_error(503, fault.inband_error))
        await exchange.send_raw_frame(b"data: " + error + b"\n\n" if sse else b"[" + error)
        await exchange.end_stream()
        return
    chunks = reply.parts or [[{"text": ""}]]
    pacer = ChunkPacer(exchange, fault, len(chunks), chunk_delay)
    produced = 0
    for index, parts in enumerate(chunks):
        if not await pacer.before_chunk():
            return
        produced += sum(_tokens(part) for part in parts)
        chunk = reply.chunk(parts, index == len(chunks) - 1, min(produced, reply.candidates))
        if index == len(chunks) - 1:
            chunk["usageMetadata"] = reply.usage()
        body = encode_json(chunk)
        await exchange.send_raw_frame(b"data: " + body + b"\n\n" if sse
                                      else (b"[" if index == 0 else b",\r\n") + body)
        pacer.chunk_sent()
    await pacer.finish()
    if not sse:
        await exchange.send_raw_frame(b"]")
    await exchange.end_stream()


def _tokens(part: dict) -> int:
    if "thought" in part:
        return 0
    if "functionCall" in part:
        return TOOL_CALL_TOKENS
    return count_words(part.get("text", ""))


async def count(exchange: Exchange, fault: Fault | None, model: str) -> None:
    request = exchange.body_json
    if not isinstance(request, dict):
        await exchange.send_error(400, "Invalid JSON payload received. Expected an object.")
        return
    inner = get(request, "generateContentRequest")
    tokens = prompt_tokens(inner if isinstance(inner, dict) else request)
    await exchange.send_success({"totalTokens": tokens, "promptTokensDetails": [
        {"modality": "TEXT", "tokenCount": tokens}]}, fault)


def _embedding(model: str, request: object) -> dict[str, object] | str:
    content = get(request, "content") if isinstance(request, dict) else None
    parts = content.get("parts") if isinstance(content, dict) else None
    if not isinstance(parts, list) or not parts:
        return "* EmbedContentRequest.content: contents is not specified\n"
    text = " ".join(part["text"] for part in parts
                    if isinstance(part, dict) and isinstance(part.get("text"), str))
    assert isinstance(request, dict)
    dimensions = get(request, "outputDimensionality") or DEFAULT_EMBEDDING_DIMENSIONS
    if not isinstance(dimensions, int) or dimensions < 1:
        return "* EmbedContentRequest.output_dimensionality: must be positive"
    return {"values": fake_embedding(model, text, dimensions)}


async def embed(exchange: Exchange, fault: Fault | None, model: str) -> None:
    embedding = _embedding(model, exchange.body_json)
    if isinstance(embedding, str):
        await exchange.send_error(400, embedding)
        return
    await exchange.send_success({"embedding": embedding}, fault)


async def batch_embed(exchange: Exchange, fault: Fault | None, model: str) -> None:
    body = exchange.body_json
    requests = body.get("requests") if isinstance(body, dict) else None
    if not isinstance(requests, list) or not requests:
        await exchange.send_error(400, "* BatchEmbedContentsRequest.requests: "
                                  "requests is not specified\n")
        return
    embeddings = []
    for request in requests:
        named = request.get("model") if isinstance(request, dict) else None
        if named not in (None, f"models/{model}"):
            await exchange.send_error(400, f"Model {named} in the request does not match "
                                      f"models/{model}.")
            return
        embedding = _embedding(model, request)
        if isinstance(embedding, str):
            await exchange.send_error(400, embedding)
            return
        embeddings.append(embedding)
    await exchange.send_success({"embeddings": embeddings}, fault)


def _model_payload(entry: tuple[str, str, int, int, bool]) -> dict[str, object]:
    model_id, display, inputs, outputs, thinks = entry
    methods = ["embedContent", "batchEmbedContents", "countTokens"] if not thinks \
        else ["generateContent", "countTokens", "streamGenerateContent"]
    return {"name": f"models/{model_id}", "version": "001", "displayName": display,
            "inputTokenLimit": inputs, "outputTokenLimit": outputs,
            "supportedGenerationMethods": methods, "thinking": thinks}


async def list_models(exchange: Exchange, fault: Fault | None) -> None:
    await exchange.send_success({"models": [_model_payload(entry)
                                            for entry in FAKE_GEMINI_MODELS]}, fault)


async def get_model(exchange: Exchange, fault: Fault | None, model_id: str) -> None:
    entry = next((entry for entry in FAKE_GEMINI_MODELS if entry[0] == model_id), None)
    if entry is None:
        await send_json(exchange.send, 404, gemini_error(
            404, f"models/{model_id} is not found for API version v1beta, or is not supported "
            "for generateContent."))
        return
    await exchange.send_success(_model_payload(entry), fault)
