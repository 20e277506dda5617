"""OpenAI's embeddings to Gemini's (``models/{model}:batchEmbedContents``), and back.

Embeddings hold no conversation, so they do not pass through the hub form: this is the one
pair of its own. Every input (a string, or a list of strings) is one request of the batch,
``dimensions`` its ``outputDimensionality``; the answer's vectors come back as OpenAI's
list, in order. Gemini reports no tokens for embeddings: the answer's usage is the
gateway's estimate, and the record says it is one (``tokens_estimated``). Token-id inputs
(lists of integers) are text only OpenAI's tokenizer reads: refused.
"""

from __future__ import annotations

from llm_gateway.tokens import estimate_text
from llm_gateway.translate.form import Untranslatable

# What only tunes OpenAI's answer (Gemini always answers floats) or names the end user.
_DROPPED = ("encoding_format", "user")


class EmbeddingsToGemini:
    __slots__ = ("dimensions", "dropped", "inputs", "model")

    def __init__(self, payload: dict, *, now: float = 0) -> None:
        raw = payload.get("input")
        inputs = [raw] if isinstance(raw, str) else raw
        if not isinstance(inputs, list) or not inputs or not all(
                isinstance(text, str) for text in inputs):
            raise Untranslatable("input", "must be text (a string or a list of strings) "
                                 "for a Gemini target")
        self.inputs: list[str] = inputs
        self.model = str(payload.get("model") or "")
        dimensions = payload.get("dimensions")
        self.dimensions = dimensions if isinstance(dimensions, int) else None
        self.dropped = [name for name in _DROPPED
                        if payload.get(name) not in (None, "float")]

    def payload(self, model: str) -> dict:
        def one(text: str) -> dict:
            request: dict = {"model": f"models/{model}", "content": {"parts": [{"text": text}]}}
            if self.dimensions is not None:
                request["outputDimensionality"] = self.dimensions
            return request

        return {"requests": [one(text) for text in self.inputs]}

    def path(self, model: str, stream: bool) -> tuple[str, str]:
        return f"/models/{model}:batchEmbedContents", ""

    def reply(self, body: dict) -> dict:
        embeddings = body.get("embeddings")
        vectors = [entry.get("values") if isinstance(entry, dict) else None
                   for entry in (embeddings if isinstance(embeddings, list) else [])]
        return {"object": "list", "model": self.model,
                "data": [{"object": "embedding", "index": index, "embedding": vector or []}
                         for index, vector in enumerate(vectors)],
                "usage": {"prompt_tokens": (tokens := sum(map(estimate_text, self.inputs))),
                          "total_tokens": tokens}}

    def stream(self) -> object:
        raise Untranslatable("stream", "embeddings do not stream")
