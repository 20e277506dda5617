"""The chaos soak's figures from what it saw, I/O-free: answers by kind, records against
admitted requests, budget overshoot, RSS slopes, and the table (bench/chaos.py feeds it)."""

from __future__ import annotations

import collections
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal

from bench.measure import _slope_per_minute

MIB = 2**20

# The gateway's own refusals before admission (docs/accounting.md, billing/refusals.py):
# counted, never recorded. Every other answer the gateway gave has exactly one record.
REFUSAL_CODES = frozenset({
    "invalid_api_key", "insufficient_quota", "rate_limit_exceeded",
    "rate_limiter_unavailable", "key_store_unavailable", "model_not_allowed",
    "model_not_priced", "invalid_json", "invalid_request_body", "max_tokens_too_large",
})

# Codes given both ways: by routing before admission (every target DOWN: no record) and
# after the attempts of an admitted request (one record) -- llm_gateway/routing/router.py
# and relay.py. The client cannot tell which; the records say.
EITHER_CODES = frozenset({"no_available_upstream", "upstream_overloaded"})


@dataclass(frozen=True)
class Answer:
    """One request as the client saw it. ``status`` 0: no answer (a transport failure,
    named by ``code``). ``stream_error``: a 200 stream that ended with an error event."""

    key: str
    stream: bool
    status: int
    code: str | None
    request_id: str | None
    stream_error: str | None = None
    at: float = 0.0  # seconds into the load when it was sent
    seconds: float = 0.0  # until its answer ended

    @property
    def kind(self) -> str:
        if self.status == 0:
            return f"no answer: {self.code}"
        if self.stream_error is not None:
            return f"200 stream ended by error event: {self.stream_error}"
        if self.status == 200:
            return "200"
        # No code of the gateway's: the provider's answer to the last attempt, relayed as
        # docs/providers.md says (its status kept).
        return f"{self.status} {self.code or '(the provider error, relayed)'}"

    @property
    def refused_before_admission(self) -> bool:
        return self.status != 200 and self.code in REFUSAL_CODES

    @property
    def either(self) -> bool:
        """Refused before admission or admitted: only its records tell (EITHER_CODES)."""
        return self.status != 200 and self.code in EITHER_CODES


def kinds(answers: Iterable[Answer]) -> dict[str, int]:
    """How many answers of each kind, most first."""
    counted = collections.Counter(answer.kind for answer in answers)
    return dict(counted.most_common())


def records_check(answers: Sequence[Answer], records: Mapping[str, int]) -> dict[str, int]:
    """Answers against the database's records (request id -> how many rows).

    ``admitted``: answers the gateway gave other than a refusal before admission; each must
    have exactly one record (``missing``: none, ``doubled``: more). Refusals must have none
    (``refusals_recorded``). ``unanswered_recorded``: records of requests the client got no
    answer to (a worker killed mid-request, a client timeout): admitted, so recorded, but
    not counted against ``admitted``. ``unmatched``: records no answer names at all."""
    admitted = [a for a in answers
                if a.status != 0 and not a.refused_before_admission and not a.either]
    refused = [a for a in answers if a.refused_before_admission]
    either = [records.get(a.request_id or "", 0) for a in answers if a.either]
    named = {a.request_id for a in answers if a.request_id}
    return {
        "either_way": len(either),
        "either_way_recorded_once": either.count(1),
        "either_way_doubled": sum(count > 1 for count in either),
        "admitted": len(admitted),
        "records": sum(records.values()),
        "admitted_recorded_once": sum(records.get(a.request_id or "", 0) == 1
                                      for a in admitted),
        "missing": sum(records.get(a.request_id or "", 0) == 0 for a in admitted),
        "doubled": sum(count > 1 for count in records.values()),
        "refusals": len(refused),
        "refusals_recorded": sum(records.get(a.request_id or "", 0) > 0 for a in refused),
        "unanswered": sum(a.status == 0 for a in answers),
        "unmatched": sum(1 for request_id in records if request_id not in named),
    }


def overshoot(spent: Decimal, limit: Decimal) -> Decimal:
    """What a budget was spent past its limit (negative: under it)."""
    return spent - limit


def rss_slopes(series: Mapping[int, Sequence[tuple[float, int]]]) -> dict[str, object]:
    """Per process (pid -> (seconds, bytes) samples): first and last RSS and the slope in
    MiB/min over its samples after the first fifth of its life (caches filling)."""
    slopes: dict[str, object] = {}
    for pid, samples in series.items():
        if not samples:
            continue
        start, end = samples[0][0], samples[-1][0]
        settled = [s for s in samples if s[0] >= start + (end - start) / 5] or list(samples)
        slope = _slope_per_minute(list(settled))
        slopes[str(pid)] = {
            "from_s": round(start, 1), "to_s": round(end, 1),
            "first_mib": round(samples[0][1] / MIB, 1), "last_mib": round(samples[-1][1] / MIB, 1),
            "slope_mib_per_min": None if math.isnan(slope) else round(slope / MIB, 3),
        }
    return slopes


def table(figures: Mapping[str, object]) -> str:
    """The soak's figures as Markdown (stdout and docs/performance.md)."""
    lines = ["| Figure | Value |", "|---|---|"]

    def row(name: str, value: object) -> None:
        lines.append(f"| {name} | {value} |")

    row("duration, rate", f"{figures['seconds']} s at {figures['rate']} req/s "
        f"({figures['stream_share']:.0%} streams)")
    row("requests sent", f"{figures['requests']} (and {figures['calibration_requests']} "
        "before, to price one; in the record counts below)")
    for kind, count in dict(figures["answers"]).items():  # type: ignore[call-overload]
        row(f"answers: {kind}", count)
    check = dict(figures["records_check"])  # type: ignore[call-overload]
    row("admitted (answered, not refused before admission)", check["admitted"])
    row("admitted with exactly one record", check["admitted_recorded_once"])
    row("admitted without a record / records doubled",
        f"{check['missing']} / {check['doubled']}")
    row("refusals before admission (recorded: must be 0)",
        f"{check['refusals']} ({check['refusals_recorded']})")
    row("no_available_upstream / upstream_overloaded: answers (recorded once, doubled)",
        f"{check['either_way']} ({check['either_way_recorded_once']}, "
        f"{check['either_way_doubled']})")
    row("no answer (recorded anyway)",
        f"{check['unanswered']} ({check['unmatched']})")
    budget = dict(figures["budget"])  # type: ignore[call-overload]
    row("budget: limit; spent and overshoot by the ledger (USD)",
        f"{budget['limit_usd']}; {budget['spent_usd']}, {budget['overshoot_usd']}")
    row("budget: spent and overshoot by the usage records (USD)",
        f"{budget['recorded_spend_usd']}, {budget['recorded_overshoot_usd']}")
    row("budget exhausted after", f"{budget['exhausted_after_s']} s")
    for event in figures["events"]:  # type: ignore[attr-defined]
        row(f"chaos at {event['at_s']} s", event["what"])
    for pid, rss in dict(figures["rss"]).items():  # type: ignore[call-overload]
        row(f"RSS {pid}", f"{rss['first_mib']} → {rss['last_mib']} MiB over "
            f"{rss['from_s']} to {rss['to_s']} s, slope {rss['slope_mib_per_min']} MiB/min")
    row("gateway log lines with a traceback", figures["tracebacks"])
    return "\n".join(lines)
