"""Demo traffic for the local stack, so that the Grafana dashboard fills up.

compose.yaml runs it as the `traffic` service (profile `observe`) inside the gateway's image:
it creates three keys with `llm-gateway keys create --json` (same DATABASE_URL as the
gateway), then sends a mix of requests to GATEWAY_URL until TRAFFIC_SECONDS have passed or
TRAFFIC_REQUESTS were sent, whichever comes first:

- chat completions, plain and streamed, on two models, from two keys (the fake upstream's
  x-fake-chunks / x-fake-chunk-delay-ms headers vary the answers' length and pace);
- embeddings and the model list;
- refusals: a malformed key (401), a model the key may not use (403), and bursts from a
  key with a small rate limit (429).

TRAFFIC_RATE is the mean requests/s (default 4). Every TRAFFIC_REPORT_SECONDS, and when it
ends (SIGINT and SIGTERM included), it prints the count of answers by status; it touches
HEARTBEAT_FILE after every request (the compose health check reads its age). httpx is a
dependency of the gateway, so the image has everything this needs.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path

import httpx

MODELS = ("llama-3.3-70b", "qwen3-235b")
EMBEDDING_MODEL = "text-embedding-bge-m3"
PROMPTS = (
    "Summarise the plot of Hamlet in two sentences.",
    "Write a haiku about load balancers.",
    "What is the capital of Australia?",
    "Explain exponential backoff to a new engineer.",
)
# Pauses between streamed chunks, in ms; TRAFFIC_CHUNK_DELAYS_MS=0 for a quick run.
CHUNK_DELAYS_MS = [
    int(value) for value in os.environ.get("TRAFFIC_CHUNK_DELAYS_MS", "5,10,20,40,80").split(",")
]
# Deliberately malformed (its checksum is wrong): the gateway refuses it before any lookup.
INVALID_KEY = "llmg_" + "0" * 38


def create_key(name: str, *options: str) -> str:
    output = subprocess.run(
        ["llm-gateway", "keys", "create", "--name", name, "--json", *options],
        check=True, capture_output=True, text=True, timeout=60,
    ).stdout
    return str(json.loads(output.splitlines()[-1])["key"])


def chat(key: str, model: str, *, stream: bool) -> Callable[[httpx.Client], int]:
    def send(client: httpx.Client) -> int:
        body = {
            "model": model,
            "messages": [{"role": "user", "content": random.choice(PROMPTS)}],
            "stream": stream,
        }
        headers = {
            "authorization": f"Bearer {key}",
            # The fake upstream's knobs: answer length and pace, so latency varies.
            "x-fake-chunks": str(random.randint(3, 16)),
            "x-fake-chunk-delay-ms": str(random.choice(CHUNK_DELAYS_MS)),
        }
        if stream:
            body["stream_options"] = {"include_usage": True}
            with client.stream("POST", "/v1/chat/completions", json=body,
                               headers=headers) as response:
                for _ in response.iter_lines():
                    pass
                return response.status_code
        return client.post("/v1/chat/completions", json=body, headers=headers).status_code

    return send


def embeddings(key: str) -> Callable[[httpx.Client], int]:
    def send(client: httpx.Client) -> int:
        body = {"model": EMBEDDING_MODEL, "input": random.choice(PROMPTS)}
        return client.post("/v1/embeddings", json=body,
                           headers={"authorization": f"Bearer {key}"}).status_code

    return send


def list_models(key: str) -> Callable[[httpx.Client], int]:
    def send(client: httpx.Client) -> int:
        return client.get("/v1/models", headers={"authorization": f"Bearer {key}"}).status_code

    return send


def burst(key: str, size: int) -> Callable[[httpx.Client], list[int]]:
    """``size`` requests back to back from a key limited to fewer: some get 429."""
    send = chat(key, MODELS[0], stream=False)
    return lambda client: [send(client) for _ in range(size)]


def main() -> int:
    # `docker compose stop` sends SIGTERM: end like Ctrl-C, with the summary.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    base_url = os.environ.get("GATEWAY_URL", "http://serve:3000").rstrip("/")
    seconds = float(os.environ.get("TRAFFIC_SECONDS", "3600"))
    limit = int(os.environ.get("TRAFFIC_REQUESTS", "0")) or None
    rate = float(os.environ.get("TRAFFIC_RATE", "4"))
    report_every = float(os.environ.get("TRAFFIC_REPORT_SECONDS", "30"))
    heartbeat = Path(os.environ.get("HEARTBEAT_FILE", "/tmp/traffic-alive"))
    seed = os.environ.get("TRAFFIC_SEED")
    if seed:
        random.seed(seed)

    alpha = create_key("demo-alpha", "--subject", "team-alpha", "--rate-limit", "6000/60")
    beta = create_key("demo-beta", "--subject", "team-beta", "--rate-limit", "6000/60",
                      "--models", MODELS[0])
    runaway = create_key("demo-runaway", "--subject", "team-beta", "--rate-limit", "5/10")
    # (weight, action): mostly successes, a steady trickle of every kind of refusal.
    actions: list[tuple[int, Callable[[httpx.Client], int | list[int]]]] = [
        (30, chat(alpha, MODELS[0], stream=False)),
        (15, chat(alpha, MODELS[1], stream=True)),
        (15, chat(beta, MODELS[0], stream=True)),
        (8, chat(beta, MODELS[0], stream=False)),
        (6, embeddings(alpha)),
        (3, list_models(beta)),
        (3, chat(beta, MODELS[1], stream=False)),  # 403 model_not_allowed
        (3, chat(INVALID_KEY, MODELS[0], stream=False)),  # 401 invalid_api_key
        # 429 rate_limit_exceeded after the first five, even across a window boundary.
        (2, burst(runaway, 12)),
    ]
    weights = [weight for weight, _ in actions]
    statuses: Counter[int] = Counter()
    sent = 0
    started = time.monotonic()
    next_report = started + report_every
    print(f"demo traffic: {rate:g} requests/s to {base_url} for {seconds:g} s", flush=True)
    with httpx.Client(base_url=base_url, timeout=60) as client, suppress(KeyboardInterrupt):
        # Every kind once first, so that every panel has something to show right away.
        opening = [action for _, action in actions]
        while time.monotonic() - started < seconds and (limit is None or sent < limit):
            action = opening.pop(0) if opening else random.choices(actions, weights)[0][1]
            try:
                result = action(client)
            except httpx.HTTPError as error:
                print(f"demo traffic: {type(error).__name__}: {error}", flush=True)
                result = []
                time.sleep(1)
            answers = result if isinstance(result, list) else [result]
            statuses.update(answers)
            sent += len(answers)
            heartbeat.touch()
            if time.monotonic() >= next_report:
                print(f"demo traffic: {sent} sent, by status {dict(sorted(statuses.items()))}",
                      flush=True)
                next_report += report_every
            time.sleep(random.expovariate(rate) if rate > 0 else 0)
    print(f"demo traffic: done, {sent} sent, by status {dict(sorted(statuses.items()))}",
          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
