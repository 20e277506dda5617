"""One JSON line per request on stderr (``ACCESS_LOG=json``): the usage record's fields, its
client ``protocol`` among them (for a rejection: what is known of it, the protocol whose
errors it was answered in included), nothing more — no prompt, no key. The provider's own
reported cost is part of the line (``provider_cost_usd``/``provider_cost_diem``).

A sampled share of requests (``AUDIT_SAMPLE_RATE``), and every failed one with
``AUDIT_ERRORS=true``, add a ``capture``: the SHA-256 of the request body and the length
of the response, never their text unless ``CAPTURE_GENAI_CONTENT`` is on.
"""

from __future__ import annotations

import hashlib
import os
import random
import time
from typing import Any

from llm_gateway import jsonio
from llm_gateway.billing.records import UsageRecord
from llm_gateway.errors import Rejection

STDERR = 2


class AccessLog:
    def __init__(self, *, enabled: bool, sample_rate: float, audit_errors: bool,
                 capture_content: bool, fd: int = STDERR) -> None:
        self.enabled = enabled
        self._sample_rate = sample_rate
        self._audit_errors = audit_errors
        self._capture_content = capture_content
        self._fd = fd
        self._random = random.Random()

    def _write(self, line: bytes) -> None:
        # One write per line, whole: lines of concurrent requests never interleave.
        os.write(self._fd, line)

    def finished(self, record: UsageRecord, request_body: bytes, response_bytes: int) -> None:
        if not self.enabled:
            return
        # The record's own JSON object, with the event first and the capture last: spliced
        # as bytes, since building a dict of the record costs more than the rest of the line.
        fields = jsonio.dumps(record)[1:-1]
        failed = record.status >= 400 or record.error_code is not None
        if (self._audit_errors and failed) or self._random.random() < self._sample_rate:
            capture = jsonio.dumps(self._capture(request_body, response_bytes))
            self._write(b'{"event":"request",%s,"capture":%s}\n' % (fields, capture))
        else:
            self._write(b'{"event":"request",%s}\n' % fields)

    def rejected(self, *, request_id: str, trace_id: str, adapter: str, method: str,
                 path: str, protocol: str, rejection: Rejection, key_id: str | None,
                 key_prefix: str | None) -> None:
        if not self.enabled:
            return
        self._write(jsonio.dumps({
            "event": "rejected", "request_id": request_id, "trace_id": trace_id,
            "at": time.time(), "adapter": adapter, "protocol": protocol, "method": method,
            "path": path, "status": rejection.status, "error_code": rejection.code,
            "key_id": key_id, "key_prefix": key_prefix,
        }) + b"\n")

    def _capture(self, request_body: bytes, response_bytes: int) -> dict[str, Any]:
        captured: dict[str, Any] = {
            "request_sha256": hashlib.sha256(request_body).hexdigest(),
            "response_bytes": response_bytes,
        }
        if self._capture_content:
            captured["request"] = request_body.decode("utf-8", "replace")
        return captured
