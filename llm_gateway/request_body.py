"""Reading a request body the one way it can be read: policy must see what the provider
will see.

- Duplicate keys are refused (400 ``invalid_request_body``), anywhere in the document:
  ``{"model": "other", "model": "allowed"}`` would pass the allowlist on the last value
  while a provider that keeps the first runs a model the key may not use. Refusing is
  safer than forwarding a canonical body: the caller learns its body is ambiguous.
- Nesting deeper than ``MAX_DEPTH`` is refused (400) instead of costing recursion.
- A lone surrogate anywhere (``"\\ud800"`` is valid JSON, but no UTF-8) is refused (400):
  the body could not be encoded again for a target that renames the model, nor stored.
- The strings policy stores, labels or echoes (``model``; the protocol's own, such as
  ``user``) are admitted by ``caller_text``, the one check for them.
"""

from __future__ import annotations

import json

from llm_gateway import caller_text, errors
from llm_gateway.errors import Rejection
from llm_gateway.protocols import Endpoint

# No OpenAI request nests anywhere near this deep (tool schemas reach perhaps 10).
MAX_DEPTH = 64


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    document = dict(pairs)
    if len(document) != len(pairs):
        seen: set[str] = set()
        for name, _ in pairs:
            if name in seen:
                raise _DuplicateKey(name)
            seen.add(name)
    return document


def _depth_exceeds(value: object, limit: int) -> bool:
    """Iterative, so a hostile document cannot make it recurse."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        if isinstance(node, dict):
            stack.extend((child, depth + 1) for child in node.values()
                         if isinstance(child, dict | list))
        elif isinstance(node, list):
            stack.extend((child, depth + 1) for child in node if isinstance(child, dict | list))
    return False


def _has_lone_surrogate(value: object) -> bool:
    """Iterative, as ``_depth_exceeds``: any string (key or value) that is no Unicode."""
    stack = [value]
    while stack:
        node = stack.pop()
        if isinstance(node, str):
            try:
                node.encode("utf-8")
            except UnicodeEncodeError:
                return True
        elif isinstance(node, dict):
            stack.extend(node.keys())
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return False


def decode(body: bytes) -> object | Rejection:
    """The JSON document, or the 400 that refuses it."""
    try:
        # Decoded strictly: json.loads decodes bytes with surrogatepass, which would read
        # an encoded surrogate (b"\xed\xa0\x80", no UTF-8) as a lone surrogate. A BOM may
        # lead (RFC 8259 lets a parser ignore it), as json.loads allowed.
        document = json.loads(body.decode("utf-8-sig"), object_pairs_hook=_unique_keys)
    except _DuplicateKey as duplicate:
        return errors.invalid_request_body(
            f"The key '{duplicate}' appears more than once in an object of the body.")
    except RecursionError:
        return errors.invalid_request_body(f"The body nests deeper than {MAX_DEPTH} levels.")
    except (ValueError, UnicodeDecodeError):
        return errors.invalid_json()
    # Counting brackets is cheap; walking the document only pays for bodies that could
    # nest that deep at all.
    if body.count(b"{") + body.count(b"[") > MAX_DEPTH and _depth_exceeds(document, MAX_DEPTH):
        return errors.invalid_request_body(f"The body nests deeper than {MAX_DEPTH} levels.")
    # Only an escape can make one (the bytes are UTF-8): the walk is for bodies that hold
    # a \uD8.. to \uDF.. escape at all, paired ones (an emoji, escaped) included.
    if (b"\\ud" in body or b"\\uD" in body) and _has_lone_surrogate(document):
        return errors.invalid_request_body(
            "The body holds a lone UTF-16 surrogate escape (\\ud800 to \\udfff without its "
            "pair): it is not Unicode text.")
    return document


def parse_request_body(endpoint: Endpoint, body: bytes) -> dict | Rejection | None:
    """Check what policy needs (a JSON object with a ``model``, and what the endpoint's
    protocol checks of its own); None for a request without a body. Nothing is
    rewritten here."""
    if endpoint.method != "POST" or not endpoint.operation.body:
        return None
    payload = decode(body)
    if isinstance(payload, Rejection):
        return payload
    if not isinstance(payload, dict):
        return errors.invalid_request_body("The request body must be a JSON object.")
    model = payload.get("model")
    if not isinstance(model, str) or not model.strip():
        return errors.invalid_request_body("'model' must be a non-empty string.")
    if (problem := caller_text.refusal("model", model, caller_text.MODEL_CHARS)) is not None:
        return errors.invalid_request_body(problem)
    refused = endpoint.protocol.check(payload)
    return payload if refused is None else refused
