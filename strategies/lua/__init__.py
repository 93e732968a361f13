"""The Redis client of the Redis strategies and their Lua scripts (strategies/lua/*.lua).

One place decides where packet state lives: the django-redis connection ("default" cache) or,
when REDPACK_REDIS_CLUSTER_URL is set, a Redis Cluster. Each script is registered once per
client and runs with EVALSHA; redis-py's Script loads it again when a server answers NOSCRIPT
(after a restart, a SCRIPT FLUSH, or on a cluster node that has not seen it yet).

The grab script runs on a connection of the calling thread's own (`run_pinned`), not one
checked out of the pool per call: redis-py's checkout asks the kernel twice per command (is
this the process that made the pool, is the socket clean) and, with its bookkeeping, cost a
lone grab about 30 µs of client CPU, a quarter of it. A pinned connection is
dropped on any error (a reply may still be on its way) and after a fork.
"""

import os
import re
import threading
import time
from functools import cache
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver
from django_redis import get_redis_connection
from redis import Redis
from redis.cluster import RedisCluster
from redis.commands.core import Script
from redis.connection import AbstractConnection
from redis.exceptions import ConnectionError, NoScriptError, ResponseError, TimeoutError

SCRIPTS = Path(__file__).resolve().parent


@cache
def redis_client() -> Redis | RedisCluster:
    if settings.REDPACK_REDIS_CLUSTER_URL:
        # The same timeouts and retry policy as the single Redis (settings.CACHES).
        return RedisCluster.from_url(
            settings.REDPACK_REDIS_CLUSTER_URL,
            socket_connect_timeout=settings.REDIS_CONNECT_TIMEOUT,
            socket_timeout=settings.REDIS_SOCKET_TIMEOUT,
            retry=settings.REDIS_RETRY,
        )
    return get_redis_connection("default")


WRITE_PROBE_KEY = "rp:probe:writable"


def takes_writes(client: Any) -> None:
    """One write that expires at once: raises when Redis does not answer, or answers but takes
    no write now (a replica after a failover: READONLY or MASTERDOWN; full: OOM; MISCONF;
    NOREPLICAS), where a PING is answered by them all."""
    client.set(WRITE_PROBE_KEY, b"1", px=1000)


def run_pinned(name: str, keys: list[str], args: list[Any]) -> Any:
    """Run script `name` on this thread's own connection to Redis (RedisCluster: through the
    client, as `script(name)(...)`). For scripts that settle a lost reply by running again (the
    grab script, keys.run_grabs): a pinned connection Redis closed while it was idle fails its
    next call as a lost reply does, and the re-run goes out on a new one."""
    return run_script_pinned(script(name), keys, args)


def run_script_pinned(ran: Script, keys: list[str], args: list[Any]) -> Any:
    """`run_pinned` for any registered script, on its own client's Redis (the web requests'
    counters and checks run on the default one, redpack/ratelimit.py)."""
    pinned = _pinned(ran.registered_client)
    if pinned is None:
        return ran(keys=keys, args=args)
    try:
        try:
            pinned.send_command("EVALSHA", ran.sha, len(keys), *keys, *args)
            return pinned.read_response()
        except NoScriptError:  # as Script.__call__ does on the client
            ran.sha = str(ran.registered_client.script_load(ran.script))
            pinned.send_command("EVALSHA", ran.sha, len(keys), *keys, *args)
            return pinned.read_response()
    except ResponseError:
        raise  # Redis answered (an error reply): the connection is in step
    except BaseException:
        pinned.disconnect()  # a reply may still come: this socket is never read again
        raise


class _Pinned(threading.local):
    connection: AbstractConnection | None = None
    pool = 0  # id() of the connection pool it was made like
    generation = -1
    used_at = 0.0


_pinned_here = _Pinned()
_generation = 0  # pinned connections of an older generation are dropped
IDLE_CHECK_SECONDS = 1.0  # a pinned connection idle this long is checked before it is used


def _forget_pinned() -> None:
    global _generation
    _generation += 1


os.register_at_fork(after_in_child=_forget_pinned)  # a child never uses its parent's sockets


def _pinned(client: Any) -> AbstractConnection | None:
    """This thread's own connection to `client`'s Redis, made like its pool's (same address,
    timeouts, retry policy) but outside it; None for a Redis Cluster. One per thread: the
    strategies' client and the default one are the same client unless the strategies' state
    lives on a cluster, and then only the default one pins a connection.

    After IDLE_CHECK_SECONDS without use it is checked as the pool checks every connection it
    hands out (closed by Redis, or holding unread data: made again), so that an idle timeout or
    a restart of Redis between bursts costs no re-run; a busy one is not asked."""
    if isinstance(client, RedisCluster):
        return None
    here = _pinned_here
    now = time.monotonic()
    pool = client.connection_pool
    if here.connection is None or here.generation != _generation or here.pool != id(pool):
        if here.connection is not None:
            here.connection.disconnect()
        here.connection = pool.connection_class(**pool.connection_kwargs)
        here.generation = _generation
        here.pool = id(pool)
    elif now - here.used_at > IDLE_CHECK_SECONDS:
        try:
            stale = here.connection.can_read()  # connects first if it is not
        except (ConnectionError, TimeoutError, OSError):
            stale = True
        if stale:
            here.connection.disconnect()
    here.used_at = now
    return here.connection


INCLUDE = re.compile(r"^-- include: ([a-z_]+\.lua)$", re.M)


@cache
def source(name: str) -> str:
    """The text of strategies/lua/<name>.lua, each `-- include: <file>` line replaced by that
    file (a rule several scripts share, such as checks.lua, is written once)."""
    text = (SCRIPTS / f"{name}.lua").read_text()
    return INCLUDE.sub(lambda found: (SCRIPTS / found.group(1)).read_text(), text)


@cache
def script(name: str) -> Script:
    """The script strategies/lua/<name>.lua (`source`), registered on the current client."""
    client = redis_client()
    # RedisCluster has register_script too; redis-py's annotations only name Redis.
    return client.register_script(source(name))  # type: ignore[misc]


@cache
def gate_script(name: str) -> Script:
    """The script strategies/lua/<name>.lua (`source`), registered on the default Redis
    (django-redis), where the web requests' checks live (bans, throttle windows), whatever holds
    the packets' state."""
    return get_redis_connection("default").register_script(source(name))


@receiver(setting_changed)
def _forget_client(*, setting: str, **kwargs: Any) -> None:
    if setting in {"REDPACK_REDIS_CLUSTER_URL", "CACHES"}:
        redis_client.cache_clear()
        script.cache_clear()
        gate_script.cache_clear()
        _forget_pinned()
