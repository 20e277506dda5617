"""Who may read ``/metrics``: the one rule, for every listener that serves it (``serve``'s
public port, its admin port, the sidecar's probe and admin ports).

Its labels name keys (their prefix or name, ``METRICS_KEY_LABEL``) and JWT subjects: what an
attacker who reaches a pod IP would want first. So:

- with ``METRICS_TOKEN`` set, ``/metrics`` asks every caller for ``Authorization: Bearer
  <token>`` (401 ``invalid_api_key`` without it), wherever it listens;
- without one, metrics with key labels are answered on loopback connections only (a
  connection to 127.0.0.0/8 or ::1, or a Unix socket: only this host, or this pod, can
  open one) and refused elsewhere (403 ``endpoint_not_allowed``, saying what to set);
  with ``METRICS_KEY_LABEL=none`` they name no key, and are answered everywhere.

The connection's own local address decides, not the address a listener was told to bind:
``0.0.0.0`` takes loopback connections and pod-IP ones alike, and only the latter are
another machine's.
"""

from __future__ import annotations

import hmac
import ipaddress

from llm_gateway import errors
from llm_gateway.config import Settings
from llm_gateway.errors import Rejection

PATH = "/metrics"


def loopback(local: tuple[str, int | None] | None) -> bool:
    """Whether a connection whose local address is ``local`` (ASGI's ``server``: host and
    port, or a Unix socket's path and None) came from this host. Unknown: no."""
    if local is None:
        return False
    host, port = local[0], local[1]
    if port is None:
        return True  # a Unix socket
    try:
        address = ipaddress.ip_address(str(host).strip("[]").split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(address, "ipv4_mapped", None)
    return (mapped or address).is_loopback


def metrics_refusal(settings: Settings, local: tuple[str, int | None] | None,
                    authorization: str | None) -> Rejection | None:
    """None when this caller may read ``/metrics``; else the refusal (module docstring)."""
    token = settings.metrics_token
    if token:
        expected = f"Bearer {token.reveal()}".encode()
        given = (authorization or "").strip().encode("latin-1", "replace")
        if hmac.compare_digest(given, expected):
            return None
        rejection = errors.invalid_api_key(
            "GET /metrics needs 'Authorization: Bearer <METRICS_TOKEN>'.")
        rejection.headers = [*rejection.headers, ("www-authenticate", "Bearer")]
        return rejection
    if settings.metrics_key_label == "none" or loopback(local):
        return None
    return errors.reject(
        "endpoint_not_allowed",
        "GET /metrics names keys in its labels, so without METRICS_TOKEN it is answered on "
        "loopback connections only: set METRICS_TOKEN (and scrape with it as a bearer "
        "token), or METRICS_KEY_LABEL=none.")


def local_address(sockname: object) -> tuple[str, int | None] | None:
    """A transport's ``sockname`` as ASGI's ``server``: (host, port), (path, None) for a
    Unix socket, None when unknown."""
    if isinstance(sockname, str):
        return sockname, None
    if isinstance(sockname, tuple) and len(sockname) >= 2:
        return str(sockname[0]), int(sockname[1])
    return None
