"""The chaos soak's pure parts (bench/chaos*.py): the soak itself is `make soak-chaos`, not
CI. What it counts must be right: refusals apart from admitted answers, a record missing
or doubled, a stream ended by an error event, the faults' shares."""

from __future__ import annotations

import random
from decimal import Decimal

from bench.chaos import _error_code, chaos_schedule
from bench.chaos_tally import Answer, kinds, overshoot, records_check, rss_slopes
from bench.chaos_upstream import FAULT_SHARES, draw_fault

MIB = 2**20


def test_records_are_checked_against_admitted_answers_by_request_id() -> None:
    answers = [
        Answer("k", False, 200, None, "r1"), Answer("k", True, 200, None, "r2"),
        Answer("k", False, 502, "upstream_broken_response", "r3"),
        Answer("k", False, 429, "insufficient_quota", "r4"),
        Answer("k", False, 503, "rate_limiter_unavailable", "r5"),
        Answer("k", True, 0, "RemoteProtocolError", None),
        Answer("k", False, 503, "no_available_upstream", "r6"),  # refused by routing
        Answer("k", False, 503, "no_available_upstream", "r7"),  # admitted, all tried
    ]
    records = {"r1": 1, "r2": 2, "r5": 1, "r7": 1, "r9": 1}
    check = records_check(answers, records)
    assert check["admitted"] == 3  # the 502 was admitted; the 429 and 503 refused before
    assert (check["admitted_recorded_once"], check["missing"], check["doubled"]) == (1, 1, 1)
    assert (check["refusals"], check["refusals_recorded"]) == (2, 1)
    assert (check["unanswered"], check["unmatched"]) == (1, 1)
    assert (check["either_way"], check["either_way_recorded_once"]) == (2, 1)


def test_answers_are_counted_by_kind() -> None:
    answers = [Answer("k", True, 200, None, "a", "upstream_stream_interrupted"),
               Answer("k", False, 200, None, "b"), Answer("k", False, 200, None, "c"),
               Answer("k", False, 0, "ReadTimeout", None)]
    assert kinds(answers) == {"200": 2, "200 stream ended by error event: "
                              "upstream_stream_interrupted": 1, "no answer: ReadTimeout": 1}


def test_an_answer_body_gives_its_error_code() -> None:
    assert _error_code(b'{"error": {"code": "insufficient_quota"}}', 429, False) == (
        "insufficient_quota", None)
    assert _error_code(b"<html>", 502, False) == ("(not JSON)", None)
    event = b'data: {"id": 1}\n\ndata: {"error": {"code": "upstream_timeout"}}\n\n'
    assert _error_code(event + b"data: [DONE]\n\n", 200, True) == (None, "upstream_timeout")
    assert _error_code(b'data: {"id": 1}\n\n', 200, True) == (None, "(no [DONE])")
    assert _error_code(b'data: {"id": 1}\n\ndata: [DONE]\n\n', 200, True) == (None, None)


def test_faults_come_in_their_shares() -> None:
    draws = random.Random(3)
    faulted = sum(draw_fault(draws.random()) is not None for _ in range(20_000))
    expected = sum(share for share, _ in FAULT_SHARES)
    assert abs(faulted / 20_000 - expected) < 0.01
    assert draw_fault(0.999) is None


def test_the_schedule_and_the_figures() -> None:
    assert [what for _, what in chaos_schedule(600)] == [
        "kill redis", "restart postgres", "kill worker", "kill redis"]
    assert all(0 < at < 600 for at, _ in chaos_schedule(600))
    growing = {7: [(t * 60.0, 100 * MIB + t * MIB) for t in range(11)]}
    assert rss_slopes(growing)["7"]["slope_mib_per_min"] == 1.0  # type: ignore[index]
    assert overshoot(Decimal("1.5"), Decimal("2")) == Decimal("-0.5")
