"""What the fake Gemini API reads from a ``generateContent`` request, and how it refuses one
in Google's words: the fields it takes (proto JSON's: lowerCamel or snake_case, anything else
``Invalid JSON payload received. Unknown name "x": Cannot find field.``), the roles, the
prompt's tokens, the thinking asked for, and what the headers and ``toolConfig`` steer
(stream shape, cached tokens, the function the reply calls)."""

import json
from dataclasses import dataclass

from llm_gateway.testing.fake_agent_reply import tool_to_call
from llm_gateway.testing.fake_anthropic_request import CACHE_READ_HEADER
from llm_gateway.testing.fake_content import count_words
from llm_gateway.testing.fake_stream import stream_settings

# GenerateContentRequest's fields (ai.google.dev/api/generate-content; the google-genai
# SDK's Gemini API request), GenerationConfig's, and a Part's.
REQUEST_FIELDS = frozenset({"model", "contents", "tools", "toolConfig", "safetySettings",
                            "systemInstruction", "generationConfig", "cachedContent",
                            "serviceTier", "store"})
GENERATION_FIELDS = frozenset({
    "stopSequences", "responseMimeType", "responseSchema", "responseJsonSchema",
    "responseModalities", "candidateCount", "maxOutputTokens", "temperature", "topP", "topK",
    "seed", "presencePenalty", "frequencyPenalty", "responseLogprobs", "logprobs",
    "enableEnhancedCivicAnswers", "speechConfig", "thinkingConfig", "imageConfig",
    "mediaResolution"})
PART_FIELDS = frozenset({"text", "inlineData", "fileData", "functionCall", "functionResponse",
                         "executableCode", "codeExecutionResult", "thought", "thoughtSignature",
                         "videoMetadata", "partMetadata"})
ROLES = ("user", "model")


def camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(word[:1].upper() + word[1:] for word in rest)


def get(payload: dict, name: str) -> object:
    """``name`` (lowerCamel) in either spelling proto JSON takes."""
    if name in payload:
        return payload[name]
    snake = "".join(f"_{c.lower()}" if c.isupper() else c for c in name)
    return payload.get(snake)


def _unknown(payload: dict, known: frozenset[str], where: str | None) -> str | None:
    name = next((name for name in payload if camel(name) not in known), None)
    if name is None:
        return None
    at = f" at '{where}'" if where else ""
    return f'Invalid JSON payload received. Unknown name "{name}"{at}: Cannot find field.'


def request_problem(request: object, *, strict_fields: bool) -> str | None:
    """Why Gemini answers 400 INVALID_ARGUMENT, in its words, or None."""
    if not isinstance(request, dict):
        return "Invalid JSON payload received. Expected an object."
    config = get(request, "generationConfig")
    contents = request.get("contents")
    if strict_fields:
        problem = _unknown(request, REQUEST_FIELDS, None) or (
            _unknown(config, GENERATION_FIELDS, "generation_config")
            if isinstance(config, dict) else None)
        if problem:
            return problem
        for i, content in enumerate(contents if isinstance(contents, list) else ()):
            for j, part in enumerate(content.get("parts") or ()
                                     if isinstance(content, dict) else ()):
                if isinstance(part, dict) and (
                        problem := _unknown(part, PART_FIELDS, f"contents[{i}].parts[{j}]")):
                    return problem
    if not isinstance(contents, list) or not contents:
        return "* GenerateContentRequest.contents: contents is not specified\n"
    for content in contents:
        if not isinstance(content, dict) or content.get("role", "user") not in ROLES:
            return "Please use a valid role: user, model."
        if not content.get("parts"):
            return "* GenerateContentRequest.contents: contents.parts must not be empty.\n"
    cap = get(config, "maxOutputTokens") if isinstance(config, dict) else None
    if cap is not None and (not isinstance(cap, int) or isinstance(cap, bool) or cap < 1):
        return "* GenerateContentRequest.generation_config.max_output_tokens: must be positive"
    return None


def _part_words(part: dict) -> int:
    if isinstance(part.get("text"), str):
        return count_words(part["text"])
    for name in ("functionCall", "functionResponse"):
        value = get(part, name)
        if isinstance(value, dict):
            return count_words(json.dumps(value.get("args" if name == "functionCall"
                                                    else "response") or {}))
    return 0


def prompt_tokens(request: dict) -> int:
    """The words of the system instruction and of every part of ``contents``."""
    words = 0
    system = get(request, "systemInstruction")
    contents = [system] if isinstance(system, dict) else []
    contents += [content for content in request.get("contents") or ()
                 if isinstance(content, dict)]
    for content in contents:
        for part in content.get("parts") or ():
            if isinstance(part, dict):
                words += _part_words(part)
    return words


def functions(request: dict) -> dict[str, dict]:
    """The request's function declarations, by name."""
    declared: dict[str, dict] = {}
    for tool in request.get("tools") or ():
        for declaration in (get(tool, "functionDeclarations") or ()
                            if isinstance(tool, dict) else ()):
            if isinstance(declaration, dict) and isinstance(declaration.get("name"), str):
                declared[declaration["name"]] = declaration
    return declared


def thinking(request: dict) -> tuple[bool, bool]:
    """(thinks, shows its thoughts): a thinkingConfig with a budget other than 0 (or a
    level) thinks; ``includeThoughts`` shows them."""
    config = get(request, "generationConfig")
    asked = get(config, "thinkingConfig") if isinstance(config, dict) else None
    if not isinstance(asked, dict):
        return False, False
    thinks = get(asked, "thinkingBudget") != 0
    return thinks, thinks and get(asked, "includeThoughts") is True


def _answers_function(request: dict) -> bool:
    contents = request.get("contents") or [{}]
    last = contents[-1] if isinstance(contents[-1], dict) else {}
    return any(isinstance(part, dict) and get(part, "functionResponse") is not None
               for part in last.get("parts") or ())


@dataclass(frozen=True)
class Steering:
    chunk_count: int
    chunk_delay: float
    cached: int
    function: str | None


def steering(headers: dict[str, str], request: dict, chunk_count: int,
             chunk_delay: float) -> Steering | str:
    """What the headers and ``toolConfig`` steer, or the problem with a header."""
    settings = stream_settings(headers, chunk_count, chunk_delay)
    if isinstance(settings, str):
        return settings
    raw = headers.get(CACHE_READ_HEADER, "0")
    if not raw.isdigit():
        return f"{CACHE_READ_HEADER} must be a non-negative integer"
    tool_config = get(request, "toolConfig")
    calling = get(tool_config, "functionCallingConfig") if isinstance(tool_config, dict) \
        else None
    calling = calling if isinstance(calling, dict) else {}
    mode = str(calling.get("mode") or "AUTO").upper()
    allowed = get(calling, "allowedFunctionNames")
    named = allowed[0] if mode == "ANY" and isinstance(allowed, list) and len(allowed) == 1 \
        else None
    function = tool_to_call(functions(request), headers, forbidden=mode == "NONE",
                            named=named, forced=mode == "ANY",
                            answering=_answers_function(request), kinds="function")
    if isinstance(function, ValueError):
        return str(function)
    return Steering(*settings, min(int(raw), prompt_tokens(request)), function)
