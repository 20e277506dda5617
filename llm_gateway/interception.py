"""What an adapter in front of provider hosts (the sidecar, regular mode) asks: which hosts
are LLM hosts, with their API roots (the configured ones and every provider's: routing
sends there, so apps may call them too); which paths of such a host may be forwarded; which
known LLM hosts no provider serves (``known_hosts``: refused, never tunnelled); and what
the egress policy answers for any other host.

A host is one of three kinds, decided in this order:

- **governed**: an LLM host (``llm_hosts``, ``VENICE_BASE_URL``'s, every provider's): its
  TLS is intercepted and each request goes through the engine;
- **known, not served**: a host of the known list that no provider serves: intercepted too,
  so that each request is answered ``provider_not_configured`` in the shape its clients
  read, under either egress policy;
- **other**: the egress policy's (tunnelled untouched, or ``egress_denied``).
"""

from __future__ import annotations

import json
import re

from llm_gateway import errors
from llm_gateway.config import EgressPolicy, Settings
from llm_gateway.errors import ErrorShape, Rejection, openai_error
from llm_gateway.known_hosts import KnownHost, KnownHosts, host_regex
from llm_gateway.protocols.messages import anthropic_error
from llm_gateway.routing.router import Router
from llm_gateway.translate.gemini_reply import error_object


def _google_error(status: int, type_: str, code: str, message: str) -> bytes:
    return json.dumps(error_object(status, message)).encode()


def _message_error(status: int, type_: str, code: str, message: str) -> bytes:
    """AWS's REST-JSON errors (the type in ``x-amzn-ErrorType``) and Cohere's."""
    return json.dumps({"message": message}).encode()


# Each known host's protocol (known_hosts.PROTOCOLS): the error shape its clients read,
# and the headers that go with it (botocore reads an error's type from its header).
_SHAPES: dict[str, tuple[ErrorShape, list[tuple[str, str]]]] = {
    "openai": (openai_error, []),
    "anthropic": (anthropic_error, []),
    "google": (_google_error, []),
    "bedrock": (_message_error, [("x-amzn-errortype", "AccessDeniedException")]),
    "cohere": (_message_error, []),
}


class Interception:
    def __init__(self, settings: Settings, router: Router) -> None:
        self._settings = settings
        self._router = router
        self._roots: tuple[object, dict[str, str]] = (None, {})
        self.known_hosts = KnownHosts.packaged().changed(settings.known_llm_hosts)

    @property
    def llm_host_roots(self) -> dict[str, str]:
        """The intercepted hosts and their API roots; they follow the route table."""
        table = self._router.table
        if self._roots[0] is not table:
            roots = self._settings.llm_host_roots()
            for host, root in self._router.provider_host_roots().items():
                roots.setdefault(host, root)
            self._roots = (table, roots)
        return self._roots[1]

    def api_root_for_host(self, host: str, port: int) -> str | None:
        """The API root path of an intercepted LLM host; None for any other host, which
        is a known host no provider serves (``unserved_known_host``) or the egress
        policy's."""
        name = host.lower().rstrip(".")
        root = self.llm_host_roots.get(f"{name}:{port}")
        return root if root is not None else self.llm_host_roots.get(name)

    def unserved_known_host(self, host: str, port: int) -> KnownHost | None:
        """The known-list entry of ``host`` when no provider serves it (None: governed, or
        not a known host)."""
        if self.api_root_for_host(host, port) is not None:
            return None
        return self.known_hosts.find(host)

    def intercepts(self, host: str, port: int) -> bool:
        """Whether TLS to ``host`` is intercepted: governed, or refused request by request."""
        return (self.api_root_for_host(host, port) is not None
                or self.known_hosts.find(host) is not None)

    @staticmethod
    def path_under_root(root: str, path: str) -> str | None:
        """``path`` relative to the API root ``root``, or None when it lies outside: such a
        path on an LLM host (a dashboard, billing) is never forwarded."""
        if root and not path.startswith(root + "/"):
            return None
        return path[len(root):]

    def egress_rejection(self, host: str, port: int) -> Rejection | None:
        """The answer for traffic to a host that is not an LLM host; None: pass it through
        untouched (no TLS interception, nothing observed)."""
        if self._settings.egress_policy is not EgressPolicy.DENY:
            return None
        return errors.egress_denied(host, port)

    def unserved_rejection(self, host: str, port: int) -> Rejection | None:
        """The answer for a request to a host no provider serves: ``provider_not_configured``
        in the known host's clients' shape, else the egress policy's (None: through)."""
        known = self.unserved_known_host(host, port)
        if known is None:
            return self.egress_rejection(host, port)
        return not_configured(known, host)

    def intercepted_host_patterns(self) -> list[str]:
        """Every intercepted host as a regular expression of "host:port" (mitmproxy's
        ``allow_hosts``): the LLM hosts, then the known hosts."""
        patterns = []
        for host in sorted(self.llm_host_roots):
            name, _, port = host.rpartition(":") if _has_port(host) else (host, "", "")
            patterns.append(f"^{re.escape(name)}:{port or r'\d+'}$")  # no port: any port
        for entry in self.known_hosts.entries:
            patterns.append(f"^{host_regex(entry.pattern)}:\\d+$")
        return list(dict.fromkeys(patterns))  # a governed host may be a known one too

    def described(self) -> str:
        """The intercepted hosts in words, for the start-up log line."""
        governed = ", ".join(f"{host} ({root or '/'})"
                             for host, root in sorted(self.llm_host_roots.items()))
        served = {host.rpartition(":")[0] if _has_port(host) else host
                  for host in self.llm_host_roots}
        refused = ", ".join(entry.pattern for entry in self.known_hosts.entries
                            if entry.pattern not in served)
        return (f"governed: {governed or 'none'}; refused (known LLM hosts no provider "
                f"serves): {refused or 'none'}")


def not_configured(known: KnownHost, host: str) -> Rejection:
    """``provider_not_configured`` for ``host`` (of ``known``), in its clients' shape."""
    shape, headers = _SHAPES[known.protocol]
    rejection = errors.provider_not_configured(host.lower().rstrip("."))
    rejection.shape = shape
    rejection.headers = [*rejection.headers, *headers]
    return rejection


def _has_port(host: str) -> bool:
    name, sep, port = host.rpartition(":")
    return bool(sep and name and port.isdigit())
