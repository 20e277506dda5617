"""What a chat completion decides beyond plain text, in the venice and openai modes: the checks
the providers make of a conversation with tool calls (:func:`chat_problem`), the function tool
a turn calls (:func:`chat_tool_to_call`, as ``fake_agent_reply`` decides it for Anthropic and
Responses), whether it reasons first (:func:`chat_thinking`), and the reply that follows, planned
whole (:func:`plan_chat`) so that its JSON answer, its stream deltas and its usage agree.

A tool call is OpenAI's: the message's ``content`` is null, ``tool_calls`` holds one
``{"id": "call_…", "type": "function", "function": {"name", "arguments"}}`` (``arguments`` the
JSON text of :func:`fake_tool_arguments` for the tool's ``parameters``) and ``finish_reason`` is
``"tool_calls"``. Streamed, the first delta names the call (``tool_calls[{index 0, id, type,
function {name, arguments ""}}]``), the arguments follow in fragments
(``tool_calls[{index 0, function {arguments}}]``), then the finish chunk. The id is
:func:`chat_call_id`: derived from the request, so a test can predict it, and one per choice.

Reasoning is Venice's and DeepSeek's ``reasoning_content``: in the message, and streamed in
deltas before the content or the tool call; its :data:`THINKING_TOKENS` are part of
``completion_tokens`` and reported as ``completion_tokens_details.reasoning_tokens``. Venice
reasons when asked (``reasoning_effort``, or ``reasoning.effort``, other than ``"none"``;
``venice_parameters.disable_thinking`` forbids it, ``strip_thinking_response`` keeps the tokens
and drops the text: docs.venice.ai, guides/features/reasoning-models and the model feature
suffixes). OpenAI reasons on ``reasoning_effort`` other than ``"none"`` and, as its chat API
does, bills the reasoning tokens without ever sending their text.
"""

import hashlib
import json
from dataclasses import dataclass

from llm_gateway.testing.fake_agent_reply import FittedReply, fit_reply, tool_to_call
from llm_gateway.testing.fake_content import (
    FAKE_THINKING_TEXT,
    count_words,
    fake_reply_chunk,
    fake_reply_text,
    fake_tool_arguments,
    prompt_word_count,
)
from llm_gateway.testing.fake_exchange import Exchange, send_json

# The reasoning efforts each provider takes (OpenAI's reference; Venice's reasoning-models guide).
OPENAI_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
VENICE_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
_UNCAPPED = 1 << 62


@dataclass(frozen=True)
class Problem:
    """A 400 for a conversation or a setting the provider refuses. OpenAI's body names
    ``param`` (its ``messages.[1].tool_calls.[0].id`` spelling) and ``code``; Venice's is a
    zod issue at ``path`` when there is one (a field missing or mistyped), else its plain
    ``{"error": message}``."""

    message: str
    param: str
    code: str | None = None
    path: tuple[str | int, ...] = ()
    zod_code: str = "invalid_type"
    zod_message: str = "Required"

    async def send(self, exchange: Exchange) -> None:
        if exchange.provider != "venice":
            await exchange.send_error(400, self.message, param=self.param, code=self.code)
        elif self.path:
            issue = {"code": self.zod_code, "path": list(self.path), "message": self.zod_message}
            await send_json(exchange.send, 400, {"error": "Invalid request", "issues": [issue]})
        else:
            await exchange.send_error(400, self.message)


def _missing(where: list[str | int]) -> Problem:
    """OpenAI's "Missing required parameter" for the field at ``where``."""
    spelled = str(where[0]) + "".join(
        f"[{part}]" if isinstance(part, int) else f".{part}" for part in where[1:])
    param = ".".join(f"[{part}]" if isinstance(part, int) else part for part in where)
    return Problem(f"Missing required parameter: '{spelled}'.", param,
                   "missing_required_parameter", tuple(where))


def _effort_problem(request: dict[str, object], provider: str) -> Problem | None:
    effort = request.get("reasoning_effort")
    efforts = VENICE_EFFORTS if provider == "venice" else OPENAI_EFFORTS
    if effort is None or effort in efforts:
        return None
    quoted = [f"'{name}'" for name in efforts]
    listed = ", ".join(quoted[:-1]) + ", and " + quoted[-1]
    given = f"'{effort}'" if isinstance(effort, str) else json.dumps(effort)
    return Problem(f"Invalid value: {given}. Supported values are: {listed}.",
                   "reasoning_effort", "invalid_value", ("reasoning_effort",),
                   "invalid_enum_value",
                   f"Invalid enum value. Expected {' | '.join(quoted)}, received {given}")


def _tool_calls_problem(index: int, calls: object) -> Problem | None:
    """What is wrong with an assistant message's ``tool_calls``: each entry needs its id and
    its function's name and arguments."""
    if not isinstance(calls, list):
        return Problem(f"Invalid type for 'messages[{index}].tool_calls': expected an array.",
                       f"messages.[{index}].tool_calls", "invalid_type",
                       ("messages", index, "tool_calls"), zod_message="Expected array")
    for position, call in enumerate(calls):
        where: list[str | int] = ["messages", index, "tool_calls", position]
        if not isinstance(call, dict):
            return Problem(f"Invalid type for 'messages[{index}].tool_calls[{position}]': "
                           "expected an object.", f"messages.[{index}].tool_calls.[{position}]",
                           "invalid_type", tuple(where), zod_message="Expected object")
        if not isinstance(call.get("id"), str):
            return _missing([*where, "id"])
        function = call.get("function")
        if not isinstance(function, dict):
            return _missing([*where, "function"])
        for name in ("name", "arguments"):
            if not isinstance(function.get(name), str):
                return _missing([*where, "function", name])
    return None


def _unanswered(index: int, ids: list[str]) -> Problem:
    return Problem("An assistant message with 'tool_calls' must be followed by tool messages "
                   "responding to each 'tool_call_id'. The following tool_call_ids did not have "
                   f"response messages: {', '.join(ids)}", f"messages.[{index}].role")


def _messages_problem(messages: list[object], provider: str) -> Problem | None:
    """What the provider refuses in the conversation: a ``tool`` message must answer a call of
    the assistant message its run of tool messages follows, and that message's calls must be
    well formed. OpenAI also wants every call answered before the conversation goes on (Venice,
    vLLM underneath, does not check)."""
    calls_at = -1  # the assistant message the current run of tool messages answers
    open_ids: list[str] = []  # its calls not answered yet
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            continue
        role = message.get("role")
        if role == "tool":
            if calls_at < 0:
                return Problem("Invalid parameter: messages with role 'tool' must be a response "
                               "to a preceeding message with 'tool_calls'.",
                               f"messages.[{index}].role")
            call_id = message.get("tool_call_id")
            if not isinstance(call_id, str):
                return _missing(["messages", index, "tool_call_id"])
            if call_id not in open_ids and call_id not in _call_ids(messages[calls_at]):
                return Problem(f"Invalid parameter: 'tool_call_id' of '{call_id}' not found in "
                               "'tool_calls' of previous message.",
                               f"messages.[{index}].tool_call_id")
            open_ids = [open_id for open_id in open_ids if open_id != call_id]
            continue
        if open_ids and provider == "openai":
            return _unanswered(calls_at, open_ids)
        calls_at, open_ids = -1, []
        calls = message.get("tool_calls")
        if role == "assistant" and calls is not None:
            if (problem := _tool_calls_problem(index, calls)) is not None:
                return problem
            if calls:
                calls_at, open_ids = index, _call_ids(message)
    if open_ids and provider == "openai":
        return _unanswered(calls_at, open_ids)
    return None


def _call_ids(message: object) -> list[str]:
    calls = message.get("tool_calls") if isinstance(message, dict) else None
    return [call["id"] for call in (calls if isinstance(calls, list) else [])
            if isinstance(call, dict) and isinstance(call.get("id"), str)]


def chat_problem(request: dict[str, object], messages: list[object],
                 provider: str) -> Problem | None:
    """The first thing the provider would refuse in a chat completion's tools, reasoning or
    conversation, or None."""
    if provider == "openai" and request.get("tool_choice") is not None \
            and request.get("tools") is None:
        return Problem("Invalid value for 'tool_choice': 'tool_choice' is only allowed when "
                       "'tools' are specified.", "tool_choice")
    return _effort_problem(request, provider) or _messages_problem(messages, provider)


def function_tools(request: dict[str, object]) -> dict[str, dict[str, object]]:
    """The request's function tools (name -> its ``function``): the ones the fake can call."""
    tools = request.get("tools")
    functions = (tool.get("function") for tool in (tools if isinstance(tools, list) else [])
                 if isinstance(tool, dict) and tool.get("type") == "function")
    return {function["name"]: function for function in functions
            if isinstance(function, dict) and isinstance(function.get("name"), str)}


def chat_tool_to_call(request: dict[str, object], messages: list[object],
                      headers: dict[str, str]) -> str | ValueError | None:
    """The function the reply calls (see :func:`tool_to_call`): ``tool_choice`` ``"none"``
    forbids, ``"required"`` forces, ``{"type": "function", "function": {"name"}}`` names one;
    a turn whose last message is a ``tool`` result is answering it."""
    choice = request.get("tool_choice")
    function = choice.get("function") if isinstance(choice, dict) \
        and choice.get("type") == "function" else None
    named = function.get("name") if isinstance(function, dict) else None
    last = messages[-1] if messages else None
    answering = isinstance(last, dict) and last.get("role") == "tool"
    return tool_to_call(function_tools(request), headers, forbidden=choice == "none",
                        named=named, forced=choice == "required", answering=answering,
                        kinds="function tool")


def chat_thinking(request: dict[str, object], provider: str) -> tuple[bool, bool]:
    """(the reply reasons first, its reasoning text is sent)."""
    effort = request.get("reasoning_effort")
    if provider != "venice":
        return effort is not None and effort != "none", False
    reasoning = request.get("reasoning")
    if effort is None and isinstance(reasoning, dict):
        effort = reasoning.get("effort")
    parameters = request.get("venice_parameters")
    parameters = parameters if isinstance(parameters, dict) else {}
    if parameters.get("disable_thinking") is True:
        return False, False
    return (effort is not None and effort != "none",
            parameters.get("strip_thinking_response") is not True)


def chat_call_id(request: dict[str, object], choice: int = 0) -> str:
    """The id of the tool call choice ``choice`` makes: the same for the same request, and
    another for each choice and each turn (whose conversation differs)."""
    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"))
    return "call_" + hashlib.sha256(f"{canonical}\0{choice}".encode()).hexdigest()[:24]


def chat_prompt_tokens(messages: list[object]) -> int:
    """The words of every text content, as for a plain chat, and of the arguments of the
    conversation's tool calls."""
    arguments = 0
    for message in messages:
        for call in (message.get("tool_calls") if isinstance(message, dict) else None) or []:
            function = call.get("function") if isinstance(call, dict) else None
            if isinstance(function, dict) and isinstance(function.get("arguments"), str):
                arguments += count_words(function["arguments"])
    return prompt_word_count(messages) + arguments


def _fragments(text: str, count: int = 3) -> list[str]:
    """``text`` in up to ``count`` non-empty pieces, as a model streams a call's arguments."""
    size = max(1, -(-len(text) // count))
    return [text[start:start + size] for start in range(0, len(text), size)]


@dataclass(frozen=True)
class ChatPlan:
    """One chat completion's reply, the same in every choice but for its call id."""

    fitted: FittedReply
    shows_reasoning: bool
    tool: tuple[str, str] | None  # (name, arguments) of the call the reply makes
    call_ids: tuple[str, ...]  # one per choice
    finish_reason: str

    @property
    def calls_tool(self) -> bool:
        return self.fitted.calls_tool and self.tool is not None

    def message(self, choice: int) -> dict[str, object]:
        message: dict[str, object] = {
            "role": "assistant",
            "content": None if self.calls_tool else fake_reply_text(self.fitted.chunks)}
        if self.fitted.thinks and self.shows_reasoning:
            message["reasoning_content"] = FAKE_THINKING_TEXT
        if self.calls_tool and self.tool is not None:
            name, arguments = self.tool
            message["tool_calls"] = [{"id": self.call_ids[choice], "type": "function",
                                      "function": {"name": name, "arguments": arguments}}]
        return message

    def head(self) -> dict[str, object] | None:
        """The stream's first delta when it comes alone (the role), or None when the tool
        call's first delta carries the role, as OpenAI streams a call."""
        if self.calls_tool and not self._reasoning_pieces():
            return None
        return {"role": "assistant", "content": None if self.calls_tool else ""}

    def deltas(self, choice: int) -> list[dict[str, object]]:
        """The deltas after :meth:`head`, each one paced as a content chunk."""
        deltas: list[dict[str, object]] = [
            {"reasoning_content": piece} for piece in self._reasoning_pieces()]
        if self.calls_tool and self.tool is not None:
            name, arguments = self.tool
            call = {"index": 0, "id": self.call_ids[choice], "type": "function",
                    "function": {"name": name, "arguments": ""}}
            first: dict[str, object] = {"tool_calls": [call]}
            if not deltas:
                first = {"role": "assistant", "content": None, **first}
            deltas.append(first)
            deltas += [{"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}
                       for piece in _fragments(arguments)]
        else:
            deltas += [{"content": fake_reply_chunk(index)}
                       for index in range(self.fitted.chunks)]
        return deltas

    def _reasoning_pieces(self) -> list[str]:
        if not (self.fitted.thinks and self.shows_reasoning):
            return []
        words = FAKE_THINKING_TEXT.split(" ")
        middle = len(words) // 2
        return [" ".join(words[:middle]), " " + " ".join(words[middle:])]

    @property
    def paced_count(self) -> int:
        return len(self.deltas(0))


def plan_chat(request: dict[str, object], *, provider: str, chunk_count: int,
              tool_name: str | None, choices: int) -> tuple[ChatPlan, bool]:
    """The reply, as much of it as ``max_tokens`` (or ``max_completion_tokens``) leaves, and
    whether reasoning was asked. A cut reply that reasons or calls a tool ends with
    ``"length"``; a plain text one keeps the fake's ``"stop"``."""
    cap = next((value for value in (request.get("max_tokens"),
                                    request.get("max_completion_tokens"))
                if isinstance(value, int) and not isinstance(value, bool) and value >= 0),
               _UNCAPPED)
    thinks, shows = chat_thinking(request, provider)
    fitted = fit_reply(cap, thinks=thinks, calls_tool=tool_name is not None,
                       chunk_count=chunk_count)
    tool = None
    if tool_name is not None:
        schema = function_tools(request)[tool_name].get("parameters")
        tool = (tool_name, json.dumps(fake_tool_arguments(schema)))
    if fitted.calls_tool:
        finish = "tool_calls"
    elif fitted.cut and (thinks or tool is not None):
        finish = "length"
    else:
        finish = "stop"
    call_ids = tuple(chat_call_id(request, choice) for choice in range(choices)) \
        if tool is not None else ()
    return ChatPlan(fitted, shows, tool, call_ids, finish), thinks
