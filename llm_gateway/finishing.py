"""The finish step: what happens once per admitted request when it ends, whatever ended it.

Its record is priced (the gateway's price table), spooled and queued for the database
(``UsageWriter``), its budget reservation settled to what was spent, and it is told to
telemetry and to every other sink, each sink's failure logged and kept from the others. The
settlement runs whatever failed before it: a budget is never held by a request that ended.
The records a killed process left in the spool are finished here too, at the next start
(``account_orphan``). Settlements run off the request path (``background``), and so do the
budget alerts they may set off (llm_gateway.billing.alerts_watch: told of each settled
budget, and of each refusal by one, they look at the budgets later). And what an
adapter's closing an answer does (``finish_response``), and the stream every adapter reads
(``guarded_stream``: an engine failure inside it ends it in band; read to its end, it says
so).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from decimal import Decimal
from typing import Any

from llm_gateway.billing.alerts_watch import BudgetAlerts
from llm_gateway.billing.metering import UsageRecord, UsageWriter
from llm_gateway.billing.model import Budget
from llm_gateway.billing.prices import cost_of
from llm_gateway.billing.quotas import QuotaDecision, Quotas, reservation_from_json
from llm_gateway.billing.spool import Orphan
from llm_gateway.exchange import Exchange, RecordSink
from llm_gateway.http_types import GatewayResponse
from llm_gateway.telemetry import Telemetry

log = logging.getLogger("llm_gateway")
ENGINE_FAILED = "The gateway failed on this request."


class Finisher:
    def __init__(self, usage: UsageWriter, quotas: Quotas, telemetry: Telemetry,
                 alerts: BudgetAlerts | None = None) -> None:
        self.usage = usage
        self.quotas = quotas
        self.telemetry = telemetry
        self.alerts = alerts
        self._sinks: list[RecordSink] = [self._write_record]
        self._tasks: set[asyncio.Task[None]] = set()

    def add_sink(self, sink: RecordSink) -> None:
        self._sinks.append(sink)

    def finished(self, record: UsageRecord, exchange: Exchange) -> None:
        """An exchange's one record (``Exchange.finish`` calls this)."""
        for sink in self._sinks:
            try:  # one sink's failure is logged, and keeps no other from its record
                sink(record, exchange)
            except Exception:
                log.exception("a usage record sink failed on request %s", record.request_id)

    def release(self, quota: QuotaDecision | object) -> None:
        """Give back a reservation whose request will not be sent."""
        if isinstance(quota, QuotaDecision) and quota.reservation is not None:
            self.background(self.quotas.settle(quota.reservation, 0, None))

    def _write_record(self, record: UsageRecord, exchange: Exchange) -> None:
        try:
            target = exchange.target
            if target is not None and target.model:
                self.price(record, target.provider, target.model)
            self.usage.add(record)
        finally:
            reservation = exchange.quota.reservation
            if reservation is not None:
                self.background(self.quotas.settle(reservation, record.total_tokens,
                                                   spent(record)))
                if self.alerts is not None:
                    self.alerts.noticed(reservation.holds)
        self.telemetry.finished(record, exchange)

    def price(self, record: UsageRecord, provider: str, model: str) -> None:
        """The record's cost, from the price table (none known: left as it is)."""
        found = self.quotas.prices.price_at(provider, model, record.started_at)
        if found is not None:
            record.cost_usd = cost_of(
                found, prompt_tokens=record.prompt_tokens,
                completion_tokens=record.completion_tokens,
                cache_read_tokens=record.cache_read_tokens,
                cache_write_tokens=record.cache_write_tokens,
                cache_write_1h_tokens=record.cache_write_1h_tokens)

    async def account_orphan(self, orphan: Orphan) -> None:
        """A record a killed process left, before it is written: a request the kill cut
        short is priced from what it had relayed (the spool's progress), and whatever it
        held on the ledger is settled, exactly once under its owner (a request that had
        settled before the kill books nothing again)."""
        record = orphan.record
        if record.error_code == "gateway_interrupted" and record.upstream_model:
            self.price(record, record.provider, record.upstream_model)
        if orphan.reservation is None:
            return
        try:
            await self.quotas.settle_orphan(reservation_from_json(orphan.reservation),
                                            record.total_tokens, spent(record))
        except Exception as exc:  # the sweep releases it within ORPHAN_SECONDS instead
            log.warning("settling a stopped process's reservation failed: %s",
                        type(exc).__name__)

    def background(self, work: Coroutine[Any, Any, None]) -> None:
        """Off the request path; a failure is logged, never raised into a request. Started
        at once: a settlement from a lease is done before any wait, no task scheduled."""
        task = asyncio.Task(work, loop=asyncio.get_running_loop(), eager_start=True)
        if task.done():
            return _settled(task)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        task.add_done_callback(_settled)

    def budget_refused(self, limit: str, budgets: Sequence[Budget]) -> None:
        """A budget's ``limit`` refused a request (which thus never finishes)."""
        if self.alerts is not None:
            self.alerts.refused(limit, budgets)

    async def drain(self) -> None:
        """Wait for the settlements under way (before their ledger closes)."""
        if self._tasks:
            await asyncio.gather(*self._tasks, return_exceptions=True)

    async def close(self) -> None:
        """The settlements under way, then the budget alerts' last look and deliveries
        (they read the ledger too): before the ledger closes."""
        await self.drain()
        if self.alerts is not None:
            await self.alerts.close()


def spent(record: UsageRecord) -> Decimal | None:
    """What a request cost, for its settlement: the gateway's price, else the provider's."""
    return record.cost_usd if record.cost_usd is not None else record.provider_cost_usd


def _settled(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.warning("settling a budget failed: %s", type(task.exception()).__name__)


async def guarded_stream(exchange: Exchange, response: GatewayResponse,
                         chunks: AsyncIterator[bytes],
                         keeper: Callable[[], None] | None = None) -> AsyncIterator[bytes]:
    """A stream's chunks; should the engine fail inside it (the status is out), it ends as
    the relay ends a broken stream, so SDKs raise. Read to its end: ``response.ended``.
    ``keeper``: called once the stream's response id is known."""
    try:
        async for chunk in chunks:
            if keeper is not None and exchange.facts is not None and exchange.facts.response_id:
                keeper()
                keeper = None
            yield chunk
    except Exception:
        log.exception("the engine failed during the stream of request %s", exchange.request_id)
        exchange.fail(500, "gateway_error", ENGINE_FAILED)
        exchange.ending = True
        yield exchange.stream_error("gateway_error", ENGINE_FAILED)
    else:
        response.ended = True
    finally:
        await chunks.aclose()  # type: ignore[attr-defined]


def finish_response(exchange: Exchange, response: GatewayResponse,
                    client_gone: bool | None) -> None:
    """What closing an answer does once its stream is closed: the request finished. A
    pull-based adapter (``client_gone`` None) lost its client unless it read the stream to
    its end; one that stopped reading once the protocol's end was relayed (an SDK stops at
    ``[DONE]``) did not."""
    if client_gone is None:
        client_gone = response.chunks is not None and not response.ended
    if client_gone and response.chunks is not None and exchange.end_relayed:
        client_gone = False
    exchange.finish(client_disconnected=client_gone)
