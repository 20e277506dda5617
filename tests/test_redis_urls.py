"""REDIS_URL's forms read in one place (llm_gateway.redis_urls), and the Cluster client's
pure parts: a call's slot, the slot map, redirections. No server needed."""

from __future__ import annotations

import pytest
from redis.exceptions import ResponseError

from llm_gateway.config import ConfigError, load_settings
from llm_gateway.redis_scripts.cluster import parse_slots, redirection, slot_of
from llm_gateway.redis_urls import masked, parse_redis_url


def test_the_three_forms() -> None:
    single = parse_redis_url("redis://:pw@127.0.0.1:6379/2")
    assert single.kind == "single"
    sentinel = parse_redis_url("redis+sentinel://u:p%40ss@h1:26380,[::1],h3:1/svc?db=3")
    assert (sentinel.kind, sentinel.hosts, sentinel.service, sentinel.db) == (
        "sentinel", (("h1", 26380), ("::1", 26379), ("h3", 1)), "svc", 3)
    assert (sentinel.username, sentinel.password) == ("u", "p@ss")
    assert "p@ss" not in repr(sentinel)
    cluster = parse_redis_url("redis+cluster://:pw@a:7000,b")
    assert (cluster.kind, cluster.hosts, cluster.password) == (
        "cluster", (("a", 7000), ("b", 6379)), "pw")


@pytest.mark.parametrize(("url", "says"), [
    ("redis+sentinel://:secret@h1:26379", "names no Sentinel service"),
    ("redis+sentinel://:secret@h1/svc?db=x", "db must be a database number"),
    ("redis+sentinel://:secret@h1/svc?timeout=1", "unknown option 'timeout'"),
    ("redis+cluster://:secret@a:7000/2", "database 0 only"),
    ("redis+cluster://:secret@a:70000", "is not a port"),
    ("redis+cluster://:secret@,a:1", "is not host:port"),
    ("memcached://:secret@a", "expected a redis://"),
])
def test_a_bad_url_is_refused_with_its_password_masked(url: str, says: str) -> None:
    with pytest.raises(ConfigError) as refused:
        load_settings({"REDIS_URL": url})
    assert says in str(refused.value) and "secret" not in str(refused.value)
    assert ":***@" in str(refused.value)


def test_masked() -> None:
    assert masked("redis+sentinel://u:pw@h/s") == "redis+sentinel://u:***@h/s"
    assert masked("redis://h:1/0") == "redis://h:1/0"


def test_settings_take_every_form_and_a_multi_host_postgres_url() -> None:
    for url in ("redis+sentinel://h1:26379,h2:26379/svc", "redis+cluster://h:7000,h:7001"):
        assert load_settings({"REDIS_URL": url}).redis_url == url
    database = ("postgresql:///postgres?host=10.0.0.1,10.0.0.2&port=5432,5433"
                "&target_session_attrs=read-write")
    assert load_settings({"DATABASE_URL": database}).database_url == database


def test_one_call_one_slot() -> None:
    assert slot_of([]) is None
    assert slot_of(["llmg:rl:{k1}:10/60", "llmg:rl:{k1}!upstream-4xx:5/60"]) == slot_of(["k1"])
    with pytest.raises(ValueError, match="one hash tag"):
        slot_of(["{a}x", "{b}x"])


def test_the_slot_map_and_redirections() -> None:
    owners = parse_slots([[0, 9, [b"10.0.0.1", 7000, b"id"], [b"10.0.0.4", 7003, b"id"]],
                          [10, 16383, [b"", 7001, b"id"]]], ("10.0.0.9", 7009))
    assert owners[0] == owners[9] == ("10.0.0.1", 7000)
    assert owners[10] == owners[16383] == ("10.0.0.9", 7001)  # an empty host: the asked one's
    assert redirection(ResponseError("MOVED 3999 10.0.0.2:7002")) == ("MOVED", ("10.0.0.2", 7002))
    assert redirection(ResponseError("ASK 3999 10.0.0.2:7002")) == ("ASK", ("10.0.0.2", 7002))
    assert redirection(ResponseError("ERR other")) is None and redirection(b"OK") is None
