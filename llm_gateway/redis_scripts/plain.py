"""A redis-py client for plain commands (off the request path: shared health), for any
REDIS_URL form: redis-py's own Sentinel-managed client (it asks the sentinels for the
primary and again after a failover) or its Cluster client (slot routing, MOVED and ASK)."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import Sentinel

from llm_gateway.redis_urls import parse_redis_url


def plain_client(url: str, **options: Any) -> Redis | RedisCluster:
    """A client of the Redis ``url`` names; ``options``: redis-py's connection options
    (timeouts)."""
    target = parse_redis_url(url)
    if target.kind == "single":
        return Redis.from_url(url, **options)
    credentials = {"username": target.username, "password": target.password}
    if target.kind == "cluster":
        return RedisCluster(startup_nodes=[ClusterNode(host, port) for host, port in target.hosts],
                            **credentials, **options)
    # Sentinels are asked without credentials, as the script client asks them.
    sentinels = Sentinel(list(target.hosts), sentinel_kwargs={
        name: value for name, value in options.items() if name.startswith("socket_")})
    return sentinels.master_for(target.service, db=target.db, **credentials, **options)
