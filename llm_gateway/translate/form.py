"""The hub form every translator reads into and writes from: one conversation, one answer,
one stream of events, in no protocol's spelling.

A protocol's module (``chat``, ``messages``, ``responses``, ``gemini``) reads its own
requests, answers and stream events into these and writes them back out; a translation
from protocol A to protocol B is A's reader then B's writer (and the other way for the
answer). With four protocols that is four modules rather than twelve pairs, and a
round trip (A to B to A) is a test of both.

What the form holds is what at least two protocols can both say. What only one protocol
says, and that only tunes behaviour (a cache hint, a beta flag, verbosity), a reader leaves
out and names in ``Request.dropped`` (the ``x-llm-gateway-dropped`` header); what would
change the meaning of the conversation if left out (a document block, a stored
conversation's id on a stateless target) raises ``Untranslatable``.

Everything here is pure data: no I/O, no clock.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

# ---- content ------------------------------------------------------------------------------


@dataclass(slots=True)
class Text:
    text: str


@dataclass(slots=True)
class Image:
    """An image by URL (``url``) or inline (``data``, base64, with its ``media_type``).
    A ``data:`` URL is read into ``data`` and ``media_type`` by the reader."""

    url: str | None = None
    data: str | None = None
    media_type: str | None = None


@dataclass(slots=True)
class Thinking:
    """A model's reasoning: Anthropic's ``thinking`` block (``signature`` its proof, needed
    to send it back to Anthropic), chat's ``reasoning_content``, a Responses ``reasoning``
    item (``encrypted`` its ``encrypted_content``). ``redacted``: Anthropic's
    ``redacted_thinking``, whose opaque data is in ``signature``."""

    text: str
    signature: str | None = None
    encrypted: str | None = None
    redacted: bool = False


@dataclass(slots=True)
class ToolCall:
    """A call of a tool the caller defined. ``arguments``: the JSON text of a function's
    arguments, or the free-form input of a ``custom`` tool (Responses' ``apply_patch``),
    which targets without custom tools take as a function of one string argument
    (``CUSTOM_INPUT``)."""

    id: str
    name: str
    arguments: str
    kind: Literal["function", "custom"] = "function"


@dataclass(slots=True)
class ToolResult:
    """What the caller's tool returned for the call ``call_id``."""

    call_id: str
    content: list[Text | Image]
    is_error: bool = False
    kind: Literal["function", "custom"] = "function"


@dataclass(slots=True)
class Refusal:
    """A model's refusal (chat's ``refusal``, Responses' ``refusal`` content)."""

    text: str


Part = Text | Image | Thinking | ToolCall | ToolResult | Refusal

# The argument a custom (free-form) tool's input travels in on a target that only has
# function tools; its call comes back to the caller as a custom call again.
CUSTOM_INPUT = "input"


@dataclass(slots=True)
class Turn:
    """One message of the conversation. ``role``: ``user``, ``assistant``, ``tool`` (the
    parts are ToolResults) or ``system`` (an instruction in the middle of the
    conversation; the leading ones are ``Request.system``)."""

    role: Literal["user", "assistant", "tool", "system"]
    parts: list[Part]


# ---- the request ----------------------------------------------------------------------------


@dataclass(slots=True)
class Tool:
    """A tool the model may call: a function with a JSON schema, or a ``custom`` tool with
    free-form input (no schema; ``grammar`` kept for a target that takes one)."""

    name: str
    description: str | None = None
    parameters: dict | None = None
    kind: Literal["function", "custom"] = "function"
    strict: bool | None = None
    # A custom tool's input format as Responses says it ({"type": "grammar", "syntax",
    # "definition"} or {"type": "text"}), for a target that takes one.
    grammar: dict | None = None


@dataclass(slots=True)
class ToolChoice:
    """``auto``, ``none``, ``required`` (any tool), or ``tool`` (the one named)."""

    mode: Literal["auto", "none", "required", "tool"]
    name: str | None = None


@dataclass(slots=True)
class Reasoning:
    """How much the model should think: an ``effort`` (Responses' and chat's
    ``reasoning_effort``), a ``budget_tokens`` (Anthropic's ``thinking.budget_tokens``,
    Gemini's ``thinkingBudget``), or both; ``enabled`` False: thinking off. A writer
    whose protocol speaks the other one maps it (``effort_for_budget``,
    ``budget_for_effort``)."""

    effort: Literal["minimal", "low", "medium", "high"] | None = None
    budget_tokens: int | None = None
    enabled: bool = True
    summary: str | None = None  # Responses' reasoning.summary


@dataclass(slots=True)
class OutputFormat:
    """Structured output: ``json_object`` (any JSON) or ``json_schema`` (``schema``)."""

    kind: Literal["json_object", "json_schema"]
    schema: dict | None = None
    name: str | None = None
    strict: bool | None = None


@dataclass(slots=True)
class Request:
    model: str
    system: list[Text] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    tools: list[Tool] = field(default_factory=list)
    tool_choice: ToolChoice | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    # Chat's stream_options.include_usage: a chat caller gets the usage chunk only if asked.
    stream_usage: bool = False
    reasoning: Reasoning | None = None
    output_format: OutputFormat | None = None
    user: str | None = None  # the end user's id (chat's user, Anthropic's metadata.user_id)
    # A stored conversation this request continues (Responses' previous_response_id): a
    # writer whose target keeps none refuses it.
    previous_response_id: str | None = None
    # When the gateway took the request (unix seconds): a writer's ``created`` where the
    # target said none (Anthropic's answers carry no time). Set by the Translation.
    now: int = 0
    # What the caller sent that the form does not carry, by the caller's field names
    # ("cache_control", "tools[web_search]", "anthropic-beta"); the writer adds what its
    # target cannot take.
    dropped: list[str] = field(default_factory=list)


# ---- the answer ----------------------------------------------------------------------------

# Why the model stopped, in no protocol's words.
Stop = Literal["end", "length", "tool", "filter", "refusal", "stop_sequence", "pause"]


@dataclass(slots=True)
class Usage:
    """Token counts of one answer. ``input_tokens`` counts every input token, cached ones
    included (OpenAI's way; a reader of Anthropic's adds its cache tokens, a writer of
    Anthropic's takes them out); ``output_tokens`` includes reasoning."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0


@dataclass(slots=True)
class Reply:
    id: str
    model: str
    parts: list[Part] = field(default_factory=list)  # Text, Thinking, ToolCall, Refusal
    stop: Stop = "end"
    stop_sequence: str | None = None
    usage: Usage | None = None
    created: int | None = None  # unix seconds, where the target said


# ---- a stream, event by event ------------------------------------------------------------
#
# A reader turns each of its protocol's stream events into zero or more of these; a writer
# turns each of these into zero or more frames of its own protocol. Order: one Begin, then
# deltas in the order they came, then one Finish, whatever the target's protocol said in
# between (a chat stream's finish_reason comes before its usage chunk: its reader holds the
# finish until the stream's end). A stream whose target failed in band ends with Failure
# instead. ``index``: the ordinal of the text, thinking block or tool call within the
# answer as the reader counts them (a writer numbers its own blocks).


@dataclass(slots=True)
class Begin:
    id: str
    model: str
    usage: Usage | None = None  # what the target said of the prompt at the start
    created: int | None = None


@dataclass(slots=True)
class TextDelta:
    text: str
    index: int = 0


@dataclass(slots=True)
class ThinkingDelta:
    text: str = ""
    signature: str | None = None  # Anthropic's signature_delta: the block's proof
    index: int = 0
    encrypted: str | None = None  # a Responses reasoning item's encrypted_content (at its end)


@dataclass(slots=True)
class ToolCallBegin:
    index: int  # the call's ordinal among the answer's tool calls
    id: str
    name: str
    kind: Literal["function", "custom"] = "function"


@dataclass(slots=True)
class ToolArgumentsDelta:
    index: int
    fragment: str


@dataclass(slots=True)
class RefusalDelta:
    text: str


@dataclass(slots=True)
class Finish:
    stop: Stop
    usage: Usage | None = None
    stop_sequence: str | None = None


@dataclass(slots=True)
class Failure:
    """The target's stream failed in band (its error event)."""

    message: str
    type: str = "api_error"  # as in the caller's error catalogue: see errors.CATALOGUE
    status: int = 500


Event = (Begin | TextDelta | ThinkingDelta | ToolCallBegin | ToolArgumentsDelta | RefusalDelta
         | Finish | Failure)


# ---- what cannot cross ------------------------------------------------------------------------


class Untranslatable(Exception):
    """What the target's protocol cannot say without changing the conversation's meaning:
    400 ``unsupported_parameter`` naming ``field`` (or the alias's next target that can)."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"'{field}' {reason}")
        self.field = field
        self.reason = reason


# ---- reasoning: a budget in tokens and an effort are two spellings of one wish ------------

# Anthropic's documented minimum budget is 1 024 tokens; the efforts' budgets follow
# the shares LiteLLM and OpenRouter use (low 1 024 / medium 2 048 / high 4 096), capped by the
# output cap (a budget must stay below max_tokens).
EFFORT_BUDGETS: dict[str, int] = {"minimal": 1024, "low": 1024, "medium": 2048, "high": 4096}
MIN_BUDGET = 1024


def budget_for_effort(effort: str | None, max_output_tokens: int | None) -> int:
    """The thinking budget that stands for ``effort``, below the output cap when there is
    one (Anthropic requires budget_tokens < max_tokens)."""
    budget = EFFORT_BUDGETS.get(effort or "medium", EFFORT_BUDGETS["medium"])
    if max_output_tokens is not None:
        budget = min(budget, max(MIN_BUDGET, max_output_tokens - 1))
    return budget


def effort_for_budget(budget_tokens: int | None) -> str:
    """The effort that stands for a thinking budget."""
    if budget_tokens is None:
        return "medium"
    if budget_tokens <= EFFORT_BUDGETS["low"]:
        return "low"
    if budget_tokens <= EFFORT_BUDGETS["medium"]:
        return "medium"
    return "high"
