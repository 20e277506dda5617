"""What an adapter in front of provider hosts (the sidecar, regular mode) asks: which hosts
are LLM hosts, with their API roots (the configured ones and every provider's: routing
sends there, so apps may call them too); which paths of such a host may be forwarded; and
what the egress policy answers for any other host."""

from __future__ import annotations

from llm_gateway import errors
from llm_gateway.config import EgressPolicy, Settings
from llm_gateway.errors import Rejection
from llm_gateway.routing.router import Router


class Interception:
    def __init__(self, settings: Settings, router: Router) -> None:
        self._settings = settings
        self._router = router
        self._roots: tuple[object, dict[str, str]] = (None, {})

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
        the egress policy decides about."""
        name = host.lower().rstrip(".")
        root = self.llm_host_roots.get(f"{name}:{port}")
        return root if root is not None else self.llm_host_roots.get(name)

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
