"""The regular-mode sidecar's proxy: mitmproxy's master with the addons a sidecar needs
(and no others), the connection guard and the gateway addon.

Imported by ``Sidecar`` in regular mode only: mitmproxy is a large import (about 45 MiB of
a process), and a reverse-mode sidecar serves without it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from mitmproxy import options as mitm_options
from mitmproxy.addons import (
    block,
    core,
    disable_h2c,
    errorcheck,
    next_layer,
    proxyserver,
    tlsconfig,
)
from mitmproxy.master import Master

from llm_gateway.adapters.mitm_addon import GatewayAddon
from llm_gateway.adapters.mitm_guard import ConnectionGuard
from llm_gateway.engine import Gateway


class StartupErrorCheck(errorcheck.ErrorCheck):
    """mitmproxy's start-up check (an error it logs while starting, a failed bind say, exits
    the process), narrowed to mitmproxy's own records, and telling when start-up is over.

    The stock check listens on the root logger until the ``running`` hooks are done, and the
    proxy port is open by then: an error the gateway logs for an early request (a key store
    that raised, answered 500) would otherwise exit the whole sidecar.
    """

    name = "errorcheck"  # the name the master looks the check up by

    def __init__(self) -> None:
        super().__init__(repeat_errors_on_stderr=True)
        self.logger.addFilter(lambda record: record.name.startswith("mitmproxy"))
        self.over = asyncio.Event()

    def finish(self) -> None:
        super().finish()
        self.over.set()


def intercepting_master(
    gateway: Gateway, addon: GatewayAddon, listen: tuple[str, int], confdir: Path,
) -> tuple[Master, proxyserver.Proxyserver, StartupErrorCheck]:
    """The master, its proxy server and its start-up check, configured, not yet running."""
    master = Master(mitm_options.Options(), event_loop=asyncio.get_running_loop())
    proxy_server = proxyserver.Proxyserver()
    startup_check = StartupErrorCheck()
    master.addons.add(
        core.Core(),
        block.Block(),  # refuses clients from public addresses: never an open proxy
        disable_h2c.DisableH2C(),
        proxy_server,
        next_layer.NextLayer(),
        # Reviews NextLayer's choices: connection deadlines, header size, and a
        # tunnel decided by its CONNECT target, never by the SNI alone.
        ConnectionGuard(gateway),
        tlsconfig.TlsConfig(),
        startup_check,
        addon,
    )
    master.options.update(
        mode=["regular"],
        listen_host=listen[0],
        listen_port=listen[1],
        confdir=str(confdir),
        # Also enforced by the addon; set here so no other value is ever live.
        connection_strategy="lazy",
        upstream_cert=False,
        http3=False,
    )
    return master, proxy_server, startup_check


async def wait_until_started(
    proxy_server: proxyserver.Proxyserver, startup_check: StartupErrorCheck,
    runner: asyncio.Task[None],
) -> tuple[str, int] | None:
    """The proxy's address once it listens and start-up is over (None if it stopped)."""
    while not (proxy_server.is_running and startup_check.over.is_set()):
        if runner.done():
            runner.result()  # raises what stopped it
            return None
        await asyncio.sleep(0.01)
    addresses = proxy_server.listen_addrs()
    return (addresses[0][0], addresses[0][1]) if addresses else None
