"""REDIS_URL's forms, read in one place: one server, a Sentinel-managed primary, a Cluster.

- ``redis://[user:pass@]host[:port][/db]``, ``rediss://…`` (TLS), ``unix:///path``: one
  server, as redis-py reads them.
- ``redis+sentinel://[user:pass@]host:port[,host:port…]/service_name[?db=N]``: the
  sentinels (port 26379 when left out) are asked where the primary of ``service_name``
  is; the credentials and ``db`` are the primary's (sentinels are asked without them).
- ``redis+cluster://[user:pass@]host:port[,host:port…]``: any nodes of a Redis Cluster
  (port 6379 when left out), from which the rest is learnt; a cluster has database 0 only.

Pure: text in, a ``RedisTarget`` or a ``ValueError`` out. An error quotes the URL with its
password masked: errors reach logs and the terminal.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import parse_qs, unquote, urlsplit

SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEME = "redis+cluster"
SINGLE_SCHEMES = ("redis", "rediss", "unix")
SCHEMES = (*SINGLE_SCHEMES, SENTINEL_SCHEME, CLUSTER_SCHEME)
_DEFAULT_PORTS = {SENTINEL_SCHEME: 26379, CLUSTER_SCHEME: 6379}

Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class RedisTarget:
    kind: Literal["single", "sentinel", "cluster"]
    url: str  # as given (a single server's is handed to redis-py as is)
    hosts: tuple[Address, ...] = ()  # the sentinels, or the cluster's seed nodes
    service: str = ""  # the Sentinel service (its primary's name)
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)


def masked(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``."""
    parts = urlsplit(url)
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if not at or ":" not in userinfo:
        return url
    user = userinfo.split(":", 1)[0]
    return parts._replace(netloc=f"{user}:***@{hosts}").geturl()


def parse_redis_url(url: str) -> RedisTarget:
    """The target ``url`` names; ValueError (password masked) when it names none."""
    parts = urlsplit(url)
    shown = masked(url)
    if parts.scheme not in SCHEMES:
        raise ValueError(f"expected a {', '.join(s + '://' for s in SCHEMES)} URL, got {shown!r}")
    if parts.scheme in SINGLE_SCHEMES:
        if not (parts.path if parts.scheme == "unix" else parts.netloc):
            raise ValueError(f"{shown!r} names no server")
        return RedisTarget("single", url)
    userinfo, _, host_list = parts.netloc.rpartition("@")
    username, _, password = userinfo.partition(":")
    hosts = tuple(_address(item, _DEFAULT_PORTS[parts.scheme], shown)
                  for item in host_list.split(","))
    options = _query(parts.query, shown, {"db"} if parts.scheme == SENTINEL_SCHEME else set())
    credentials = {"username": unquote(username) or None,
                   "password": unquote(password) if password else None}
    if parts.scheme == CLUSTER_SCHEME:
        if parts.path not in ("", "/", "/0"):
            raise ValueError(f"{shown!r}: a Redis Cluster has database 0 only; "
                             "give no path")
        return RedisTarget("cluster", url, hosts, **credentials)  # type: ignore[arg-type]
    service = unquote(parts.path.strip("/"))
    if not service or "/" in service:
        raise ValueError(f"{shown!r} names no Sentinel service: "
                         "redis+sentinel://host:port[,host:port...]/service_name")
    db = options.get("db", "0")
    if not db.isdigit() or int(db) > 1_000_000:
        raise ValueError(f"{shown!r}: db must be a database number, got {db!r}")
    return RedisTarget("sentinel", url, hosts, service, int(db), **credentials)  # type: ignore[arg-type]


def _address(item: str, default_port: int, shown: str) -> Address:
    text = item.strip()
    if text.startswith("["):  # [IPv6]:port
        host, _, rest = text[1:].partition("]")
        port_text = rest.removeprefix(":")
    else:
        host, _, port_text = text.rpartition(":") if ":" in text else (text, "", "")
    if not host:
        raise ValueError(f"{shown!r}: {item!r} is not host:port")
    if not port_text:
        return host, default_port
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{shown!r}: {port_text!r} is not a port")
    return host, int(port_text)


def _query(query: str, shown: str, allowed: set[str]) -> dict[str, str]:
    try:
        values = parse_qs(query, keep_blank_values=True, strict_parsing=bool(query))
    except ValueError:
        raise ValueError(f"{shown!r}: unreadable query string") from None
    unknown = sorted(set(values) - allowed)
    if unknown:
        takes = f"takes only {', '.join(sorted(allowed))}" if allowed else "takes no options"
        raise ValueError(f"{shown!r}: unknown option {unknown[0]!r} (this form {takes})")
    return {name: found[-1] for name, found in values.items()}
