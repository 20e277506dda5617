"""``llm-gateway sidecar``: mitmproxy, embedded, with the gateway addon; one per pod.

    llm-gateway sidecar [--listen 127.0.0.1:8080] [--admin 127.0.0.1:9090|off]
                        [--probe HOST:PORT] [--mode regular|reverse] [--ca-dir DIR]
                        [--ca-bundle-out FILE]

* ``regular`` (default): an explicit proxy for ``HTTPS_PROXY=http://127.0.0.1:8080``. TLS to
  the LLM hosts is intercepted with the sidecar's CA; every other host is tunnelled
  untouched (or refused, with ``EGRESS_POLICY=deny``).
* ``reverse``: plain HTTP on the listen address, for apps that set
  ``OPENAI_BASE_URL=http://127.0.0.1:8080/v1`` rather than trust a CA. Nothing is
  intercepted, so no mitmproxy runs: the listen address is served by ``serve``'s own HTTP
  server (uvicorn on uvloop, its connection limits), at ``serve``'s cost per request, about
  a third of mitmproxy's.

The addon object is added to this process's own mitmproxy master: there is no ``-s``
script, whose hot reload would leave a proxy running without the addon when the file
breaks. The admin address (never the proxy port; loopback unless told otherwise) serves the
admin API, the console and the probes; the probe address (``--probe``, for the kubelet and
Prometheus on a pod's IP) serves ``/healthz``, ``/readyz`` and ``/metrics`` only, the last
as ``telemetry.metrics_access`` says (a token, or loopback connections).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import shutil
import signal
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import uvicorn

from llm_gateway.adapters.server import server_config
from llm_gateway.config import HostPort, Settings, host_port_argument, parse_host_port
from llm_gateway.engine import Gateway, Readiness
from llm_gateway.stores import StoreUnavailable
from llm_gateway.wiring import build_gateway

if TYPE_CHECKING:
    from mitmproxy.master import Master

    from llm_gateway.adapters.mitm_addon import GatewayAddon

log = logging.getLogger("llm_gateway.sidecar")

MODES = ("regular", "reverse")


@dataclass(frozen=True, slots=True)
class SidecarArguments:
    listen: HostPort
    admin: HostPort | None  # None: off
    mode: str
    ca_dir: Path | None
    ca_bundle_out: Path | None
    probe: HostPort | None = None


def _admin_argument(text: str) -> HostPort | None:
    if text.strip().lower() == "off":
        return None
    try:
        return parse_host_port(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{exc}, or off") from None


def parse_arguments(argv: Sequence[str]) -> SidecarArguments:
    parser = argparse.ArgumentParser(
        prog="llm-gateway sidecar",
        description="mitmproxy with the gateway addon: apps set HTTPS_PROXY, nothing else.",
    )
    parser.add_argument("--listen", type=host_port_argument, default=HostPort("127.0.0.1", 8080),
                        metavar="HOST:PORT", help="the proxy (default 127.0.0.1:8080)")
    parser.add_argument("--admin", type=_admin_argument, default=HostPort("127.0.0.1", 9090),
                        metavar="HOST:PORT|off",
                        help="the admin API, the console and the probes (default "
                             "127.0.0.1:9090: loopback); off: none")
    parser.add_argument("--probe", type=host_port_argument, metavar="HOST:PORT",
                        help="/healthz, /readyz and /metrics only, e.g. 0.0.0.0:9090 for a "
                             "pod's probes (default: none)")
    parser.add_argument("--mode", choices=MODES, default="regular",
                        help="regular: HTTPS_PROXY; reverse: a plain-HTTP base URL")
    parser.add_argument("--ca-dir", type=Path, metavar="DIR",
                        help="the CA (tls.crt + tls.key, or mitmproxy-ca.pem); created when "
                             "missing; may be read-only")
    parser.add_argument("--ca-bundle-out", type=Path, metavar="FILE",
                        help="write the system roots plus the gateway CA here, for apps")
    args = parser.parse_args(list(argv))
    if args.listen == args.admin:
        parser.error("--admin must not be the proxy's address")
    if args.probe is not None and args.probe.port in {args.listen.port, *(
            [args.admin.port] if args.admin else [])}:
        parser.error("--probe must have a port of its own (not the proxy's or the admin's)")
    return SidecarArguments(args.listen, args.admin, args.mode, args.ca_dir, args.ca_bundle_out,
                            args.probe)


class AdminListener:
    """The sidecar's admin port: the admin app (``/admin/v1``, the console, ``/healthz``,
    ``/readyz``, ``/metrics``) on uvicorn, in the sidecar's own event loop; with
    ``probes_only``, the probe port (the probes alone)."""

    def __init__(self, sidecar: Sidecar, *, probes_only: bool = False) -> None:
        self._sidecar = sidecar
        self._probes_only = probes_only
        self._server: uvicorn.Server | None = None
        self._task: asyncio.Task[None] | None = None

    async def start(self, host: str, port: int) -> tuple[str, int]:
        from llm_gateway.admin.app import create_admin_app

        app = create_admin_app(self._sidecar.gateway, readiness=self._sidecar.readiness,
                               probes_only=self._probes_only)
        config = server_config(app, HostPort(host, port), self._sidecar.gateway.settings)
        self._server = uvicorn.Server(config)
        self._server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self._task = asyncio.get_running_loop().create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise OSError(f"the admin port {host}:{port} did not start")
            await asyncio.sleep(0.01)
        address = self._server.servers[0].sockets[0].getsockname()
        return address[0], address[1]

    async def close(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(self._task, 5)


class Sidecar:
    """Regular mode: a mitmproxy master with the addons a sidecar needs (and no others)
    and the gateway addon; reverse mode: the gateway's own HTTP server. With the admin
    server, all on one event loop."""

    def __init__(
        self,
        gateway: Gateway,
        *,
        mode: str = "regular",
        listen: tuple[str, int] = ("127.0.0.1", 8080),
        admin: tuple[str, int] | None = ("127.0.0.1", 9090),
        confdir: Path,
        ca_bundle: Path | None = None,
        probe: tuple[str, int] | None = None,
    ) -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, not {mode!r}")
        self.gateway = gateway
        self.addon: GatewayAddon | None = None  # regular mode's, once it runs
        self.mode = mode
        self.listen = listen
        self.admin = admin
        self.probe = probe
        self.confdir = confdir
        self.ca_bundle = ca_bundle
        self.proxy_address: tuple[str, int] | None = None
        self.admin_address: tuple[str, int] | None = None
        self.probe_address: tuple[str, int] | None = None
        self.started = asyncio.Event()
        self._master: Master | None = None
        self._reverse_server: uvicorn.Server | None = None
        self._admin_server = AdminListener(self)
        self._probe_server = AdminListener(self, probes_only=True)

    async def run(self) -> None:
        """Serve until ``shutdown()``. Exits (SystemExit) if the proxy cannot start."""
        if self.mode == "reverse":
            await self._run_reverse()
            return
        # mitmproxy is imported here only: a reverse-mode sidecar never loads it.
        from llm_gateway.adapters.mitm_addon import GatewayAddon
        from llm_gateway.adapters.sidecar_proxy import intercepting_master, wait_until_started

        self.addon = GatewayAddon(self.gateway)
        # The engine first: no request meets an engine still starting (the addon's own
        # ``running`` hook, there for mitmdump, finds it started), and a store that is down
        # stops the sidecar before mitmproxy has hooked itself into logging.
        try:
            await self.addon.start()
        except BaseException:
            await self.gateway.close()
            raise
        master, proxy_server, startup_check = intercepting_master(
            self.gateway, self.addon, self.listen, self.confdir)
        self._master = master
        await self._start_listeners()
        try:
            runner = asyncio.get_running_loop().create_task(master.run())
            self.proxy_address = await wait_until_started(proxy_server, startup_check, runner)
            self.started.set()
            log.info("llm-gateway sidecar (%s mode): proxy %s, admin %s, probe %s",
                     self.mode, self.proxy_address, self.admin_address, self.probe_address)
            log.info("intercepted hosts: %s", self.gateway.interception.described())
            await runner
        finally:
            await self._close_listeners()
            # Client connections still open now are cancelled when the loop ends; on some
            # Python versions the stream callback then logs each cancellation as an error.
            asyncio.get_running_loop().set_exception_handler(_ignore_cancellations)

    async def _run_reverse(self) -> None:
        """The listen address served as ``serve`` serves its own (the middleware, its
        connection limits); the engine started first, as in regular mode, so a store
        that is down or a spool that cannot be written stops the sidecar in one line."""
        from llm_gateway.adapters.asgi import create_app

        try:
            await self.gateway.start()
        except BaseException:
            await self.gateway.close()
            raise
        settings = self.gateway.settings
        app = create_app(settings, gateway=self.gateway)
        server = uvicorn.Server(server_config(app, HostPort(*self.listen), settings))
        server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
        self._reverse_server = server
        runner = asyncio.get_running_loop().create_task(server.serve())
        try:
            while not server.started:
                if runner.done():
                    runner.result()  # raises what stopped it
                    raise SystemExit(f"the proxy port {HostPort(*self.listen)} did not open")
                await asyncio.sleep(0.01)
            address = server.servers[0].sockets[0].getsockname()
            self.proxy_address = (address[0], address[1])
            await self._start_listeners()
            self.started.set()
            log.info("llm-gateway sidecar (reverse mode): proxy %s, admin %s, probe %s",
                     self.proxy_address, self.admin_address, self.probe_address)
            await runner
        finally:
            server.should_exit = True
            await self._close_listeners()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.wait_for(runner, 10)
            await self.gateway.close()

    async def _start_listeners(self) -> None:
        if self.admin is not None:
            self.admin_address = await self._admin_server.start(*self.admin)
        if self.probe is not None:
            self.probe_address = await self._probe_server.start(*self.probe)

    async def _close_listeners(self) -> None:
        await self._admin_server.close()
        await self._probe_server.close()

    def shutdown(self) -> None:
        """Stop serving; safe to call from any thread."""
        if self._master is not None:
            self._master.shutdown()
        if self._reverse_server is not None:
            self._reverse_server.should_exit = True  # read by its loop at its next tick

    async def readiness(self) -> Readiness:
        """The engine's readiness, unless the sidecar itself is not ready yet."""
        problem = await self.not_ready_because()
        if problem is None or problem == "The key store is not reachable.":
            return await self.gateway.readiness()
        return Readiness("unavailable", {"sidecar": {"state": "unavailable", "error": problem}})

    async def not_ready_because(self) -> str | None:
        """None when the sidecar can serve; otherwise what it is waiting for."""
        if not self.started.is_set():
            return "The proxy is not listening yet."
        if self.ca_bundle is not None and not self.ca_bundle.is_file():
            return "The CA bundle has not been written yet."
        if not await self.gateway.ready():
            return "The key store is not reachable."
        return None


def sidecar_main(argv: list[str], settings: Settings) -> int:
    """Entry point of ``llm-gateway sidecar``; ConfigError goes to the CLI (exit 2)."""
    arguments = parse_arguments(argv)
    settings.require_provider_key()
    # Connection-level lines (client connect, server connect...) for every request cost
    # CPU and say nothing usage records do not; mitmproxy's warnings and errors remain.
    logging.getLogger("mitmproxy").setLevel(logging.WARNING)
    # mitmproxy reads its CA from a directory it may write to; the CA directory may be a
    # read-only Secret, so mitmproxy gets a private copy that goes with the process.
    runtime_dir = Path(tempfile.mkdtemp(prefix="llm-gateway-sidecar-"))
    try:
        # Reverse mode intercepts nothing: the CA is read (or made) only for a bundle
        # asked for (a pod's manifests may ask in either mode).
        if arguments.mode == "regular" or arguments.ca_bundle_out is not None:
            from llm_gateway.adapters.ca import (
                install_for_mitmproxy,
                load_or_create_ca,
                write_ca_bundle,
            )

            ca = load_or_create_ca(arguments.ca_dir)
            log.info("CA: %s (SHA-256 %s)", ca.source, ca.fingerprint)
            if arguments.mode == "regular":
                install_for_mitmproxy(ca, runtime_dir)
            if arguments.ca_bundle_out is not None:
                write_ca_bundle(ca, arguments.ca_bundle_out)
                log.info("CA bundle written to %s", arguments.ca_bundle_out)
        asyncio.run(_serve(arguments, settings, runtime_dir),
                    loop_factory=_loop_factory(arguments.mode))
    except StoreUnavailable as exc:
        # Nothing to serve without keys: exit, and let the pod restart us.
        log.error("cannot start: the key store is unreachable (%s)", exc)
        return 1
    finally:
        shutil.rmtree(runtime_dir, ignore_errors=True)
    return 0


async def _serve(arguments: SidecarArguments, settings: Settings, runtime_dir: Path) -> None:
    # Built on mitmproxy's loop: the engine's store executor, writer task and locks
    # belong to the loop that runs the hooks.
    sidecar = Sidecar(
        build_gateway(settings), mode=arguments.mode, listen=arguments.listen,
        admin=arguments.admin, confdir=runtime_dir, ca_bundle=arguments.ca_bundle_out,
        probe=arguments.probe,
    )
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, sidecar.shutdown)
    # SIGHUP: read the route file (and the admin overlay) again now, and keep serving.
    loop.add_signal_handler(signal.SIGHUP, _reload_routes, sidecar.gateway)
    await sidecar.run()


def _loop_factory(mode: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The reverse mode's loop chosen by the rule ``serve``'s is (uvicorn's: uvloop when
    installed); mitmproxy's own choice (asyncio's loop) for regular mode."""
    if mode != "reverse":
        return None
    return uvicorn.Config(app=None).get_loop_factory()  # type: ignore[arg-type]


def _reload_routes(gateway: Gateway) -> None:
    log.info("SIGHUP: reading the routes again")
    gateway.reload_routes()


def _ignore_cancellations(loop: asyncio.AbstractEventLoop, context: dict[str, object]) -> None:
    if not isinstance(context.get("exception"), asyncio.CancelledError):
        loop.default_exception_handler(context)

