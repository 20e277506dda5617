"""A Messages caller's body (Claude Code, the anthropic SDKs) into the hub form: the system
prompt and a ``system``-role message inside ``messages``, text, images, tool use and results,
thinking with its signature, client tools (server tools dropped, named ``tools[<type>]``),
``tool_choice``, ``thinking`` and ``output_config``, structured outputs, the sampling fields;
what only tunes Anthropic's serving (``cache_control``, ``context_management``, ...) is
named in ``dropped``, content no other protocol reads (a document) refused.
"""

from __future__ import annotations

from llm_gateway.translate.form import (
    Image,
    OutputFormat,
    Part,
    Reasoning,
    Request,
    Text,
    Thinking,
    Tool,
    ToolCall,
    ToolChoice,
    ToolResult,
    Turn,
    Untranslatable,
)
from llm_gateway.translate.messages_reply import (
    drop,
    image_url,
    json_text,
)

# Top-level fields that only tune how Anthropic serves the request: dropped, named.
_TUNING_FIELDS = ("top_k", "context_management", "service_tier", "container", "mcp_servers",
                  "cache_control", "speed", "inference_geo", "diagnostics")
# What read_request reads itself.
_READ_FIELDS = frozenset({
    "model", "messages", "system", "max_tokens", "temperature", "top_p", "stop_sequences",
    "stream", "metadata", "tools", "tool_choice", "thinking", "output_config",
    "output_format"})

# Anthropic's output_config.effort has two steps above the form's highest.
_EFFORT_OF = {"minimal": "minimal", "low": "low", "medium": "medium", "high": "high",
              "xhigh": "high", "max": "high"}

# ---- the caller's side: reading a body ------------------------------------------------------


def _cache_hint(request: Request, block: dict) -> None:
    if "cache_control" in block:
        drop(request, "cache_control")


def _image(source: object, where: str) -> Image:
    if not isinstance(source, dict):
        raise Untranslatable(where, "is an image without a source")
    kind = source.get("type")
    if kind == "base64" and isinstance(source.get("data"), str):
        media = source.get("media_type")
        return Image(data=source["data"], media_type=media if isinstance(media, str) else None)
    if kind == "url" and isinstance(source.get("url"), str):
        return image_url(source["url"])
    # A file_id (the Files API) names content only Anthropic holds.
    raise Untranslatable(where, f"is an image by a {kind!r} source, which only Anthropic reads")


def _result_content(request: Request, content: object, where: str) -> list[Text | Image]:
    if content is None:
        return []
    if isinstance(content, str):
        return [Text(content)]
    if not isinstance(content, list):
        raise Untranslatable(where, "is a tool result of no known shape")
    parts: list[Text | Image] = []
    for k, block in enumerate(content):
        inner = f"{where}.content[{k}]"
        if not isinstance(block, dict):
            raise Untranslatable(inner, "is no content block")
        _cache_hint(request, block)
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            parts.append(Text(block["text"]))
        elif block.get("type") == "image":
            parts.append(_image(block.get("source"), inner))
        else:
            raise Untranslatable(inner, f"is a {block.get('type')!r} block, which only "
                                        "Anthropic reads")
    return parts


def _block(request: Request, block: object, role: str, where: str) -> Part:
    if not isinstance(block, dict):
        raise Untranslatable(where, "is no content block")
    _cache_hint(request, block)
    kind = block.get("type")
    if kind == "text" and isinstance(block.get("text"), str):
        if block.get("citations"):
            drop(request, "citations")
        return Text(block["text"])
    if kind == "image":
        return _image(block.get("source"), where)
    if kind == "tool_use" and role == "assistant":
        return ToolCall(str(block.get("id", "")), str(block.get("name", "")),
                        json_text(block.get("input") or {}))
    if kind == "tool_result" and role == "user":
        return ToolResult(str(block.get("tool_use_id", "")),
                          _result_content(request, block.get("content"), where),
                          is_error=block.get("is_error") is True)
    if kind == "thinking" and role == "assistant":
        signature = block.get("signature")
        return Thinking(str(block.get("thinking", "")),
                        signature=signature if isinstance(signature, str) and signature
                        else None)
    if kind == "redacted_thinking" and role == "assistant":
        return Thinking("", signature=str(block.get("data", "")), redacted=True)
    # document, search_result, container_upload, server tool use and its results: content
    # another protocol cannot hold, whose loss would change what the model is answering.
    raise Untranslatable(where, f"is a {kind!r} block, which only Anthropic reads")


def _turns(request: Request, index: int, message: object) -> list[Turn]:
    """One message as turns: a user message's tool results are a ``tool`` turn of their
    own (runs of them, in their order, around its other content)."""
    where = f"messages[{index}]"
    if not isinstance(message, dict):
        raise Untranslatable(where, "is no message")
    role = message.get("role")
    if role not in ("user", "assistant", "system"):
        raise Untranslatable(f"{where}.role", f"is {role!r}")
    content = message.get("content")
    if isinstance(content, str):
        parts: list[Part] = [Text(content)]
    elif isinstance(content, list):
        parts = [_block(request, block, "user" if role == "system" else role,
                        f"{where}.content[{j}]") for j, block in enumerate(content)]
    else:
        raise Untranslatable(f"{where}.content", "is neither text nor blocks")
    if role == "system" and not all(isinstance(part, Text) for part in parts):
        raise Untranslatable(f"{where}.content", "is a system message with more than text")
    if role != "user":
        return [Turn(role, parts)]
    turns: list[Turn] = []
    for part in parts:
        run_role = "tool" if isinstance(part, ToolResult) else "user"
        if turns and turns[-1].role == run_role:
            turns[-1].parts.append(part)
        else:
            turns.append(Turn(run_role, [part]))
    return turns or [Turn("user", [])]


def _system(request: Request, system: object) -> list[Text]:
    if system is None:
        return []
    if isinstance(system, str):
        return [Text(system)] if system else []
    if not isinstance(system, list):
        raise Untranslatable("system", "is neither text nor blocks")
    texts = []
    for i, block in enumerate(system):
        if not isinstance(block, dict) or block.get("type") != "text" \
                or not isinstance(block.get("text"), str):
            raise Untranslatable(f"system[{i}]", "is no text block")
        _cache_hint(request, block)
        texts.append(Text(block["text"]))
    return texts


def _tools(request: Request, tools: object) -> list[Tool]:
    read = []
    for tool in tools if isinstance(tools, list) else ():
        if not isinstance(tool, dict):
            continue
        kind = tool.get("type")
        if kind not in (None, "custom"):
            # A server tool (web_search_20250305, bash_20250124, code_execution_...):
            # Anthropic runs it; no other target can.
            drop(request, f"tools[{kind}]")
            continue
        _cache_hint(request, tool)
        for name in ("defer_loading", "input_examples", "eager_input_streaming",
                     "allowed_callers"):
            if name in tool:
                drop(request, name)
        schema = tool.get("input_schema")
        description = tool.get("description")
        strict = tool.get("strict")
        read.append(Tool(str(tool.get("name", "")),
                         description if isinstance(description, str) else None,
                         schema if isinstance(schema, dict) else None,
                         strict=strict if isinstance(strict, bool) else None))
    return read


def _tool_choice(request: Request, choice: object) -> None:
    if not isinstance(choice, dict):
        return
    mode = {"auto": "auto", "any": "required", "tool": "tool", "none": "none"}.get(
        str(choice.get("type")))
    if mode is None:
        raise Untranslatable("tool_choice.type", f"is {choice.get('type')!r}")
    name = choice.get("name")
    request.tool_choice = ToolChoice(mode, name if mode == "tool" and isinstance(name, str)
                                     else None)  # type: ignore[arg-type]
    if choice.get("disable_parallel_tool_use") is True:
        request.parallel_tool_calls = False


def _reasoning(request: Request, thinking: object, effort: str | None) -> Reasoning | None:
    if not isinstance(thinking, dict):
        return Reasoning(effort=effort) if effort else None  # type: ignore[arg-type]
    if thinking.get("display") is not None:
        drop(request, "thinking.display")
    kind = thinking.get("type")
    if kind == "disabled":
        return Reasoning(enabled=False)
    if kind == "enabled":
        budget = thinking.get("budget_tokens")
        return Reasoning(effort=effort,  # type: ignore[arg-type]
                         budget_tokens=budget if isinstance(budget, int) else None)
    # adaptive (and between_tools): Claude decides how much; an effort says how hard.
    return Reasoning(effort=effort)  # type: ignore[arg-type]


def _output_format(value: object) -> OutputFormat | None:
    if isinstance(value, dict) and value.get("type") == "json_schema" \
            and isinstance(value.get("schema"), dict):
        return OutputFormat("json_schema", value["schema"])
    return None


def read_request(payload: dict) -> Request:
    request = Request(model=str(payload.get("model", "")))
    request.system = _system(request, payload.get("system"))
    for index, message in enumerate(payload.get("messages") or ()):
        request.turns.extend(_turns(request, index, message))
    request.tools = _tools(request, payload.get("tools"))
    _tool_choice(request, payload.get("tool_choice"))
    config = payload.get("output_config")
    config = config if isinstance(config, dict) else {}
    effort = _EFFORT_OF.get(str(config.get("effort")))
    request.reasoning = _reasoning(request, payload.get("thinking"), effort)
    request.output_format = (_output_format(config.get("format"))
                             or _output_format(payload.get("output_format")))
    max_tokens = payload.get("max_tokens")
    request.max_output_tokens = max_tokens if isinstance(max_tokens, int) else None
    for name in ("temperature", "top_p"):
        value = payload.get(name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            setattr(request, name, float(value))
    stops = payload.get("stop_sequences")
    request.stop = [stop for stop in stops if isinstance(stop, str)] \
        if isinstance(stops, list) else []
    request.stream = payload.get("stream") is True
    metadata = payload.get("metadata")
    if isinstance(metadata, dict) and isinstance(metadata.get("user_id"), str):
        request.user = metadata["user_id"]
    for name in _TUNING_FIELDS:
        if name in payload:
            drop(request, name)
    for name in payload:
        if name not in _READ_FIELDS and name not in _TUNING_FIELDS:
            drop(request, name)  # what a newer API version or a beta added
    return request
