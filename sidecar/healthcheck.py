"""The image's HEALTHCHECK: probe /healthz of whichever role this container runs.

    python healthcheck.py ROLE=URL [ROLE=URL ...] [--pid PID]

One image runs every role (`serve`, `sidecar`, `injector`, `migrate`, ...), each listening
somewhere else, and a Dockerfile has a single HEALTHCHECK: so this reads the role from the
running `llm-gateway` command line (PID 1, or the lowest PID running `llm-gateway ROLE`
when an init process is PID 1; --pid names it for tests) and GETs that role's URL. The
URLs come from the HEALTHCHECK line and hold each role's default address; the address a
process was actually given wins: `serve` its BIND_ADDR (from its environment; a bind_addr
set only in a --config file is not seen), `sidecar` its --probe (else its --admin, unless
off), `injector` its --listen
(HTTPS only with --tls-cert). A role with no URL (migrate, keys: one-shot
commands) and a container running no `llm-gateway` at all have nothing to probe: healthy.

Exit status 0 healthy, 1 unhealthy, as Docker expects. Standard library only, and no
import of the application: a check must stay cheap and must not fail with the app's bugs.
"""

from __future__ import annotations

import http.client
import os
import ssl
import sys
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

# Options of `llm-gateway` itself that take a value, before the subcommand.
GLOBAL_OPTIONS_WITH_VALUE = {"--config"}
# Where each role is told its address: a flag of its command line, or (serve) a variable.
# Flags in the order they are tried (the sidecar's probe port, else its admin port).
ADDRESS_FLAG = {"sidecar": ("--probe", "--admin"), "injector": ("--listen",)}
ADDRESS_VARIABLE = {"serve": "BIND_ADDR"}
TIMEOUT_SECONDS = 2.0


def read_command_line(pid: int) -> list[str]:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def read_environment(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # another user's process: fall back to our own (the container's) env
        return dict(os.environ)
    pairs = (item.decode(errors="replace").partition("=") for item in raw.split(b"\0") if item)
    return {name: value for name, _, value in pairs}


def subcommand(argv: list[str]) -> tuple[str, list[str]] | None:
    """(role, its arguments) when ``argv`` runs `llm-gateway ROLE ...`, else None."""
    for index, argument in enumerate(argv):
        if os.path.basename(argument) == "llm-gateway":
            rest = argv[index + 1 :]
            position = 0
            while position < len(rest):
                current = rest[position]
                if current in GLOBAL_OPTIONS_WITH_VALUE:
                    position += 2
                elif current.startswith("-"):
                    position += 1
                else:
                    return current, rest[position + 1 :]
            return None
    return None


def find_gateway(pid: int | None) -> tuple[int, str, list[str]] | None:
    """The process to probe: ``pid``, else PID 1, else the lowest PID running a role."""
    if pid is not None:
        candidates = [pid]
    else:
        numbered = sorted(int(entry.name) for entry in Path("/proc").iterdir()
                          if entry.name.isdigit())
        candidates = [1, *(number for number in numbered if number != 1)]
    for candidate in candidates:
        found = subcommand(read_command_line(candidate))
        if found is not None:
            return candidate, *found
    return None


def flag_value(arguments: list[str], flag: str) -> str | None:
    for index, argument in enumerate(arguments):
        if argument == flag and index + 1 < len(arguments):
            return arguments[index + 1]
        if argument.startswith(flag + "="):
            return argument.partition("=")[2]
    return None


def probe_url(default_url: str, role: str, arguments: list[str], environment: dict[str, str]
              ) -> str:
    """``default_url`` moved to the address the process was given, if it was given one."""
    parts = urlsplit(default_url)
    scheme = parts.scheme
    if role == "injector":
        scheme = "https" if flag_value(arguments, "--tls-cert") else "http"
    address = None
    if role in ADDRESS_FLAG:
        given = (flag_value(arguments, flag) for flag in ADDRESS_FLAG[role])
        address = next((value for value in given if value and value != "off"), None)
    elif role in ADDRESS_VARIABLE:
        address = environment.get(ADDRESS_VARIABLE[role])
    host, port = parts.hostname or "127.0.0.1", parts.port
    if address:
        given_host, _, given_port = address.rpartition(":")
        given_host = given_host.strip("[]")
        # A wildcard bind answers on loopback; a specific address only on itself.
        if given_host not in ("", "0.0.0.0", "::"):
            host = given_host
        if given_port.isdigit():
            port = int(given_port)
    netloc = f"[{host}]" if ":" in host else host
    if port is not None:
        netloc += f":{port}"
    return urlunsplit((scheme, netloc, parts.path or "/healthz", parts.query, ""))


def healthy(url: str) -> bool:
    # The injector's certificate names its Service, not 127.0.0.1; this is loopback to
    # our own process, so its identity is not in question.
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=TIMEOUT_SECONDS, context=context) as response:
            return 200 <= response.status < 300
    except (OSError, ValueError, http.client.HTTPException) as error:
        print(f"{url}: {error}", file=sys.stderr)
        return False


def main(argv: list[str]) -> int:
    pid = None
    urls: dict[str, str] = {}
    arguments = iter(argv)
    for argument in arguments:
        if argument == "--pid":
            pid = int(next(arguments))
        elif "=" in argument:
            role, _, url = argument.partition("=")
            urls[role] = url
        else:
            print(f"usage: healthcheck.py ROLE=URL ... [--pid PID], not {argument!r}",
                  file=sys.stderr)
            return 1
    found = find_gateway(pid)
    if found is None and pid is not None:
        print(f"process {pid} does not run an llm-gateway role", file=sys.stderr)
        return 1
    if found is None:
        print("no llm-gateway process: nothing to probe")
        return 0
    process, role, role_arguments = found
    if role not in urls:
        print(f"llm-gateway {role} serves no health endpoint: nothing to probe")
        return 0
    url = probe_url(urls[role], role, role_arguments, read_environment(process))
    if not healthy(url):
        return 1
    print(f"llm-gateway {role}: {url} ok")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
