"""Budget alerts, the shell: which budgets to look at, the look (one read of their counters
in the ledger), the claim that makes an alert once across replicas, and what an alert
does: a log event, a count for /metrics, a POST to each webhook (llm_gateway.billing
.webhooks). The rules are llm_gateway.billing.alerts'.

Nothing here is on a request's way. A finished request with a reservation only notes its
budget counters (``noticed``: a dict write per counter); a refusal by a budget notes that
it refused (``refused``). The first note starts the task that looks (on the loop that
serves); ``close`` takes a last look and stops it. That task reads, at most every
``CHECK_SECONDS``, what the counters noted lately have spent, in one call to the ledger,
so its cost does not grow with the traffic. A counter noted is looked at for ``recheck``
seconds after its last request: a settlement (or a lease booking what it spent) lands a
moment after the request.

Each threshold a counter has reached is claimed in the shared store (Redis, else the
database: llm_gateway.stores.alert_claims); the one process whose claim holds sends it,
every other only remembers that it was sent. A claim the store did not answer is asked
again at the next look. The 100 % threshold is also reached when the budget refuses a
request for want of room: with the budget-aware clamp a budget is rarely spent to its
last unit, and a refusal is the moment it is used up for the requests it gets
(``exhausted`` says so in the alert).

The log event is one JSON line on stderr, as the access log's are:
``{"event": "budget_alert", ...the alert's payload}``, whatever ``ACCESS_LOG`` says.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import json
import logging
import os
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Protocol

from llm_gateway.billing.alerts import (
    EVENT,
    Alert,
    BudgetWindow,
    alert_payload,
    budget_window,
    dedup_key,
    limit_of,
    reached,
)
from llm_gateway.billing.ledger import Hold
from llm_gateway.billing.model import Budget
from llm_gateway.billing.webhooks import WebhookSender

log = logging.getLogger("llm_gateway.alerts")

CHECK_SECONDS = 1.0
RECHECK_SECONDS = 5.0  # a counter is looked at this long after its last request
MAX_WATCHED = 10_000  # counters looked at, at most (more in one period wait for room)
CLOSE_CHECK_SECONDS = 2.0  # the last look a stopping gateway takes
EXHAUSTED = Decimal(1)


class SpentReader(Protocol):
    async def spent(self, names: list[str]) -> dict[str, int]: ...


class Claims(Protocol):
    backend: str

    async def claim(self, key: str, alert_id: str, until: float) -> bool: ...


@dataclass(slots=True)
class _Watch:
    window: BudgetWindow
    until: float  # monotonic: looked at until then
    refused: bool = False


@functools.lru_cache(maxsize=4096)
def _window(counter: str, limit: int) -> BudgetWindow | None:
    return budget_window(counter, limit)


class BudgetAlerts:
    def __init__(self, ledger: SpentReader, claims: Claims,
                 thresholds: Sequence[Decimal], *, sender: WebhookSender | None = None,
                 event_fd: int | None = 2, clock: Callable[[], float] = time.time,
                 monotonic: Callable[[], float] = time.monotonic,
                 check_seconds: float = CHECK_SECONDS,
                 recheck_seconds: float = RECHECK_SECONDS) -> None:
        self.thresholds = tuple(sorted(thresholds))
        self.sender = sender
        # (scope, budget, threshold) -> alerts this process sent; claims others won.
        self.sent: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self.lost_claims = 0
        self._ledger = ledger
        self._claims = claims
        self._event_fd = event_fd
        self._clock = clock
        self._monotonic = monotonic
        self._check_seconds = check_seconds
        self._recheck = recheck_seconds
        self._watched: dict[str, _Watch] = {}
        self._done: dict[str, tuple[float, set[Decimal]]] = {}  # counter -> (end, thresholds)
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._failing: set[str] = set()  # what fails: logged once, until it works again

    # ---- on the request path: notes only -------------------------------------------

    def noticed(self, holds: Sequence[Hold]) -> None:
        """A request settled on these budget counters: they are looked at soon."""
        until = self._monotonic() + self._recheck
        for hold in holds:
            watch = self._watched.get(hold.name)
            if watch is not None and watch.window.limit == hold.limit:
                watch.until = until
            elif len(self._watched) < MAX_WATCHED:
                window = _window(hold.name, hold.limit)
                if window is not None:
                    self._watched[hold.name] = _Watch(window, until)
        self._wake.set()
        if self._task is None:  # started by the first request that needs it
            self.start()

    def refused(self, counter: str, budgets: Sequence[Budget]) -> None:
        """A budget refused a request (``counter``: the limit that said no)."""
        if EXHAUSTED not in self.thresholds:
            return
        watch = self._watched.get(counter)
        if watch is None:
            window = _window(counter, 0)
            budget = next((b for b in budgets if window is not None and b.scope is window.scope
                           and b.scope_id == window.scope_id), None)
            limit = limit_of(budget, window) if budget is not None and window else None
            if window is None or limit is None or len(self._watched) >= MAX_WATCHED:
                return
            watch = self._watched[counter] = _Watch(dataclasses.replace(window, limit=limit),
                                                    0.0)
        watch.refused = True
        watch.until = self._monotonic() + self._recheck
        self._wake.set()
        if self._task is None:
            self.start()

    # ---- off it ------------------------------------------------------------------

    def start(self) -> None:
        """Start looking (and the webhooks' deliveries), on the running loop."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._loop())
        if self.sender is not None:
            self.sender.start()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._watched:  # what the last requests reached
            try:
                await asyncio.wait_for(self.check(), CLOSE_CHECK_SECONDS)
            except TimeoutError:
                log.warning("budget alerts: the last look at budgets took too long")
            except Exception:  # a bug: never one that keeps the gateway from stopping
                log.exception("looking at budgets for alerts failed")
        if self.sender is not None:
            await self.sender.close()

    async def _loop(self) -> None:
        while True:
            await self._wake.wait()
            await asyncio.sleep(self._check_seconds)
            self._wake.clear()
            try:
                await self.check()
            except Exception:  # a bug, not an outage: logged, and the next look goes on
                log.exception("looking at budgets for alerts failed")
            if self._watched:
                self._wake.set()

    async def check(self) -> None:
        """One look at every counter noted lately: each threshold reached, claimed and sent
        once."""
        if not self._watched:
            return
        names = list(self._watched)
        try:
            spent = await self._ledger.spent(names)
        except Exception as exc:  # the ledger is down: looked at again next time
            self._failed("reading the budget ledger", exc)
            return
        self._recovered("reading the budget ledger")
        now, moment = self._clock(), self._monotonic()
        for name in names:
            watch = self._watched.get(name)
            if watch is None:
                continue
            value = spent.get(name, 0)
            due = reached(value, watch.window.limit, self.thresholds)
            if watch.refused and EXHAUSTED not in due:
                due.append(EXHAUSTED)
            for threshold in due:
                if threshold not in self._done.get(name, (0.0, set()))[1]:
                    await self._alert(watch, threshold, value, now)
            if watch.window.end <= now or watch.until <= moment:
                del self._watched[name]
        if len(self._done) > MAX_WATCHED:
            self._done = {k: v for k, v in self._done.items() if v[0] > now}

    async def _alert(self, watch: _Watch, threshold: Decimal, spent: int, now: float) -> None:
        window = watch.window
        refused = watch.refused and threshold == EXHAUSTED and spent < window.limit
        alert = Alert(uuid.uuid4().hex, window, threshold, spent, now, refused)
        alert_key = dedup_key(window, threshold)
        try:
            won = await self._claims.claim(alert_key, alert.id, window.end)
        except Exception as exc:  # asked again at the next look
            self._failed(f"claiming alerts in {self._claims.backend}", exc)
            watch.until = max(watch.until, self._monotonic() + self._recheck)
            return
        self._recovered(f"claiming alerts in {self._claims.backend}")
        self._done.setdefault(window.counter, (window.end, set()))[1].add(threshold)
        if not won:
            self.lost_claims += 1
            log.info("budget alert at %s %% of a %s's %s: sent by another gateway process",
                     format(float(threshold * 100), "g"), window.scope.value, window.budget)
            return
        payload = alert_payload(alert)
        self.sent[(window.scope.value, window.budget, format(float(threshold), "g"))] += 1
        self._log_event(payload)
        if self.sender is not None:
            self.sender.send(payload)

    def _log_event(self, payload: dict[str, Any]) -> None:
        line = json.dumps({"event": EVENT, "at": payload["created_at"], **payload},
                          separators=(",", ":")).encode() + b"\n"
        if self._event_fd is None:
            log.warning("%s", line.decode().rstrip())
            return
        try:
            os.write(self._event_fd, line)  # one write: never interleaved with others
        except OSError:
            log.warning("%s", line.decode().rstrip())

    def _failed(self, what: str, exc: Exception) -> None:
        if what not in self._failing:
            self._failing.add(what)
            log.warning("budget alerts: %s failed (%s); tried again", what, type(exc).__name__)

    def _recovered(self, what: str) -> None:
        if what in self._failing:
            self._failing.discard(what)
            log.info("budget alerts: %s works again", what)
