"""The fake Responses API's store: the responses it keeps (per API key, as OpenAI keeps projects
apart; the newest :data:`MAX_STORED_RESPONSES`), how a retrieval sees one now (a background
response queued, then done; a cancelled one), and its input items as the API lists them."""

import time
from collections import OrderedDict
from dataclasses import dataclass

from llm_gateway.testing.fake_content import openai_id

MAX_STORED_RESPONSES = 10_000

_ITEM_ID_PREFIXES = {
    "message": "msg_", "function_call": "fc_", "function_call_output": "fco_",
    "custom_tool_call": "ctc_", "custom_tool_call_output": "ctco_", "reasoning": "rs_",
}


def listed_item(item: dict[str, object]) -> dict[str, object]:
    """An input item as the API lists it: with an id, a message's text as content parts."""
    listed = {"id": openai_id(_ITEM_ID_PREFIXES.get(str(item.get("type")), "item_")), **item}
    if item.get("type") == "message":
        content = item.get("content")
        if isinstance(content, str):
            part = "output_text" if item.get("role") == "assistant" else "input_text"
            listed["content"] = [{"type": part, "text": content}]
        listed.setdefault("status", "completed")
    return listed


@dataclass
class StoredResponse:
    response: dict[str, object]  # the response once done
    input_items: list[dict[str, object]]  # its own input, each item with an id
    context: list[dict[str, object]]  # the conversation it ends: earlier turns, input, output
    background: bool
    ready_at: float  # time.monotonic() at which a background response is done
    cancelled: bool = False

    def current(self) -> dict[str, object]:
        """The response as a retrieval sees it now."""
        if self.cancelled:
            return {**self.response, "status": "cancelled", "output": [], "usage": None,
                    "completed_at": None}
        if self.background and time.monotonic() < self.ready_at:
            return {**self.response, "status": "in_progress", "output": [], "usage": None,
                    "completed_at": None, "incomplete_details": None}
        return self.response


class ResponseStore:
    """Stored responses by (API key, id), the oldest dropped beyond ``limit`` (OpenAI keeps
    them 30 days; a long benchmark run must not keep them all)."""

    def __init__(self, limit: int = MAX_STORED_RESPONSES) -> None:
        self.limit = limit
        self._stored: OrderedDict[tuple[str, str], StoredResponse] = OrderedDict()

    def put(self, api_key: str, stored: StoredResponse) -> None:
        self._stored[(api_key, str(stored.response["id"]))] = stored
        while len(self._stored) > self.limit:
            self._stored.popitem(last=False)

    def get(self, api_key: str, response_id: str) -> StoredResponse | None:
        return self._stored.get((api_key, response_id))

    def delete(self, api_key: str, response_id: str) -> bool:
        return self._stored.pop((api_key, response_id), None) is not None

    def ids(self, api_key: str) -> list[str]:
        return [response_id for key, response_id in self._stored if key == api_key]

    def clear(self) -> None:
        self._stored.clear()

    def __len__(self) -> int:
        return len(self._stored)
