import itertools
import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from llm_gateway.observe import StreamObserver
from llm_gateway.providers import Usage, VeniceProfile
from llm_gateway.sse import SSEEvent, SSEParser

usage_from_payload = VeniceProfile().usage

BOM = b"\xef\xbb\xbf"
EOLS = [b"\n", b"\r\n", b"\r"]


def parse(*chunks: bytes) -> list[SSEEvent]:
    parser = SSEParser()
    events: list[SSEEvent] = []
    for chunk in chunks:
        events += parser.feed(chunk)
    events += parser.close()
    return events


def observe(*chunks: bytes, now: float = 0.0) -> StreamObserver:
    observer = StreamObserver(VeniceProfile())
    for chunk in chunks:
        observer.feed(chunk, now)
    observer.close()
    return observer


def results(observer: StreamObserver) -> tuple:
    return (
        observer.response_id,
        observer.model,
        observer.finish_reasons,
        observer.usage,
        observer.error,
        observer.done,
        observer.event_count,
        observer.malformed_count,
        observer.first_event_at,
        observer.last_event_at,
        observer.max_gap,
    )


# --- SSEParser -------------------------------------------------------------------------------


@pytest.mark.parametrize("eol", EOLS)
def test_each_line_ending_terminates_lines(eol: bytes) -> None:
    stream = b"data: a" + eol + b"data: b" + eol + eol + b"data: c" + eol + eol
    assert parse(stream) == [SSEEvent("a\nb"), SSEEvent("c")]


def test_mixed_line_endings_in_one_stream() -> None:
    assert parse(b"data: a\r\ndata: b\rdata: c\n\r\n") == [SSEEvent("a\nb\nc")]


def test_cr_at_chunk_end_then_lf_is_one_line_ending() -> None:
    # A spurious empty line between the two halves of CRLF would dispatch "a" on its own.
    assert parse(b"data: a\r", b"\ndata: b\r", b"\n\r", b"\n") == [SSEEvent("a\nb")]


def test_cr_at_chunk_end_then_cr_is_a_blank_line() -> None:
    assert parse(b"data: a\r", b"\rdata: b\r\r") == [SSEEvent("a"), SSEEvent("b")]


def test_cr_at_chunk_end_then_empty_chunk_then_lf() -> None:
    assert parse(b"data: a\r", b"", b"\n", b"\r\n") == [SSEEvent("a")]


def test_comments_are_ignored_and_do_not_dispatch() -> None:
    stream = b": keep-alive\n\n:\n\ndata: x\n: in the middle\ndata: y\n\n"
    assert parse(stream) == [SSEEvent("x\ny")]


def test_multi_line_data_joined_with_lf_and_only_one_space_stripped() -> None:
    assert parse(b"data: a\ndata:\ndata:  b\ndata:c\n\n") == [SSEEvent("a\n\n b\nc")]


def test_blank_lines_without_data_dispatch_nothing() -> None:
    assert parse(b"\n\n\r\n\revent: x\nid: 1\n\n") == []


def test_empty_data_line_dispatches_empty_event() -> None:
    assert parse(b"data:\n\ndata\n\n") == [SSEEvent(""), SSEEvent("")]


def test_field_without_colon_has_empty_value() -> None:
    assert parse(b"data\ndata\n\n") == [SSEEvent("\n")]
    assert parse(b"event\ndata: x\n\n") == [SSEEvent("x")]


def test_event_and_id_fields_reset_after_dispatch() -> None:
    stream = b"event: delta\nid: 7\ndata: {}\n\ndata: next\n\n"
    assert parse(stream) == [SSEEvent("{}", event="delta", id="7"), SSEEvent("next")]


def test_unknown_fields_retry_and_id_with_nul_are_ignored() -> None:
    stream = b"retry: 100\nfoo: bar\nid: a\x00b\ndata: x\n\n"
    assert parse(stream) == [SSEEvent("x")]


def test_leading_bom_is_skipped() -> None:
    assert parse(BOM + b"data: x\n\n") == [SSEEvent("x")]


def test_leading_bom_split_byte_by_byte() -> None:
    stream = BOM + b"data: x\n\n"
    assert parse(*(stream[i : i + 1] for i in range(len(stream)))) == [SSEEvent("x")]


def test_only_the_first_bom_is_skipped() -> None:
    # Later, the BOM is just part of a field name that nobody knows.
    assert parse(b"data: a\n\n" + BOM + b"data: b\n\n") == [SSEEvent("a")]


def test_short_first_chunks_are_held_back_for_bom_detection_but_not_lost() -> None:
    assert parse(b"d", b"at", b"a: x\n\n") == [SSEEvent("x")]
    assert parse(b"\n", b"data: x\n\n") == [SSEEvent("x")]
    # Half a BOM is not a BOM: it garbles the first field name, which is then unknown.
    assert parse(b"\xef\xbb", b"data: x\n\n") == []


def test_utf8_character_split_at_every_byte() -> None:
    stream = "data: héllo ✓ 🙂\n\n".encode()
    for i in range(len(stream) + 1):
        assert parse(stream[:i], stream[i:]) == [SSEEvent("héllo ✓ 🙂")], i


def test_invalid_utf8_is_replaced_not_raised() -> None:
    assert parse(b"data: a\xff\xe2\x82\nb\n\n") == [SSEEvent("a\ufffd\ufffd")]


def test_close_discards_incomplete_event() -> None:
    parser = SSEParser()
    assert parser.feed(b"data: done\n\ndata: partial\n") == [SSEEvent("done")]
    assert parser.close() == []
    parser = SSEParser()
    assert parser.feed(b"data: no line ending") == []
    assert parser.close() == []


# --- whole stream vs. split stream -----------------------------------------------------------


def openai_stream(eol: bytes, bom: bool = False) -> tuple[bytes, list[SSEEvent]]:
    """A realistic streamed chat completion, as bytes and as the events it must parse into."""
    base = {"id": "chatcmpl-42", "object": "chat.completion.chunk", "created": 1, "model": "m1"}
    frames = [
        {**base, "choices": [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]},
        *(
            {**base, "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": None}]}
            for text in ["hé", "llo", " wö", "rld ", "✓"]
        ),
        {**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
        {
            **base,
            "choices": [],
            "usage": {
                "prompt_tokens": 12,
                "completion_tokens": 5,
                "total_tokens": 17,
                "cost": {"diem": 0.25, "usd": 0.0031},
            },
        },
    ]
    datas = [json.dumps(frame, ensure_ascii=False) for frame in frames] + ["[DONE]"]
    stream = BOM if bom else b""
    stream += b": OPENROUTER PROCESSING" + eol + eol
    # Event ids put a field line before each data line, so a spurious blank line (say, between
    # the halves of a split CRLF) would reset the id and show up as a different event.
    for event_id, data in enumerate(datas):
        stream += b"id: %d" % event_id + eol + b"data: " + data.encode() + eol + eol
    return stream, [SSEEvent(data, id=str(event_id)) for event_id, data in enumerate(datas)]


EXPECTED_OPENAI_RESULTS = (
    "chatcmpl-42",
    "m1",
    ["stop"],
    Usage(12, 5, 17, cost_usd=0.0031, cost_diem=0.25),
    None,
    True,
    9,
    0,
    0.0,
    0.0,
    0.0,
)


@pytest.mark.parametrize("bom", [False, True])
@pytest.mark.parametrize("eol", EOLS)
def test_split_at_every_byte_matches_whole_stream(eol: bytes, bom: bool) -> None:
    stream, expected_events = openai_stream(eol, bom)
    assert parse(stream) == expected_events
    assert results(observe(stream)) == EXPECTED_OPENAI_RESULTS
    for i in range(len(stream) + 1):
        head, tail = stream[:i], stream[i:]
        assert parse(head, tail) == expected_events, i
        assert results(observe(head, tail)) == EXPECTED_OPENAI_RESULTS, i


@st.composite
def split_openai_streams(draw: st.DrawFn) -> tuple[list[bytes], list[SSEEvent]]:
    stream, expected_events = openai_stream(draw(st.sampled_from(EOLS)), draw(st.booleans()))
    cuts = sorted(draw(st.lists(st.integers(0, len(stream)), max_size=40)))
    bounds = [0, *cuts, len(stream)]
    return [stream[a:b] for a, b in itertools.pairwise(bounds)], expected_events


@settings(max_examples=300)
@given(split_openai_streams())
def test_split_into_random_pieces_matches_whole_stream(
    split: tuple[list[bytes], list[SSEEvent]],
) -> None:
    pieces, expected_events = split
    assert parse(*pieces) == expected_events
    assert results(observe(*pieces)) == EXPECTED_OPENAI_RESULTS


@given(st.lists(st.binary(max_size=64), max_size=20))
def test_garbage_never_raises(pieces: list[bytes]) -> None:
    observer = observe(*pieces)
    assert observer.event_count >= observer.malformed_count


# --- StreamObserver --------------------------------------------------------------------------


def sse(*datas: str) -> bytes:
    return b"".join(b"data: " + data.encode() + b"\n\n" for data in datas)


def test_usage_and_venice_cost_from_final_chunk_with_no_choices() -> None:
    observer = observe(
        sse(
            '{"id": "c1", "model": "venice-uncensored", "choices": [{"delta": {"content": "hi"}}]}',
            '{"id": "c1", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 1,'
            ' "total_tokens": 4, "cost": {"diem": 0.5, "usd": 0.002}}}',
            "[DONE]",
        )
    )
    assert observer.usage == Usage(3, 1, 4, cost_usd=0.002, cost_diem=0.5)
    assert observer.done
    assert observer.event_count == 3
    assert observer.error is None


def test_last_usage_wins() -> None:
    observer = observe(
        sse(
            '{"usage": {"prompt_tokens": 3}}',
            '{"usage": null}',
            '{"usage": {"prompt_tokens": 3, "completion_tokens": 9}}',
        )
    )
    assert observer.usage == Usage(3, 9, 12)


def test_response_id_from_first_chunk_and_first_non_empty_model() -> None:
    observer = observe(
        sse('{"id": "a", "model": ""}', '{"id": "b", "model": "m2"}', '{"model": "m3"}')
    )
    assert (observer.response_id, observer.model) == ("a", "m2")


def test_finish_reasons_in_order_across_choices_and_chunks() -> None:
    observer = observe(
        sse(
            '{"choices": [{"index": 0, "finish_reason": null}, {"index": 1}]}',
            '{"choices": [{"index": 1, "finish_reason": "length"}, "junk", 7]}',
            '{"choices": [{"index": 0, "finish_reason": "stop"}]}',
            '{"choices": "not a list"}',
        )
    )
    assert observer.finish_reasons == ["length", "stop"]


def test_in_band_venice_error_then_done() -> None:
    observer = observe(sse('{"error": "Model overloaded"}', "[DONE]"))
    assert observer.error == {"message": "Model overloaded", "type": None, "code": None}
    assert observer.done
    assert observer.malformed_count == 0


def test_in_band_openai_error_object() -> None:
    observer = observe(sse('{"error": {"message": "Rate limit", "type": "requests", "code": 429}}'))
    assert observer.error == {"message": "Rate limit", "type": "requests", "code": "429"}


def test_null_error_field_is_not_an_error() -> None:
    assert observe(sse('{"error": null, "choices": []}')).error is None


def test_malformed_frames_are_counted_and_the_stream_goes_on() -> None:
    observer = observe(
        sse("not json", '{"truncated": ', "", "[1, 2]", '{"choices": [{"finish_reason": "stop"}]}')
    )
    assert observer.malformed_count == 4
    assert observer.event_count == 5
    assert observer.finish_reasons == ["stop"]
    assert not observer.done


def test_timings_use_the_supplied_now() -> None:
    observer = StreamObserver(VeniceProfile())
    observer.feed(b": comment only\n\n", 0.5)
    assert observer.first_event_at is None
    observer.feed(b'data: {"id": "x"}\n\ndata: {}', 1.0)
    observer.feed(b"\n\n", 1.25)  # completes the second event
    observer.feed(b"data: {}\n\n", 4.25)
    observer.feed(b"data: [DONE]\n\n", 4.5)
    observer.close()
    assert observer.first_event_at == 1.0
    assert observer.last_event_at == 4.5
    assert observer.max_gap == 3.0


def test_single_event_has_no_gap() -> None:
    observer = StreamObserver(VeniceProfile())
    observer.feed(b"data: [DONE]\n\n", 7.0)
    assert (observer.first_event_at, observer.last_event_at, observer.max_gap) == (7.0, 7.0, 0.0)


def test_events_completed_by_one_feed_share_its_time() -> None:
    observer = StreamObserver(VeniceProfile())
    observer.feed(sse("{}", "{}", "{}"), 2.0)
    assert (observer.first_event_at, observer.last_event_at, observer.max_gap) == (2.0, 2.0, 0.0)


# --- usage_from_payload ----------------------------------------------------------------------


def test_usage_from_chat_completion() -> None:
    payload = json.loads(
        '{"id": "chatcmpl-1", "object": "chat.completion", "choices": [],'
        ' "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15,'
        ' "prompt_tokens_details": {"cached_tokens": 0}}}'
    )
    assert usage_from_payload(payload) == Usage(10, 5, 15)


def test_usage_from_embeddings_response() -> None:
    payload = {
        "object": "list",
        "data": [{"object": "embedding", "index": 0, "embedding": [0.1, 0.2]}],
        "model": "text-embedding-3-small",
        "usage": {"prompt_tokens": 8, "total_tokens": 8},
    }
    assert usage_from_payload(payload) == Usage(8, 0, 8)


def test_total_defaults_to_prompt_plus_completion() -> None:
    usage = usage_from_payload({"usage": {"prompt_tokens": 2, "completion_tokens": 3}})
    assert usage == Usage(2, 3, 5)


def test_venice_cost_inside_usage() -> None:
    usage = usage_from_payload({"usage": {"prompt_tokens": 1, "cost": {"diem": 2, "usd": 0.01}}})
    assert usage == Usage(1, 0, 1, cost_usd=0.01, cost_diem=2.0)


def test_venice_cost_beside_usage() -> None:
    usage = usage_from_payload({"usage": {"prompt_tokens": 1}, "cost": {"diem": 0.3, "usd": 0.5}})
    assert usage == Usage(1, 0, 1, cost_usd=0.5, cost_diem=0.3)


def test_garbage_cost_inside_usage_falls_back_to_cost_beside_it() -> None:
    usage = usage_from_payload(
        {"usage": {"cost": {"usd": "0.1", "diem": True}}, "cost": {"usd": 0.2}}
    )
    assert usage == Usage(cost_usd=0.2)


@pytest.mark.parametrize("payload", [None, 3, "usage", [], {}, {"usage": None}, {"usage": [1]}])
def test_no_usage_object_gives_none(payload: object) -> None:
    assert usage_from_payload(payload) is None


def test_junk_token_and_cost_fields_are_tolerated() -> None:
    payload = {
        "usage": {
            "prompt_tokens": "10",
            "completion_tokens": True,
            "total_tokens": 1.5,
            "cost": {"usd": math.nan, "diem": [1]},
        },
        "cost": "free",
    }
    assert usage_from_payload(payload) == Usage()


def test_negative_token_counts_count_as_zero() -> None:
    assert usage_from_payload({"usage": {"prompt_tokens": -5, "total_tokens": -5}}) == Usage()
