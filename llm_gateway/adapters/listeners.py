"""The gateway's listening sockets, bound before any server starts (so a taken address
fails start-up at once, and connections wait in the backlog while workers boot).

Several workers (``serve --workers N``) serve one public address. Where the platform has
``SO_REUSEPORT`` (Linux) each worker slot gets a listening socket of its own on that
address and the kernel spreads new connections across them by a hash of the connection's
addresses and ports. One shared socket instead lets the first worker awake accept every
waiting connection: a small client pool opened at once landed on one worker (64 of 64).
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Sequence
from dataclasses import dataclass, field

from llm_gateway.config import HostPort

log = logging.getLogger("llm_gateway")

BACKLOG = 2048  # uvicorn's default


def _family(bind: HostPort) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in bind.host else socket.AF_INET


def _bind(bind: HostPort, *, reuse_port: bool = False, listen: bool = True) -> socket.socket:
    """A socket bound to ``bind``, listening unless told not to; OSError when the address
    is taken."""
    sock = socket.socket(_family(bind), socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if reuse_port:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind((bind.host, bind.port))
        if listen:
            # Listening from now on: connections wait in the backlog while workers start.
            sock.listen(BACKLOG)
    except OSError:
        sock.close()
        raise
    return sock


def bind_side(bind: HostPort) -> socket.socket | None:
    """A side listener's socket, or None (logged) when the address is taken: the public
    API must not go down because the admin port is."""
    try:
        sock = _bind(bind)
    except OSError as exc:
        log.error("listener %s not started: %s (choose another address, or `off`)",
                  bind, exc.strerror)
        return None
    log.info("listening on http://%s", bind)
    return sock


def reuse_port_available() -> bool:
    return hasattr(socket, "SO_REUSEPORT")


def bind_public(public: HostPort, *, reuse_port: bool = False) -> socket.socket:
    """The public listener (OSError when its address is taken). ``reuse_port``: the first
    socket of a group more will join (``bind_another``)."""
    if reuse_port and public.port != 0:
        # A socket with SO_REUSEPORT shares its port with any other such socket of the
        # same user: a second gateway started on this address would join the group and
        # take a share of the connections. A probe without the option fails as a plain
        # bind does when anything listens here, so a taken address still stops start-up.
        _bind(public, listen=False).close()
    sock = _bind(public, reuse_port=reuse_port)
    log.info("listening on http://%s", public)
    return sock


def bind_another(first: socket.socket) -> socket.socket:
    """One more SO_REUSEPORT listener on ``first``'s address (the port it got, when it was
    bound to port 0); OSError when the kernel refuses."""
    host, port = first.getsockname()[:2]
    return _bind(HostPort(host, port), reuse_port=True)


def bind_listeners(public: HostPort, side: Sequence[HostPort] = (), *,
                   reuse_port: bool = False) -> Listeners:
    """The public listener (OSError when its address is taken) and each side listener
    whose address is free, bound before anything else starts."""
    sock = bind_public(public, reuse_port=reuse_port)
    return Listeners(sock, {bind: side_sock for bind in side
                            if (side_sock := bind_side(bind)) is not None})


@dataclass(frozen=True, slots=True)
class Listeners:
    """Sockets bound before the servers start (by the supervisor, for its workers)."""

    public: socket.socket
    side: dict[HostPort, socket.socket] = field(default_factory=dict)

    def close(self) -> None:
        for sock in (self.public, *self.side.values()):
            sock.close()
