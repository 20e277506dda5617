"""Requests the gateway refused itself, before admission (401 invalid key, 403 model not
allowed, 429 rate limit or budget, 400 model_not_priced, 413 ...): counted, not recorded.

A refused request was never admitted, so it has no usage record (one per admitted request)
and never shows in the reports' errors, which are the admitted requests that failed. Each
process's /metrics counts refusals too (``llm_gateway_rejections_total``), but only its
own, and from its start: the console wants every replica's since a date. So refusals go
to the shared store as counts per minute, key (or none: a key that did not authenticate),
subject, status and code, added up across replicas by the store's upsert. A row per
refusal would let anyone spraying bad keys grow the table without end; these buckets grow
by minute with the keys and codes (a catalogue's few) only, and the process holds at most
MAX_BUCKETS of them while the store is away.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from llm_gateway.errors import CATALOGUE, Rejection
from llm_gateway.keys import KeyRecord

MINUTE = 60
# Buckets kept in memory while the store does not take them (~100 bytes each); a refusal
# past that is counted in ``dropped`` only (said in the log), never grown into.
MAX_BUCKETS = 10_000
NO_KEY = ""  # the key of a refusal whose caller did not authenticate
OTHER_CODE = "other"  # a code outside the catalogue (none is: a guard for labels)
GROUPS = ("key", "subject", "day")
REFUSAL_COLUMNS = ("minute", "key_id", "subject_id", "status", "code", "requests")


@dataclass(frozen=True, slots=True)
class RefusalBucket:
    minute: int  # Unix seconds, a multiple of MINUTE
    key_id: str  # NO_KEY: the caller did not authenticate
    subject_id: str
    status: int
    code: str


class RefusalTally:
    """The refusals counted since the store last took them."""

    def __init__(self, max_buckets: int = MAX_BUCKETS) -> None:
        self.counts: dict[RefusalBucket, int] = {}
        self.max_buckets = max_buckets
        self.dropped = 0  # refusals no bucket could take

    def count(self, rejection: Rejection, key: KeyRecord | None, at: float) -> None:
        code = rejection.code if rejection.code in CATALOGUE else OTHER_CODE
        key_id, subject = (key.id, key.subject_id) if key is not None else (NO_KEY, NO_KEY)
        self.add(RefusalBucket(int(at // MINUTE) * MINUTE, key_id, subject,
                               rejection.status, code), 1)

    def add(self, bucket: RefusalBucket, requests: int) -> None:
        if bucket not in self.counts and len(self.counts) >= self.max_buckets:
            self.dropped += requests
            return
        self.counts[bucket] = self.counts.get(bucket, 0) + requests

    def take(self) -> dict[RefusalBucket, int]:
        """Everything counted, for the store; given back if the store did not take it."""
        taken, self.counts = self.counts, {}
        return taken

    def give_back(self, taken: dict[RefusalBucket, int]) -> None:
        for bucket, requests in taken.items():
            self.add(bucket, requests)


def refusal_report_sql(by: Sequence[str], dialect: str, since: float | None,
                       until: float | None) -> tuple[str, list[Any], list[str]]:
    """The query of the refusals per status and code (and ``by``: key, subject, day), its
    parameters and the names of its columns."""
    unknown = [name for name in by if name not in GROUPS]
    if unknown:
        raise ValueError(f"cannot group refusals by {', '.join(unknown)}; "
                         f"by some of {', '.join(GROUPS)}")
    mark = "?" if dialect == "sqlite" else "%s"
    day = ("date(minute, 'unixepoch')" if dialect == "sqlite"
           else "to_char(minute AT TIME ZONE 'UTC', 'YYYY-MM-DD')")
    expressions = {"key": [("key_id", "key_id")], "subject": [("subject", "subject_id")],
                   "day": [("day", day)]}
    columns = [pair for name in GROUPS if name in by for pair in expressions[name]]
    columns += [("status", "status"), ("code", "code")]
    where, params = [], []
    for bound, operator in ((since, ">="), (until, "<")):
        if bound is not None:
            where.append(f"minute {operator} {mark}")
            params.append(bound if dialect == "sqlite" else datetime.fromtimestamp(bound, UTC))
    names = ", ".join(f'"{name}"' for name, _ in columns)
    selected = ", ".join(f'{expression} AS "{name}"' for name, expression in columns)
    sql = (f"SELECT {selected}, sum(requests) "
           f"FROM refusal_counts {'WHERE ' + ' AND '.join(where) if where else ''} "
           f"GROUP BY {names} ORDER BY {names}")
    out = [name for name, _ in columns] + ["requests"]
    if "key" in by:  # each key's name and prefix, as the usage reports join them
        key_id = "gateway_keys.id::text" if dialect == "postgres" else "gateway_keys.id"
        sql = (f"SELECT report.*, gateway_keys.name, gateway_keys.prefix FROM ({sql}) AS report"
               f" LEFT JOIN gateway_keys ON {key_id} = report.key_id ORDER BY "
               + ", ".join(f'report."{name}"' for name, _ in columns))
        out += ["key_name", "key_prefix"]
    return sql, params, out


async def refusal_report(store: Any, by: Sequence[str], since: float | None = None,
                         until: float | None = None) -> list[dict[str, Any]]:
    """Rows of status, code, requests (and key_id, key_name, key_prefix; subject; day, as
    ``by`` asks): every replica's refusals in the range, to the minute. A refusal whose
    caller did not authenticate has key_id and subject null."""
    dialect = getattr(store, "dialect", "sqlite")
    sql, params, names = refusal_report_sql(by, dialect, since, until)
    report = []
    for row in await store.usage_rows(sql, params):
        entry = dict(zip(names, row, strict=True))
        entry["requests"] = int(entry["requests"] or 0)
        for name in ("key_id", "subject"):
            if name in entry:
                entry[name] = entry[name] or None
        report.append(entry)
    return report


def bucket_row(bucket: RefusalBucket, requests: int) -> tuple[Any, ...]:
    """A bucket as the stores write it, in REFUSAL_COLUMNS' order."""
    return (bucket.minute, bucket.key_id, bucket.subject_id, bucket.status, bucket.code,
            requests)
