"""CPU per relayed event through `serve` for each client protocol: chat completions, Anthropic
Messages and OpenAI Responses streams side by side (the protocols phase, ``bench.phases``).

Four `serve` processes, all pinned to the target CPU, with the same settings: two providers on
``bench.paced_upstream``, ``openai`` (profile openai: chat and Responses, the alias ``gpt``) and
``anthropic`` (profile anthropic: Messages, the alias ``claude``). One serves chat, one chat
again (the A/A leg: the harness's own noise, in the same units), one Messages, one Responses.
In each round the four legs hold ``streams`` paced streams each *at the same time*, on one
client loop (``bench.streams.hold_together``): the same number of content events per stream,
each with the same text ("This is chunk N of the fake reply."), at the same rate. Whatever
else the host does then falls on every leg alike; rounds in turn, a leg minutes later, were
not comparable on a shared machine (chat alone varied by 29 % from round to round). The
client counts each protocol's content events and end (``[DONE]``, ``message_stop``,
``response.completed``).

An *event* is one content event as the client counts it: a chat chunk with content, a
``content_block_delta``, a ``response.output_text.delta``. Framing events (chat's role and
finish chunks, ``[DONE]``; ``message_start``, ``content_block_start``, ``ping``,
``content_block_stop``, ``message_delta``, ``message_stop``; Responses' ``created``,
``in_progress``, the ``.added`` and ``.done`` events and ``response.completed``) are not
events here: what they cost is each stream's.

- **steady** (the goal's figure): the CPU of the leg's serve over a window in which every
  stream is open and past its opening events, none yet at its end, divided by the content
  events the client received in it. Only content events happen in that window, in every
  protocol: the per-event relay cost, like with like.
- **whole**: the CPU from the first connection to the last stream's end, over all content
  events: the framing events, each request's admission and each stream's end included.
- **per stream**: whole minus steady x content events, per stream: what a stream costs
  beyond its content events (admission, framing events, the end, the record).

A ratio to chat is the median over rounds of each round's ratio, with its range; the A/A
leg's ratio (chat again over chat) is the noise of such a ratio in this run.

The translation phase (``TRANSLATION_LEGS``) measures the same way what translating costs:
six serves, each caller protocol twice, on an alias whose target speaks it (untranslated) and
on one whose only target speaks another (``claude``: Messages only; ``gpt-chat``: a provider
that speaks chat only), so the gateway translates the request and the target's stream event
by event: chat -> Messages, Messages -> chat, Responses -> chat. The same caller, the same
content events per stream, the same text; each translated leg's ratio is to its untranslated
leg's (``UNTRANSLATED``), the same median of the rounds' ratios.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.streams import MARKERS, Leg, StreamShape, hold_together, protocol_payload
from bench.targets import Target

# (provider, profile, upstream model) per alias; the alias each protocol's requests name.
PROTOCOL_PROVIDERS = {"gpt": ("openai", "openai", "gpt-4o-mini"),
                      "claude": ("anthropic", "anthropic", "claude-sonnet-4-5"),
                      "gpt-chat": ("chat-only", "openai", "gpt-4o-mini")}
# A provider's protocols where not its profile's: one that speaks chat only (a Messages or
# Responses caller on ``gpt-chat`` is translated to chat).
PROVIDER_PROTOCOLS = {"chat-only": ["chat"]}
PROTOCOL_MODELS = {"chat": "gpt", "messages": "claude", "responses": "gpt"}
SETTLE_AND_MARGIN_S = 2.5  # what of a stream's life the window leaves out (opening, settle, end)
# Per leg, before the rounds: code paths, connection pools.
WARM_SHAPE = StreamShape(20, 0.5, 50, stepped=False)
UPSTREAM = ("bench.paced_upstream: the fake's event shapes (anthropic and openai modes), the "
            "same text per content event as a chat chunk")


def write_protocol_routes(path: Path, base_url: str) -> Path:
    """Two providers on ``base_url`` (the paced upstream), one alias each (JSON is YAML)."""
    document = {
        "providers": {provider: {"base_url": base_url, "profile": profile,
                                 "api_key_env": "VENICE_API_KEY",
                                 **({"protocols": PROVIDER_PROTOCOLS[provider]}
                                    if provider in PROVIDER_PROTOCOLS else {})}
                      for provider, profile, _ in PROTOCOL_PROVIDERS.values()},
        "default_provider": "openai",
        "models": {alias: {"targets": [{"provider": provider, "model": model}]}
                   for alias, (provider, _, model) in PROTOCOL_PROVIDERS.items()},
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
    return path


LEGS = {"chat": "chat", "chat-again": "chat", "messages": "messages",
        "responses": "responses"}  # leg: its protocol
BASELINE = "chat"
# The translation phase: leg -> (the caller's protocol, the alias it names). Each caller
# protocol untranslated (its alias's target speaks it), then translated (its alias's only
# target speaks another: Anthropic's Messages, or a chat-only provider).
TRANSLATION_LEGS = {
    "chat": ("chat", "gpt"),
    "chat->messages": ("chat", "claude"),
    "messages": ("messages", "claude"),
    "messages->chat": ("messages", "gpt-chat"),
    "responses": ("responses", "gpt"),
    "responses->chat": ("responses", "gpt-chat"),
}
UNTRANSLATED = {"chat->messages": "chat", "messages->chat": "messages",
                "responses->chat": "responses"}  # translated leg: the leg it is compared to


def leg_protocol(name: str) -> str:
    """The caller's protocol of a leg of either phase (a bare protocol: itself)."""
    if name in LEGS:
        return LEGS[name]
    return TRANSLATION_LEGS[name][0] if name in TRANSLATION_LEGS else name


def leg_model(name: str) -> str:
    """The alias a leg of either phase names."""
    if name in TRANSLATION_LEGS:
        return TRANSLATION_LEGS[name][1]
    return PROTOCOL_MODELS[leg_protocol(name)]


def protocol_leg(target: Target, protocol: str, shape: StreamShape, *,
                 measured: bool, model: str | None = None) -> Leg:
    """``protocol``'s streams to ``target``, naming ``model`` (default: the protocol's own
    alias of the protocols phase)."""
    host, port = target.endpoint.host, target.endpoint.port
    key = target.authorization.removeprefix("Bearer ")
    payload = protocol_payload(protocol, host, port, key, model or PROTOCOL_MODELS[protocol],
                               shape)
    pid = target.process.pid if measured and target.process is not None else None
    return Leg(host, port, payload, pid, MARKERS[protocol])


def leg_figures(held: Mapping[str, Any]) -> dict[str, Any]:
    """One protocol's figures of one round, from what ``hold_streams`` measured."""
    step = (held.get("steps") or [{}])[-1]
    events, spent = held.get("content_events") or 0, held.get("target_cpu_s")
    window_events, window_spent = step.get("content_events") or 0, step.get("target_cpu_s")
    ok = held.get("ok") or 0
    steady = 1e6 * window_spent / window_events if window_events and window_spent else None
    whole = 1e6 * spent / events if events and spent else None
    figures: dict[str, Any] = {
        "ok": ok, "errors": held.get("errors"), "problems": held.get("problems"),
        "content_events": events, "window_events": window_events,
        "window_s": step.get("window_s"),
        "frames_per_stream": round(held["frames"] / ok, 1) if ok and held.get("frames")
        else None,
        "steady_us_per_event": _round(steady),
        "whole_us_per_event": _round(whole),
        "whole_us_per_frame": _round(1e6 * spent / held["frames"])
        if spent and held.get("frames") else None,
        "per_stream_us": _round(1e6 * (spent - steady * 1e-6 * events) / ok)
        if spent and steady is not None and ok else None,
        "target_cpu_share": step.get("target_cpu_share"),
        "client_cpu_share": step.get("client_cpu_share"),
        "upstream_cpu_share": step.get("upstream_cpu_share"),
        "gap_p99_ms": (step.get("gaps") or {}).get("p99_ms"),
    }
    return figures


def _round(value: float | None, digits: int = 2) -> float | None:
    return None if value is None else round(value, digits)


def measure_protocols(targets: Mapping[str, Target], shape: StreamShape, rounds: int,
                      upstream_pid: int | None, say: Callable[[str], None],
                      baselines: Mapping[str, str] | None = None,
                      ratio_to: str = "chat") -> dict[str, Any]:
    """Warm every leg, then ``rounds`` rounds of every leg at once; the figures. ``targets``:
    a serve per leg of LEGS (or of TRANSLATION_LEGS, with ``baselines`` UNTRANSLATED)."""
    names = list(targets)

    def leg(name: str, leg_shape: StreamShape, measured: bool) -> Leg:
        return protocol_leg(targets[name], leg_protocol(name), leg_shape, measured=measured,
                            model=leg_model(name))

    warm = hold_together([leg(name, WARM_SHAPE, False) for name in names], WARM_SHAPE)
    for name, held in zip(names, warm, strict=True):
        if held["errors"]:
            raise RuntimeError(f"{name} streams through {targets[name].name} failed while "
                               f"warming: {held['problems']} {held['error_bodies']}")
    window_s = max(0.5, shape.seconds - SETTLE_AND_MARGIN_S)
    per_round: list[dict[str, dict[str, Any]]] = []
    for turn in range(rounds):
        # Who opens first turns round by round (the legs' openings interleave anyway).
        order = names[turn % len(names):] + names[:turn % len(names)]
        held_all = hold_together([leg(name, shape, True) for name in order], shape,
                                 upstream_pid, window_s)
        legs = {name: leg_figures(held) for name, held in zip(order, held_all, strict=True)}
        per_round.append({name: legs[name] for name in names})
        some = legs[names[0]]
        say(f"  round {turn + 1}: " + ", ".join(
            f"{name} {legs[name]['steady_us_per_event']}/{legs[name]['whole_us_per_event']}"
            + (f" ({legs[name]['errors']} failed)" if legs[name]["errors"] else "")
            for name in names)
            + f" us per event steady/whole; CPU shares client {some['client_cpu_share']}, "
            f"upstream {some['upstream_cpu_share']}")
    return summarize(per_round, names, baselines, ratio_to)


def _median(values: Sequence[float | None]) -> float | None:
    known = [value for value in values if value is not None]
    return statistics.median(known) if known else None


def _ratios(per_round: Sequence[Mapping[str, Mapping[str, Any]]], name: str,
            figure: str, baseline: str = BASELINE) -> list[float]:
    """Leg ``name``'s ``figure`` over the baseline's, round by round."""
    ratios = []
    for legs in per_round:
        ours, chat = legs[name].get(figure), legs[baseline].get(figure)
        if ours and chat:
            ratios.append(ours / chat)
    return ratios


def summarize(per_round: Sequence[Mapping[str, Mapping[str, Any]]],
              names: Sequence[str], baselines: Mapping[str, str] | None = None,
              ratio_to: str = "chat") -> dict[str, Any]:
    """Per leg: the medians over rounds, and the median of its per-round ratios to its
    baseline's (``baselines``: leg -> the leg it is compared to; default every leg to chat),
    with their range, as ``steady_ratio_to_<ratio_to>``; the spread of chat's own steady
    figure over the rounds."""
    if baselines is None:
        baselines = ({name: BASELINE for name in names if name != BASELINE}
                     if BASELINE in names else {})
    summaries: dict[str, dict[str, Any]] = {}
    for name in names:
        legs = [legs[name] for legs in per_round]
        summary: dict[str, Any] = {
            "protocol": leg_protocol(name),
            "errors": sum(leg.get("errors") or 0 for leg in legs),
            "frames_per_stream": _median([leg.get("frames_per_stream") for leg in legs]),
        }
        for figure in ("steady_us_per_event", "whole_us_per_event", "whole_us_per_frame",
                       "per_stream_us", "target_cpu_share"):
            summary[figure] = _round(_median([leg.get(figure) for leg in legs]),
                                     3 if figure.endswith("share") else 2)
        if (baseline := baselines.get(name)) is not None and baseline in names:
            if ratio_to != "chat":
                summary["baseline"] = baseline
            for kind in ("steady", "whole"):
                ratios = _ratios(per_round, name, f"{kind}_us_per_event", baseline)
                summary[f"{kind}_ratio_to_{ratio_to}"] = _round(_median(ratios), 3)
                summary[f"{kind}_ratio_range"] = (
                    [round(min(ratios), 3), round(max(ratios), 3)] if ratios else None)
        summaries[name] = summary
    first = per_round[0][names[0]] if per_round else {}
    chat = [value for legs in per_round if (value := (legs.get(BASELINE) or {}).get(
        "steady_us_per_event"))]
    return {
        "legs": summaries,
        "rounds": [dict(legs) for legs in per_round],
        # The host's drift: chat's own steady figure, (max - min) / median over the rounds.
        "chat_spread": (round((max(chat) - min(chat)) / statistics.median(chat), 3)
                        if len(chat) > 1 else None),
        "client_cpu_share": first.get("client_cpu_share"),
        "upstream_cpu_share": first.get("upstream_cpu_share"),
    }
