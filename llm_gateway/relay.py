"""The engine's own sending: an admitted request to its targets, and the answer back.

Every adapter gets the same behaviour from here. Before the first byte reaches the
client, a failed attempt moves on: a refused connection or a first-byte timeout to the
next target at once, a 5xx or a 429 to the next target, never more than ``max_attempts``
in all; each outcome tells the target's passive health. A 429 from a plan's only target
is back-pressure with nowhere else to go: its Retry-After is waited out when short (up to
``max_retry_wait_seconds`` in all), else the caller gets the provider's 429 at once. Once
a stream has started there is no retry: a failure, or a stream silent for
``stream_idle``, ends it with an SSE error event and ``[DONE]``; so does a body that ends
before its protocol's end event, whatever framed it (a close-delimited body's cut looks
like its end on the wire). A stream whose upstream ignores the request's output cap is
ended by the gateway just past it (``tokens.stream_output_ceiling``: the output is counted
as it is relayed), the protocol's way: a ``length`` finish with the usage counted, then the
end event (``cap_end`` of the target's protocol), recorded ``output_over_cap``.

A provider's ``limits`` are provider-wide windows of 60 s, counted by the rate limiter
(shared like the keys' limits): ``requests_per_minute`` counts each attempt;
``tokens_per_minute`` counts each attempt's estimated prompt, then what the answer's usage
says beyond it. A provider whose window is full is skipped as if its bulkhead were full.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import random
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator

from llm_gateway import errors
from llm_gateway.errors import UpstreamFailure
from llm_gateway.exchange import Exchange
from llm_gateway.http_types import GatewayResponse
from llm_gateway.limits import LimiterUnavailable, RateLimiter
from llm_gateway.providers import UnsupportedParameter
from llm_gateway.routing.client import (
    UpstreamClient,
    UpstreamResponse,
    retry_after_seconds,
    stream_cut,
)
from llm_gateway.routing.health import Outcome, State
from llm_gateway.routing.router import Router
from llm_gateway.routing.table import ProviderConfig, Target
from llm_gateway.sse import FrameSplitter, FrameTooLarge
from llm_gateway.tokens import (
    CHARS_PER_TOKEN,
    OUTPUT_OVER_CAP,
    estimate_chars,
    stream_output_ceiling,
)

_STREAM_BROKE_OFF = "The upstream provider's stream broke off before it was complete."
_BUDGET_SPENT = ("The budget of this key (or its subject) is spent: the stream was stopped "
                 "where the budget ends.")
_JSON = ("content-type", "application/json")
_FAILURE_OUTCOMES = {"connect": Outcome.CONNECT, "timeout": Outcome.TIMEOUT,
                     "broken": Outcome.SERVER_ERROR}


class Relay:
    def __init__(
        self, client: UpstreamClient, router: Router, limiter: RateLimiter, *,
        response_limit_bytes: int, max_event_bytes: int, backoff_base: float = 0.5,
        sleep: Callable[[float], object] = asyncio.sleep,
    ) -> None:
        self.client = client
        self.router = router
        self.limiter = limiter
        self.response_limit_bytes = response_limit_bytes
        self.max_event_bytes = max_event_bytes
        self.backoff_base = backoff_base
        self._sleep = sleep

    async def respond(self, exchange: Exchange) -> GatewayResponse:
        """Send upstream and produce the client's response (streams stay streams)."""
        table = exchange.plan.table
        local = exchange.protocol.local_answer(exchange.request, table.models,
                                               exchange.key.allows_model,
                                               table.unknown_models == "passthrough")
        if isinstance(local, errors.Rejection):
            return _rejection_response(exchange, local)
        if local is not None:  # an answer of the gateway's own (only aliases exist)
            return GatewayResponse(200, [_JSON, *exchange.gateway_headers()], local)
        answer = await self._first_answer(exchange)
        if isinstance(answer, GatewayResponse):
            return answer
        response, leave = answer
        headers = exchange.on_response_start(response.status, response.headers)
        if response.status == 429:
            headers = _with_retry_after(headers, response)
        status = exchange.client_status(response.status)
        if exchange.is_sse:
            return GatewayResponse(status, headers, chunks=self._stream(exchange, response, leave))
        try:
            raw = await response.read(self.response_limit_bytes)
        except UpstreamFailure as failure:
            return failure_response(exchange, failure)
        finally:
            leave()
        body = exchange.complete_body(raw)
        exchange.response_bytes = len(body)
        await self._count_tokens_used(exchange)
        return GatewayResponse(status, headers, body)

    async def aclose(self) -> None:
        await self.client.aclose()

    # ---- attempts -------------------------------------------------------------------

    async def _first_answer(
        self, exchange: Exchange,
    ) -> tuple[UpstreamResponse, Callable[[], None]] | GatewayResponse:
        """The first answer worth giving the client, and how to give its bulkhead place
        back; or the gateway's own answer when none came."""
        failure: UpstreamFailure | None = None
        overloaded = False
        # A target that took the request and said nothing in time may still be working on
        # it: never sent the same request twice.
        timed_out: set[Target] = set()
        wait_left = exchange.plan.table.max_retry_wait_seconds
        waited = False
        for target, last_chance in self._candidates(exchange):
            if target in timed_out or self._found_down(exchange, target):
                continue
            provider = exchange.plan.provider(target)
            if not await self._admits(exchange, provider):
                overloaded = True
                continue
            leave = self._leaver(provider)
            outcome = await self._attempt(exchange, target, provider, last_chance,
                                          wait_left=wait_left, backoff=not waited)
            waited = False
            if isinstance(outcome, UpstreamResponse):
                return outcome, leave
            leave()
            if isinstance(outcome, UpstreamFailure):
                failure = outcome
                if outcome.kind == "timeout":
                    timed_out.add(target)
            elif outcome is not None:
                await self._sleep(outcome)  # a 429 from the only target: its wait, then again
                wait_left -= outcome
                waited = True
        if failure is not None:
            return failure_response(exchange, failure)
        model = exchange.model or exchange.endpoint.path
        if overloaded:
            return _rejection_response(exchange, errors.upstream_overloaded(model))
        return _rejection_response(exchange, errors.no_available_upstream(model))

    def _candidates(self, exchange: Exchange) -> Iterator[tuple[Target, bool]]:
        """Targets to try in order, each with whether it is the last attempt allowed.
        With fewer targets than attempts the order starts over: a lone target is retried,
        after a backoff."""
        targets = exchange.plan.targets
        attempts = exchange.plan.table.max_attempts
        for index in range(attempts):
            yield targets[index % len(targets)], index == attempts - 1

    def _found_down(self, exchange: Exchange, target: Target) -> bool:
        """DOWN since the plan was made (the plan left out what was DOWN then)."""
        return bool(exchange.attempts) and self.router.health.state(target.key) is State.DOWN

    async def _attempt(
        self, exchange: Exchange, target: Target, provider: ProviderConfig, last_chance: bool,
        *, wait_left: float, backoff: bool,
    ) -> UpstreamResponse | UpstreamFailure | float | None:
        """One try. Returns the response to relay, the failure, seconds to wait before
        trying again (a 429 to wait out), or None to move on at once."""
        if backoff and exchange.attempts and exchange.attempts >= len(exchange.plan.targets):
            await self._sleep(self._backoff(exchange.attempts - len(exchange.plan.targets)))
        exchange.begin_attempt(target)
        try:
            body = exchange.upstream_body()
        except UnsupportedParameter:
            return None  # admission checked the plan; a target of another profile may take it
        read_timeout = exchange.plan.route.read_timeout or (
            provider.timeouts.stream_idle if exchange.stream else provider.timeouts.read)
        try:
            response = await self.client.send(
                provider, exchange.request.method, exchange.upstream_url(),
                exchange.upstream_headers(), body, read_timeout=read_timeout,
            )
        except UpstreamFailure as failure:
            self.router.record(target, _FAILURE_OUTCOMES[failure.kind])
            failure.attempts = exchange.attempts
            return failure
        return await self._judge(exchange, target, response, last_chance, wait_left)

    async def _judge(self, exchange: Exchange, target: Target, response: UpstreamResponse,
               last_chance: bool, wait_left: float) -> UpstreamResponse | float | None:
        status = response.status
        if status == 429 or status == 408 or status >= 500:
            wait = retry_after_seconds(response.header_map())
            outcome = Outcome.RATE_LIMITED if status == 429 else Outcome.SERVER_ERROR
            self.router.record(target, outcome, wait)
            if last_chance:
                return response  # nothing left to try: the provider's own answer
            if status == 429 and len(exchange.plan.targets) == 1:
                # Nowhere else to go: a short wait is waited out, anything else is the
                # caller's to handle, with the provider's own 429 and Retry-After.
                if wait is None or wait > wait_left:
                    return response
                response.close()
                return wait
            response.close()
            return None
        if status >= 400:
            await self._count_callers_failure(exchange)
        else:
            self.router.record(target, Outcome.SUCCESS)
        return response

    async def _count_callers_failure(self, exchange: Exchange) -> None:
        """A 4xx the caller caused: no mark against the target, one against the key,
        counted before the answer goes (a caller's next request sees it: counted in the
        background, a shared limiter could see that request first)."""
        table = exchange.plan.table
        with contextlib.suppress(LimiterUnavailable):  # fail-closed: only the count lost
            await self.limiter.take(
                failed_requests_bucket(exchange.key.id), table.failed_requests_limit,
                table.failed_requests_window_seconds,
            )

    async def _admits(self, exchange: Exchange, provider: ProviderConfig) -> bool:
        """Room in the provider's bulkhead and its provider-wide windows (requests, then
        tokens: the token window is looked at first so that a full one uses up no
        request, and counted once the request goes)."""
        if not self.router.bulkhead.try_enter(provider.name, provider.max_concurrency):
            return False
        tokens = provider.tokens_per_minute
        if tokens and not (await self.limiter.take(tokens_bucket(provider.name), tokens, 60,
                                                   cost=0)).allowed:
            self.router.bulkhead.leave(provider.name)
            return False
        if provider.requests_per_minute:
            decision = await self.limiter.take(f"provider:{provider.name}",
                                               provider.requests_per_minute, 60)
            if not decision.allowed:
                self.router.bulkhead.leave(provider.name)
                return False
        if tokens:
            await self.limiter.take(tokens_bucket(provider.name), tokens, 60,
                                    cost=_estimated_tokens(exchange))
        return True

    async def _count_tokens_used(self, exchange: Exchange) -> None:
        """What the answer's usage says beyond the estimate counted when it was sent (a
        smaller use stays counted: the windows only count up). Before the request ends,
        so the next one finds the window as full as it is."""
        provider = exchange.provider
        if provider is None or not provider.tokens_per_minute:
            return
        facts = exchange.observe_body()
        if facts is None or facts.usage is None:
            return
        beyond = facts.usage.total_tokens - _estimated_tokens(exchange)
        if beyond > 0:
            with contextlib.suppress(LimiterUnavailable):  # fail-closed: only the count lost
                await self.limiter.take(tokens_bucket(provider.name),
                                        provider.tokens_per_minute, 60, cost=beyond)

    def _leaver(self, provider: ProviderConfig) -> Callable[[], None]:
        left = False

        def leave() -> None:
            nonlocal left
            if not left:
                left = True
                self.router.bulkhead.leave(provider.name)

        return leave

    def _backoff(self, retry: int) -> float:
        """Exponential, with jitter: spreads retries of many clients apart."""
        ceiling = min(8.0, self.backoff_base * 2**retry)
        return ceiling / 2 + random.uniform(0, ceiling / 2)

    # ---- streams ----------------------------------------------------------------------

    async def _stream(self, exchange: Exchange, response: UpstreamResponse,
                      leave: Callable[[], None]) -> AsyncIterator[bytes]:
        frames = FrameSplitter(self.max_event_bytes)
        # Characters of output past which the gateway ends the stream at its cap.
        ceiling = (stream_output_ceiling(exchange.output_cap) * CHARS_PER_TOKEN
                   if exchange.output_cap else sys.maxsize)
        try:
            async for chunk in response.chunks():
                if out := _relayed(exchange, frames.feed(chunk), ceiling):
                    exchange.response_bytes += len(out)
                    yield out
                if exchange.cut_at_cap:  # the upstream is closed (finally), its use counted
                    await self._count_tokens_used(exchange)
                    return
                if exchange.past_spend_ceiling():
                    exchange.fail(200, "insufficient_quota", _BUDGET_SPENT)
                    exchange.ending = True
                    yield exchange.stream_error("insufficient_quota", _BUDGET_SPENT)
                    return
            if (rest := frames.remainder()) and (out := exchange.on_frame(rest)) is not None:
                yield out
            if _cut_short(exchange):
                assert exchange.provider is not None
                raise stream_cut(exchange.provider.name)
            await self._count_tokens_used(exchange)
        except UpstreamFailure as failure:
            assert exchange.target is not None
            self.router.record(exchange.target, _FAILURE_OUTCOMES[failure.kind])
            exchange.fail(failure.status, failure.code, str(failure))
            exchange.ending = True
            yield exchange.stream_error(failure.code, _STREAM_BROKE_OFF)
        except FrameTooLarge as exc:
            exchange.fail(502, "upstream_response_too_large", str(exc))
            exchange.ending = True
            yield exchange.stream_error("upstream_response_too_large", str(exc))
        finally:
            response.close()
            leave()


def _relayed(exchange: Exchange, frames: list[bytes], ceiling: int) -> bytes:
    """What the client gets of these whole frames; once the output relayed passes
    ``ceiling`` characters, the gateway's end at the cap instead of the rest (unless the
    stream has ended already, or failed in band)."""
    facts = exchange.facts
    assert facts is not None  # a stream's observer
    kept = []
    for frame in frames:
        if (out := exchange.on_frame(frame)) is not None:
            kept.append(out)
        if facts.text_chars > ceiling and not facts.done and facts.error is None:
            kept.append(_end_at_cap(exchange))
            break
    return kept[0] if len(kept) == 1 else b"".join(kept)


def _end_at_cap(exchange: Exchange) -> bytes:
    """The stream's end at its output cap, the gateway's own, for an upstream that did not
    stop there: written in the target's protocol (``cap_end``) and fed through the exchange
    as the upstream's frames are, so that a translated stream ends in the caller's, and the
    record and the budget read the usage counted (never less than was relayed)."""
    facts = exchange.facts
    assert facts is not None and exchange.output_cap is not None
    output = max(estimate_chars(facts.text_chars),
                 facts.usage.completion_tokens if facts.usage is not None else 0)
    exchange.fail(200, OUTPUT_OVER_CAP,
                  f"The upstream provider sent more than the request's output cap "
                  f"({exchange.output_cap} tokens): the gateway ended the stream there.")
    exchange.ending = True
    choices = exchange.protocol.choices(exchange.payload) if exchange.payload else 1
    frames = exchange.crossing.wire.cap_end(facts, exchange.prompt_estimate, output, choices,
                                            time.time())
    return b"".join([out for frame in frames if (out := exchange.on_frame(frame)) is not None])


def _cut_short(exchange: Exchange) -> bool:
    """The upstream's body ended without its protocol's end, and without an in-band error
    the client already has (Anthropic's ``error`` event ends its stream)."""
    return not exchange.end_relayed and (exchange.facts is None or exchange.facts.error is None)


def failed_requests_bucket(key_id: str) -> str:
    return f"{key_id}!upstream-4xx"


def tokens_bucket(provider: str) -> str:
    return f"provider:{provider}!tokens"


def _estimated_tokens(exchange: Exchange) -> int:
    """The prompt's estimate: what a provider's token window counts as a request goes."""
    return max(1, exchange.prompt_estimate)


def _with_retry_after(headers: list[tuple[str, str]],
                      response: UpstreamResponse) -> list[tuple[str, str]]:
    """A relayed 429 says when to come back, also when the provider said so only in a
    header the gateway does not relay (``retry-after-ms``, ``x-ratelimit-reset-*``)."""
    if any(name == "retry-after" for name, _ in headers):
        return headers
    wait = retry_after_seconds(response.header_map())
    return headers if wait is None else [*headers, ("retry-after", str(max(1, math.ceil(wait))))]


def failure_response(exchange: Exchange, failure: UpstreamFailure) -> GatewayResponse:
    exchange.fail(failure.status, failure.code, str(failure))
    return GatewayResponse(failure.status, [_JSON, *exchange.gateway_headers()],
                           failure.body(exchange.protocol.error_shape_for(exchange.request)))


def _rejection_response(exchange: Exchange, rejection: errors.Rejection) -> GatewayResponse:
    exchange.fail(rejection.status, rejection.code, rejection.message())
    rejection = exchange.protocol.shaped(rejection, exchange.request)
    return GatewayResponse(rejection.status,
                           [*rejection.all_headers(), *exchange.gateway_headers()],
                           rejection.body)
