"""The sidecar's tunnels: connections to hosts that are no LLM host, passed through
untouched (``EGRESS_POLICY=allow``). Nothing in them is read, but none goes unseen: each is
counted by host as it opens (``llm_gateway_sidecar_tunnels_total{host}``) and logged when it
ends, with its host, port, bytes each way and duration.

The host is the CONNECT target, a string the app chose: it becomes a label or a log field
only as a valid host name (``known_hosts.hostname``), and labels stay bounded: the first
``MAX_HOST_LABELS`` hosts of a process have their own, every later one is ``other``.
"""

from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from mitmproxy.proxy import events, layer
from mitmproxy.proxy.layers import TCPLayer
from prometheus_client import CollectorRegistry, Counter

from llm_gateway.known_hosts import hostname

log = logging.getLogger("llm_gateway.sidecar")

MAX_HOST_LABELS = 100
OTHER = "other"
INVALID = "invalid"  # a CONNECT target that is no host name


class HostLabels:
    """Label values for hosts from a bounded set: the first ``limit`` valid host names,
    then ``other``; ``invalid`` for a string that is no host name."""

    def __init__(self, limit: int = MAX_HOST_LABELS) -> None:
        self._limit = limit
        self._named: set[str] = set()

    def label(self, host: str) -> str:
        name = hostname(host)
        if name is None:
            return INVALID
        if name in self._named:
            return name
        if len(self._named) < self._limit:
            self._named.add(name)
            return name
        return OTHER


@dataclass(slots=True)
class Tunnel:
    """One tunnel: where it goes (a valid host name, or ``invalid``) and what it carried."""

    host: str
    port: int
    opened: float  # time.monotonic()
    up: int = 0  # bytes from the app
    down: int = 0  # bytes to the app
    closed: bool = field(default=False)


class Tunnels:
    """The counter and the log lines of one gateway's tunnels."""

    _by_registry: weakref.WeakKeyDictionary[CollectorRegistry, Tunnels] = (
        weakref.WeakKeyDictionary())

    def __init__(self, registry: CollectorRegistry) -> None:
        self._opened = Counter(
            "llm_gateway_sidecar_tunnels_total",
            "Connections the sidecar tunnelled untouched to hosts that are no LLM host, by "
            "host (the first 100 hosts; later ones are 'other').",
            ["host"], registry=registry)
        self._labels = HostLabels()

    @classmethod
    def of(cls, registry: CollectorRegistry) -> Tunnels:
        """The one ``Tunnels`` of ``registry`` (a metric is registered once)."""
        found = cls._by_registry.get(registry)
        if found is None:
            found = cls._by_registry[registry] = cls(registry)
        return found

    def opened(self, host: str, port: int) -> Tunnel:
        self._opened.labels(self._labels.label(host)).inc()
        return Tunnel(hostname(host) or INVALID, port, time.monotonic())

    def closed(self, tunnel: Tunnel) -> None:
        if tunnel.closed:
            return
        tunnel.closed = True
        log.info("tunnel closed: host=%s port=%d bytes_up=%d bytes_down=%d duration_s=%.3f",
                 tunnel.host, tunnel.port, tunnel.up, tunnel.down,
                 time.monotonic() - tunnel.opened)


class CountedTunnelLayer(TCPLayer):
    """mitmproxy's pass-through TCP layer (no flow, no hooks: nothing kept), counting the
    bytes it relays each way into its ``Tunnel``."""

    def __init__(self, context: Any, tunnel: Tunnel) -> None:
        super().__init__(context, ignore=True)
        self.tunnel = tunnel

    def relay_messages(self, event: events.Event) -> layer.CommandGenerator[None]:
        if isinstance(event, events.DataReceived):
            if event.connection == self.context.client:
                self.tunnel.up += len(event.data)
            else:
                self.tunnel.down += len(event.data)
        yield from super().relay_messages(event)
