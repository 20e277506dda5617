"""A stream whose upstream frames nothing (no Content-Length, no chunks: its body ends with
its connection) and is cut short ends for the client as a chunked stream cut short does:
with the protocol's in-band error event (then ``[DONE]`` where the protocol has one), on
every surface, and its record says ``upstream_stream_interrupted``. It used to end quietly
(the connection's close looked like the body's end), the record alone saying
``stream_incomplete``. A whole close-delimited stream is still relayed whole and clean."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from llm_gateway.billing.records import UsageRecord
from llm_gateway.testing.fake_close_delimited import running_close_delimited
from llm_gateway.testing.fake_upstream import FakeUpstream, Fault
from llm_gateway.testing.records import RecordedUsage
from tests.surfaces import SURFACES, Surface, local_surface

pytestmark = pytest.mark.slow_once  # in-process servers of their own, no shared backend

MODEL = "llama-3.3-70b"
ASKED = {  # path, body: a stream in each client protocol, to the fake's chat completions
    "chat": ("/chat/completions", {"model": MODEL, "stream": True,
                                   "messages": [{"role": "user", "content": "Hi"}]}),
    "messages": ("/messages", {"model": MODEL, "stream": True, "max_tokens": 200,
                               "messages": [{"role": "user", "content": "Hi"}]}),
    "responses": ("/responses", {"model": MODEL, "stream": True, "input": "Hi"}),
}


@pytest.fixture(scope="module")
def unframed() -> Iterator[tuple[FakeUpstream, str]]:
    with running_close_delimited() as served:
        yield served


def streamed(on: Surface, protocol: str, fault: Fault | None, fake: FakeUpstream,
             ) -> tuple[list[bytes], UsageRecord]:
    """The stream's SSE frames as the client got them, and its usage record."""
    finished = RecordedUsage()
    on.gateway.add_record_sink(finished)
    if fault is not None:
        fake.push_fault(fault)
    path, body = ASKED[protocol]
    answer = on.send(path, json.dumps(body).encode(), {"authorization": f"Bearer {on.key()}"})
    assert answer.status == 200, answer.body[:300]
    [record] = finished.wait_for(1)
    return answer.body.strip().split(b"\n\n"), record


@pytest.mark.parametrize("name", SURFACES)
def test_a_cut_close_delimited_stream_ends_with_the_error_event(
        name: str, tmp_path: Path, unframed: tuple[FakeUpstream, str]) -> None:
    fake, url = unframed
    fake.reset()
    with local_surface(name, tmp_path, url) as on:
        frames, record = streamed(on, "chat", Fault(cut_after_chunks=2), fake)
    *_, error, done = frames
    assert json.loads(error.removeprefix(b"data: "))["error"]["code"] == (
        "upstream_stream_interrupted")
    assert done == b"data: [DONE]"
    assert (record.status, record.error_code) == (200, "upstream_stream_interrupted")
    assert record.tokens_estimated  # metered from what was relayed


@pytest.mark.parametrize("protocol", sorted(ASKED))
def test_the_end_is_the_one_a_chunked_cut_gets(
        protocol: str, tmp_path: Path, unframed: tuple[FakeUpstream, str],
        fake_server: tuple[FakeUpstream, str]) -> None:
    """The same last events, whatever framed the body: one rule, in the engine."""
    ends = {}
    for framing, (fake, url) in {"chunked": fake_server, "close": unframed}.items():
        fake.reset()
        with local_surface("serve", tmp_path / framing, url) as on:
            frames, record = streamed(on, protocol, Fault(cut_after_chunks=2), fake)
        assert record.error_code == "upstream_stream_interrupted", framing
        ends[framing] = [_without_ids(frame) for frame in frames[-2:]]
    assert ends["close"] == ends["chunked"]
    assert b"stream broke off" in b"".join(ends["close"])


def test_a_whole_close_delimited_stream_is_relayed_whole(
        tmp_path: Path, unframed: tuple[FakeUpstream, str]) -> None:
    fake, url = unframed
    fake.reset()
    with local_surface("serve", tmp_path, url) as on:
        frames, record = streamed(on, "chat", None, fake)
    assert frames[-1] == b"data: [DONE]" and b"error" not in b"".join(frames)
    assert (record.status, record.error_code) == (200, None)
    assert record.completion_tokens > 0 and not record.tokens_estimated


def _without_ids(frame: bytes) -> bytes:
    """A frame with what differs from one request to the next (ids, times) left out."""
    head, _, data = frame.rpartition(b"data: ")
    try:
        payload = json.loads(data)
    except ValueError:
        return frame
    return head + b"data: " + json.dumps(_same(payload), sort_keys=True).encode()


def _same(value: object) -> object:
    if isinstance(value, dict):
        return {name: _same(item) for name, item in value.items()
                if name not in ("id", "created", "created_at", "sequence_number")}
    return [_same(item) for item in value] if isinstance(value, list) else value
